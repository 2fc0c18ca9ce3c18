"""``--after`` on the real cluster of ``scripts/slurm-up``: Slurm's own ``--dependency``, through the runner.

An app after a Slurm app of the same cluster is submitted at once, held by Slurm (PENDING, reason
``Dependency``, ``afterok:<job>`` in ``scontrol show job``) until its dependency ends; one that can no longer be
met is ended CANCELLED by Slurm (``--kill-on-invalid-dep=yes``). The dependencies are held by a go file the
test writes, so the test never sleeps.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from testutil import wait_until
from tsm.errors import NotSupportedError
from tsm.runner.api import Runner, get_runner
from tsm.specs.api import AppDef, AppState, Resource, Role

from .conftest import SlurmCluster

pytestmark = [pytest.mark.integration, pytest.mark.slurm]

HANG = 240.0  # seconds: a guard against a hang, never a performance claim
SESSION = "slurmafter"
SMALL = Resource(cpu=1, memMB=200)
#: waits for the go file argv[1], then exits with argv[2]
GATE = "import os, sys, time\nwhile not os.path.exists(sys.argv[1]):\n    time.sleep(0.05)\nsys.exit(int(sys.argv[2]))"


@pytest.fixture(autouse=True)
def cluster(slurm_cluster: SlurmCluster, monkeypatch: pytest.MonkeyPatch) -> SlurmCluster:
    """The cluster, with this venv's python first on PATH: jobs carry the submitter's PATH."""
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    return slurm_cluster


@pytest.fixture
def runner() -> Iterator[Runner]:
    with get_runner(SESSION) as r:
        handles: list[str] = []
        r.test_handles = handles  # type: ignore[attr-defined]
        yield r
        for h in handles:  # a failed test's apps do not outlive it
            st = r.status(h)
            if st is not None and not st.state.is_terminal:
                r.cancel(h)


def _gate(runner: Runner, go: Path, code: int) -> str:
    role = Role("g", entrypoint="python", args=["-c", GATE, str(go), str(code)], resource=SMALL)
    handle = runner.run(AppDef("gate", [role]), "slurm")
    runner.test_handles.append(handle)  # type: ignore[attr-defined]
    return handle


def _echo(runner: Runner, text: str, after: list[str]) -> str:
    role = Role("e", entrypoint="echo", args=[text], resource=SMALL)
    handle = runner.run(AppDef("after", [role]), "slurm", after=after)
    runner.test_handles.append(handle)  # type: ignore[attr-defined]
    return handle


def _job(handle: str) -> str:
    return subprocess.run(["scontrol", "show", "job", handle.rsplit("/", 1)[1]], capture_output=True, text=True,
                          timeout=60).stdout


def test_an_app_after_a_slurm_job_is_held_by_slurm_until_it_succeeds(runner: Runner, tmp_path: Path) -> None:
    go = tmp_path / "go"
    a = _gate(runner, go, 0)
    dry = runner.dryrun(AppDef("after", [Role("e", entrypoint="echo", args=["x"], resource=SMALL)]), "slurm",
                        after=[a])
    job_a = a.rsplit("/", 1)[1]
    assert f"# sbatch --dependency=afterok:{job_a} --kill-on-invalid-dep=yes" in str(dry) and dry.after == []
    from tsm.compat.torchx.runner.api import get_runner as torchx_runner

    with torchx_runner() as face:  # TorchX's runner (NeMo-Run's door) takes the same dependencies
        via_face = face.dryrun(AppDef("after", [Role("e", entrypoint="echo", args=["x"], resource=SMALL)]),
                               "slurm", after=[a])
    assert f"--dependency=afterok:{job_a}" in str(via_face) and via_face.after == []
    b = _echo(runner, "B ran", [a])
    record = _job(b)
    assert f"Dependency=afterok:{job_a}(unfulfilled)" in record and "Reason=Dependency" in record, record
    st = runner.status(b)
    assert st is not None and st.state == AppState.PENDING and "Dependency" in st.msg, st
    go.touch()
    final = runner.wait(b, timeout=HANG)
    assert final is not None and final.state == AppState.SUCCEEDED, final
    assert runner.status(a).state == AppState.SUCCEEDED  # type: ignore[union-attr]
    assert list(runner.log_lines(b, "e", 0)) == ["B ran\n"]


def test_a_failed_dependency_cancels_an_afterok_app_and_starts_an_afternotok_one(
    runner: Runner, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    a = _gate(runner, go, 3)
    ok = _echo(runner, "never", [a])
    fail = _echo(runner, "after the failure", [f"{a}:fail"])
    wait_until(lambda: "Reason=Dependency" in _job(fail), "Slurm to hold the afternotok job", HANG)
    go.touch()
    done = runner.wait(fail, timeout=HANG)
    assert done is not None and done.state == AppState.SUCCEEDED, done
    cancelled = runner.wait(ok, timeout=HANG)
    assert cancelled is not None and cancelled.state == AppState.CANCELLED, cancelled
    assert "DependencyNeverSatisfied" in _job(ok)
    assert list(runner.log_lines(fail, "e", 0)) == ["after the failure\n"]


def test_a_slurm_app_after_an_app_of_another_scheduler_is_refused_at_dry_run(runner: Runner) -> None:
    from tsm.components.utils import sh

    a = runner.run(sh("exec sleep 600"), "local")  # runs until cancelled
    try:
        with pytest.raises(NotSupportedError, match="cannot wait for .*same cluster"):
            runner.dryrun(AppDef("after", [Role("e", entrypoint="echo", args=["x"], resource=SMALL)]), "slurm",
                          after=[a])
    finally:
        runner.cancel(a)
