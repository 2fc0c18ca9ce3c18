"""Lockfile environments on the real local scheduler, offline from a wheelhouse the test makes itself.

One build per key across two roles x two replicas, a retry and a small sweep; a changed lock builds once
more; a broken lock or a missing wheel fails at submit in one line, before any replica starts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import tsm
from envkit import make_wheel, uv_lock
from tsm.env.build import EnvCache
from tsm.runner.api import get_runner
from tsm.specs.api import AppState

HANG = 300  # seconds: a guard against a hang, never a performance claim
TSM = [sys.executable, "-m", "tsm.cli.main"]
# One write: replicas run unbuffered, where print() of three values is several writes, and the retry may stop
# a sibling between two of them (its log then ends in a part of the line, as it should).
PRINT = ("import os, sys, tsmenvdemo; "
         "sys.stdout.write(f'{sys.executable} {tsmenvdemo.__version__} {os.environ.get(\"TSM_ENV_KEY\")}\\n')")


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheelhouse")
    make_wheel(out, "1.0")
    make_wheel(out, "2.0")
    return out


def _cache(home: Path) -> EnvCache:
    return EnvCache(home / "envs")


def _tsm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*TSM, *args], capture_output=True, text=True, timeout=HANG, stdin=subprocess.DEVNULL)


def _app(lock: Path, marker_dir: Path) -> tsm.AppDef:
    """Two roles of two replicas; replica b/0 fails on its first attempt, so the app retries once."""
    fail_once = (f"import os, sys; f = os.path.join({str(marker_dir)!r}, 'failed')\n"
                 "if os.environ['TSM_REPLICA_ID'] == '0' and not os.path.exists(f):\n    open(f, 'w').close(); sys.exit(1)\n" + PRINT)
    env = tsm.Environment(str(lock))
    a = tsm.Role("a", entrypoint="python", args=["-c", PRINT], num_replicas=2, environment=env)
    b = tsm.Role("b", entrypoint="python", args=["-c", fail_once], num_replicas=2, max_retries=1, environment=env)
    return tsm.AppDef("envs", roles=[a, b])


def _lines(runner: tsm.Runner, handle: str, role: str, n: int) -> list[str]:
    return [line.strip() for i in range(n) for line in runner.log_lines(handle, role, i) if line.strip()]


def test_two_roles_a_retry_and_a_sweep_build_once(tsm_home: Path, tmp_path: Path, wheelhouse: Path) -> None:
    lock = uv_lock(tmp_path / "proj", wheelhouse, "tsmenvdemo==1.0")
    markers = tmp_path / "markers"
    markers.mkdir()
    cfg = {"find_links": [str(wheelhouse)]}
    with get_runner() as runner:
        info = runner.dryrun(_app(lock, markers), "local", cfg=cfg)
        key = info.request.environments["a"]["key"]
        assert f"{key} (not cached: built at submit)" in str(info)
        handle = runner.schedule(info)
        status = runner.wait(handle, wait_interval=0.1)
        assert status is not None and status.state == AppState.SUCCEEDED, status
        assert status.num_restarts == 1
        python = str(_cache(tsm_home).path(key) / "bin" / "python")
        lines = _lines(runner, handle, "a", 2) + _lines(runner, handle, "b", 2)
        assert lines and all(line == f"{python} 1.0 {key}" for line in lines), lines
        assert len(lines) >= 4
        described = runner.describe(handle)
        assert described is not None and described.roles[0].metadata["tsm.environment"]["key"] == key
        assert "(cached)" in str(runner.dryrun(_app(lock, markers), "local", cfg=cfg))

    sweep = _tsm("sweep", "--environment", str(lock), "-c", f"find_links={wheelhouse}", "utils.python",
                 "--num_replicas", "1,2", "--memMB", "64,128", "--", "--c", PRINT)
    assert sweep.returncode == 0, sweep.stderr
    handle = sweep.stdout.strip()
    assert _tsm("sweep", "wait", handle).returncode == 0
    shown = _tsm("sweep", "show", handle).stdout
    trials = [line.split()[-1] for line in shown.splitlines()[1:] if "SUCCEEDED" in line]
    assert len(trials) == 4, shown
    with get_runner() as runner:
        assert _lines(runner, trials[-1], "python", 2) == [f"{python} 1.0 {key}"] * 2
    assert [b["key"] for b in _cache(tsm_home).builds()] == [key]

    pyproject = lock.parent / "pyproject.toml"  # a changed lock builds once more, then is reused
    pyproject.write_text(pyproject.read_text().replace("==1.0", "==2.0"))
    lock = uv_lock(lock.parent, wheelhouse, "tsmenvdemo==2.0")
    for _ in range(2):
        r = _tsm("run", "--environment", str(lock), "-c", f"find_links={wheelhouse}", "utils.python", "--c", PRINT)
        assert r.returncode == 0, r.stderr
        assert " 2.0 " in r.stdout + r.stderr
    builds = _cache(tsm_home).builds()
    assert len(builds) == 2 and builds[0]["key"] == key and builds[1]["key"] != key


def test_a_broken_lock_fails_at_submit_in_one_line(tmp_path: Path, wheelhouse: Path) -> None:
    lock = uv_lock(tmp_path / "proj", wheelhouse, "tsmenvdemo==1.0")
    lock.write_text(lock.read_text().replace("[[package]]", "[[package]", 1))
    r = _tsm("run", "--environment", str(lock), "-c", f"find_links={wheelhouse}", "utils.python", "--c", PRINT)
    assert r.returncode == 1
    assert r.stderr.count("\n") == 1 and "uv.lock is not valid TOML" in r.stderr, r.stderr
    assert _tsm("list").stdout.count("\n") <= 1  # nothing was submitted


def test_a_missing_wheel_fails_at_submit_before_any_replica(tsm_home: Path, tmp_path: Path,
                                                           wheelhouse: Path) -> None:
    lock = uv_lock(tmp_path / "proj", wheelhouse, "tsmenvdemo==1.0")
    empty = tmp_path / "empty"
    empty.mkdir()
    args = ["run", "--environment", str(lock), "-c", f"find_links={empty}", "utils.python", "--c", PRINT]
    r = _tsm(*args)
    assert r.returncode == 1
    assert r.stderr.count("\n") == 1 and "installing the lock failed" in r.stderr, r.stderr
    assert not (tsm_home / "local").exists() or not list((tsm_home / "local").iterdir())
    debug = _tsm("--debug", *args)
    assert "tsmenvdemo" in debug.stderr.split("\n", 1)[1]  # uv's own message below the line
    env_dirs = [p.name for p in (tsm_home / "envs").iterdir() if not p.name.startswith(".")]
    assert env_dirs == ["builds.jsonl"]
    assert all(not json.loads(line)["ok"] for line in (tsm_home / "envs" / "builds.jsonl").read_text().splitlines())


def test_a_role_without_an_environment_keeps_the_interpreter_rule(wheelhouse: Path, tmp_path: Path) -> None:
    lock = uv_lock(tmp_path / "proj", wheelhouse, "tsmenvdemo==1.0")
    plain = tsm.Role("plain", entrypoint="python", args=["-c", "print(1)"], env={"TSM_PYTHON": sys.executable})
    with get_runner() as runner:
        info = runner.dryrun(tsm.AppDef("mixed", roles=[plain]), "local",
                             cfg={"environment": str(lock), "find_links": [str(wheelhouse)]})
    assert info.request.environments == {}  # the role picks its interpreter itself: the run option skips it
    assert os.path.dirname(sys.executable) in info.request.roles[0].replicas[0].env["PATH"]
