"""Issue 30 (items 2, 5, 6) and issue 23's Slurm bullet on the real Slurm cluster (``scripts/slurm-up``): what
``python`` a replica runs when the launcher's venv is not activated, a role without a resource, and a cancel
(``tsm cancel``, Ctrl-C of an attached run) that reports the terminal state."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tsm.runner.api import get_runner
from tsm.schedulers.slurm import SlurmScheduler, create_scheduler
from tsm.specs.api import AppDef, AppState, Resource, Role

from .conftest import SlurmCluster

pytestmark = [pytest.mark.integration, pytest.mark.slurm]
VENV_BIN = os.path.dirname(sys.executable)
TSM = os.path.join(VENV_BIN, "tsm")  # venv/bin/tsm, not activated: issue 30 case (c)


@pytest.fixture(autouse=True)
def cluster(slurm_cluster: SlurmCluster, monkeypatch: pytest.MonkeyPatch) -> SlurmCluster:
    """The cluster, with the launcher's venv NOT on PATH and not activated: issue 30's case (c)."""
    monkeypatch.setenv("PATH", os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if p != VENV_BIN))
    monkeypatch.delenv("VIRTUAL_ENV", raising=False)
    return slurm_cluster


@pytest.fixture
def sched() -> SlurmScheduler:
    return create_scheduler("it")


def _stdout(sched: SlurmScheduler, app_id: str, role: str) -> str:
    return "".join(sched.log_iter(app_id, role, 0))


def test_case_c_python_in_a_replica_is_the_launchers_venv(sched: SlurmScheduler) -> None:
    app = AppDef("py", [Role("py", entrypoint="python", resource=Resource(cpu=1, memMB=200),
                             args=["-c", "import sys; print(sys.executable)"])])
    app_id = sched.submit(app)
    d = sched.wait(app_id, timeout=120)
    assert d is not None and d.state == AppState.SUCCEEDED, d
    assert _stdout(sched, app_id, "py").strip() == sys.executable


def test_role_without_resource_runs_with_the_partitions_defaults(sched: SlurmScheduler) -> None:
    with get_runner("it") as runner:
        handle = runner.run(AppDef("plain", [Role("hello", entrypoint="echo", args=["hi"])]), "slurm")
        d = runner.wait(handle, timeout=120)
    assert d is not None and d.state == AppState.SUCCEEDED
    assert _stdout(sched, handle.rsplit("/", 1)[1], "hello") == "hi\n"


def test_cancel_returns_the_terminal_state(sched: SlurmScheduler) -> None:
    app = AppDef("sleeper", [Role("w", entrypoint="sleep", args=["300"], resource=Resource(cpu=1, memMB=200))])
    with get_runner("it") as runner:
        handle = runner.run(app, "slurm")
        deadline = time.monotonic() + 60
        while (s := runner.status(handle)) is not None and s.state != AppState.RUNNING:
            assert time.monotonic() < deadline, "never RUNNING"
            time.sleep(0.5)
        runner.cancel(handle)
        status = runner.status(handle)  # what `tsm cancel` prints next
    assert status is not None and status.state == AppState.CANCELLED


def test_tsm_cancel_prints_cancelled(tmp_path: Path) -> None:
    """``tsm cancel`` prints the state after the cancel: CANCELLED, not RUNNING (the job is still COMPLETING
    right after scancel)."""
    run = subprocess.run([TSM, "run", "-s", "slurm", "--detach", "utils.sh", "sleep 300"],
                         capture_output=True, text=True, cwd=tmp_path, timeout=120)
    handle = next(w for w in (run.stdout + run.stderr).split() if w.startswith("slurm://"))
    sched = create_scheduler("it")
    deadline = time.monotonic() + 60
    while (d := sched.describe(handle.rsplit("/", 1)[1])) is None or d.state != AppState.RUNNING:
        assert time.monotonic() < deadline, "never RUNNING"
        time.sleep(0.5)
    out = subprocess.run([TSM, "cancel", handle], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0 and out.stdout.strip() == f"{handle}: CANCELLED", out


def test_ctrl_c_of_an_attached_run_prints_the_terminal_state(tmp_path: Path) -> None:
    """Ctrl-C of ``tsm run`` (attached) cancels the job and prints CANCELLED, not RUNNING / COMPLETING."""
    import signal

    (tmp_path / "sleeper.py").write_text("import time\ntime.sleep(300)\n")
    # Ctrl-C as a terminal gives it: SIGINT at its default, whatever this process inherited (a job started in
    # the background of a non-interactive shell, such as a CI runner's, starts with SIGINT ignored)
    p = subprocess.Popen([TSM, "run", "-s", "slurm", "utils.python", "--script", "sleeper.py"], cwd=tmp_path,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # noqa: PLW1509
    assert p.stdout is not None
    launched = p.stdout.readline()  # "tsm: launched slurm://..."
    handle = next(w for w in launched.split() if w.startswith("slurm://"))
    sched = create_scheduler("it")
    deadline = time.monotonic() + 60
    while (d := sched.describe(handle.rsplit("/", 1)[1])) is None or d.state != AppState.RUNNING:
        assert time.monotonic() < deadline, "never RUNNING"
        time.sleep(0.5)
    p.send_signal(signal.SIGINT)
    out, _ = p.communicate(timeout=180)
    assert p.returncode == 130, out
    assert "State: CANCELLED" in out and "State: RUNNING" not in out and "COMPLETING" not in out, out
