"""Issue 30 (items 2, 5, 6) and issue 23 (Slurm) on Slurm: a role without a resource, what ``python`` means
in a replica, and a cancel that returns once the job has ended."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from slurm_util import FakeSlurm, directives, dryrun, squeue_with
from test_slurm_script import fake_cluster, run_locally  # noqa: F401 (fixture)

from tsm.runner.api import get_runner
from tsm.schedulers.common.interpreter import replica_python
from tsm.schedulers.slurm import SlurmQueries, SlurmScheduler, cli as slurm_cli
from tsm.specs.api import AppDef, AppState, Resource, Role

# -- a role without a resource (issue 23's Slurm bullet, issue 30 item 6) -----------------------------------


def test_role_without_resource_is_accepted_with_no_size_directives() -> None:
    app = AppDef("plain", [Role("hello", entrypoint="echo", args=["hi"])])  # resource not given
    with get_runner("t") as runner:
        info = runner.dryrun(app, "slurm", cfg={"slurm_version": "22.05"})
    script = info.request.script
    sbatch = "\n".join(directives(script))
    for size in ("--cpus-per-task", "--mem", "--gpus"):
        assert size not in sbatch
    srun = next(line for line in script.splitlines() if line.startswith("srun "))
    assert "--cpus-per-task" not in srun
    assert "no resource given: the partition's default CPUs and memory per task apply" in script


def test_a_sized_role_keeps_its_directives(sched: SlurmScheduler) -> None:
    req = dryrun(sched, AppDef("s", [Role("r", entrypoint="echo", resource=Resource(cpu=3, gpu=0, memMB=100))]))
    assert "#SBATCH --cpus-per-task=3" in req.script and "#SBATCH --mem=100M" in req.script
    assert "no resource given" not in req.script


# -- what `python` means in a replica (issue 30 item 2) ----------------------------------------------------


def _venv(root: Path) -> Path:
    (root / "bin").mkdir(parents=True)
    py = root / "bin" / "python"
    py.symlink_to(sys.executable)
    return py


def test_dry_run_names_the_interpreter_and_python_option_overrides_it(sched: SlurmScheduler, tmp_path: Path) -> None:
    other = _venv(tmp_path / "other")
    app = AppDef("p", [Role("r", entrypoint="python", args=["train.py"], resource=Resource(cpu=1, gpu=0, memMB=10))])
    script = dryrun(sched, app).script
    assert f"# python: {replica_python().describe()}" in script
    script = dryrun(sched, app, {"python": str(other)}).script
    assert f"# python: {other} (run option python)" in script
    assert f"TSM_PYTHON_BIN={other.parent}" in script


def test_case_c_nodes_run_the_launching_venv_not_the_system_python(
    sched: SlurmScheduler, fake_cluster: dict[str, str], tmp_path: Path  # noqa: F811
) -> None:
    """``venv/bin/tsm`` not activated: the job's PATH has no venv, yet ``python`` in a replica is the venv's."""
    venv = _venv(tmp_path / "venv")
    env = dict(fake_cluster)
    venv_dir = os.path.dirname(sys.executable)
    env["PATH"] = ":".join(p for p in env["PATH"].split(":") if p != venv_dir)
    env.pop("VIRTUAL_ENV", None)
    app = AppDef("c", [Role("r", entrypoint="python", args=["-c", "import sys; print(sys.executable)"])])
    # the launcher is venv/bin/python: what sys.executable is for `venv/bin/tsm`
    import tsm.schedulers.common.interpreter as interp

    orig = interp.replica_python

    def as_venv(role_env: Any = None, option: Any = None, environ: Any = None, executable: Any = None) -> Any:
        return orig(role_env, option, environ={k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"},
                    executable=str(venv))

    import tsm.schedulers.slurm.script as script_mod

    mp = pytest.MonkeyPatch()
    mp.setattr(script_mod, "replica_python", as_venv)
    try:
        job_dir, _ = run_locally(sched, app, env, tmp_path)
    finally:
        mp.undo()
    assert (job_dir / "r" / "0.stdout").read_text().strip() == str(venv)


# -- cancel returns once the job has ended (issue 30 item 5) -----------------------------------------------


def _squeue(app_id: str, state: str) -> str:
    """Only job ``app_id``, in ``state`` (a copy of a real record)."""
    return squeue_with(app_id, State=state, Reason="None").splitlines(keepends=True)[-1]


def test_cancel_waits_for_the_terminal_state(monkeypatch: pytest.MonkeyPatch) -> None:
    states = iter(["RUNNING", "COMPLETING", "COMPLETING", "CANCELLED"])
    fake = FakeSlurm()

    def squeue(args: list[str]) -> subprocess.CompletedProcess[str]:
        if "squeue" in args:
            fake.calls.append(args)
            return subprocess.CompletedProcess(args, 0, _squeue("77", next(states, "CANCELLED")), "")
        return fake(args)

    monkeypatch.setattr(slurm_cli, "run", lambda args, **kw: subprocess.CompletedProcess(args, 0, "", ""))
    s = SlurmScheduler("t", queries_=SlurmQueries(runner=squeue))
    s.cancel("77")
    assert fake.count("squeue") >= 4  # it kept asking until Slurm said CANCELLED
    d = s.describe("77")
    assert d is not None and d.state == AppState.CANCELLED
