"""Lockfile environments on the real Slurm cluster (``scripts/slurm-up``), offline from a test wheelhouse.

A heterogeneous job of two roles x two replicas runs in the environment (each replica prints its interpreter
and the package's version), and with a retry and a job-array sweep beside it exactly one build is counted;
a broken lock fails at submit in one line and no job is queued.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import tsm
from envkit import make_wheel, uv_lock
from tsm.env.build import EnvCache
from tsm.errors import InvalidAppError
from tsm.runner.api import get_runner
from tsm.specs.api import AppState, Resource
from tsm.sweep import run_sweep, sweep_trials, sweep_wait

pytestmark = [pytest.mark.integration, pytest.mark.slurm]

HANG = 400.0  # seconds: a guard against a hang, never a performance claim
PRINT = "import sys, tsmenvdemo; print(sys.executable, tsmenvdemo.__version__)"
SMALL = Resource(cpu=1, memMB=200)


@pytest.fixture(autouse=True)
def cluster(slurm_cluster: object, monkeypatch: pytest.MonkeyPatch) -> object:
    """The cluster, with this venv's python first on PATH: jobs carry the submitter's PATH."""
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    return slurm_cluster


def _lines(runner: tsm.Runner, handle: str, role: str, n: int) -> list[str]:
    return [line.strip() for i in range(n) for line in runner.log_lines(handle, role, i) if line.strip()]


def test_two_roles_a_retry_and_an_array_sweep_build_once(tsm_home: Path, tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    make_wheel(wheels, "1.0")
    lock = uv_lock(tmp_path / "proj", wheels, "tsmenvdemo==1.0")
    env = tsm.Environment(str(lock))
    flag = tmp_path / "failed-once"
    fail_once = (f"import os, sys\nif not os.path.exists({str(flag)!r}):\n    open({str(flag)!r}, 'w').close(); "
                 "sys.exit(1)\n" + PRINT)
    app = tsm.AppDef("envs", roles=[
        tsm.Role("a", entrypoint="python", args=["-c", PRINT], num_replicas=2, resource=SMALL, environment=env),
        tsm.Role("b", entrypoint="python", args=["-c", fail_once], num_replicas=2, max_retries=1, resource=SMALL,
                 environment=env),
    ])
    cfg = {"find_links": [str(wheels)]}
    cache = EnvCache(tsm_home / "envs")
    with get_runner("slurmenv") as runner:
        info = runner.dryrun(app, "slurm", cfg=cfg)
        key = info.request.environments["a"]["key"]
        assert f"{key} (not cached: built at submit)" in str(info)
        handle = runner.schedule(info)
        status = runner.wait(handle, wait_interval=0.5, timeout=HANG)
        assert status is not None and status.state == AppState.SUCCEEDED, status
        assert status.num_restarts == 1  # the retry ran in the same environment, built nothing
        python = cache.python(key)
        lines = _lines(runner, handle, "a", 2) + _lines(runner, handle, "b", 2)
        assert lines.count(f"{python} 1.0") >= 4, lines

        sweep = run_sweep(runner, "utils.python", {"c": [PRINT, PRINT + "  # trial 1"]}, scheduler="slurm",
                          parallel=2, cfg={"environment": str(lock), "find_links": [str(wheels)]},
                          args=["--memMB", "200"])
        assert sweep_wait(sweep, timeout=HANG).state == "SUCCEEDED"
        for t in sweep_trials(sweep):
            assert t.handle and _lines(runner, t.handle, "python", 1) == [f"{python} 1.0"]
    assert [b["key"] for b in cache.builds()] == [key]


def test_a_broken_lock_fails_at_submit_with_no_job(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    make_wheel(wheels, "1.0")
    lock = uv_lock(tmp_path / "proj", wheels, "tsmenvdemo==1.0")
    lock.write_text("version = [[\n")
    role = tsm.Role("a", entrypoint="python", args=["-c", PRINT], resource=SMALL, environment=tsm.Environment(str(lock)))
    before = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True).stdout
    with get_runner("slurmenv") as runner, pytest.raises(InvalidAppError, match="not valid TOML"):
        runner.run(tsm.AppDef("broken", roles=[role]), "slurm", cfg={"find_links": [str(wheels)]})
    assert subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True).stdout == before
