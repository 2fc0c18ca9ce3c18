"""``tsm env list | show | rm | gc`` on real environments built offline from a test wheelhouse."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import tsm
from envkit import make_wheel, uv_lock
from tsm.env.build import MARKER
from tsm.runner.api import get_runner
from tsm.schedulers.local.envs import cache

HANG = 120  # seconds: a guard against a hung command, never a performance claim
TSM = [sys.executable, "-m", "tsm.cli.main"]


def _tsm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*TSM, "env", *args], capture_output=True, text=True, timeout=HANG,
                          stdin=subprocess.DEVNULL)


@pytest.fixture
def built(tmp_path: Path) -> tuple[str, Path, Path]:
    """One environment built into this test's home: (key, lock, wheelhouse)."""
    from tsm.env.spec import IndexSettings, plan

    wheels = tmp_path / "wheels"
    make_wheel(wheels, "1.0")
    lock = uv_lock(tmp_path / "proj", wheels, "tsmenvdemo==1.0")
    p = plan(tsm.Environment(str(lock)), IndexSettings(find_links=(str(wheels),)))
    cache().ensure(p)
    return p.key, lock, wheels


def test_list_and_show(built: tuple[str, Path, Path]) -> None:
    key, lock, wheels = built
    r = _tsm("list")
    assert r.returncode == 0 and key in r.stdout and str(lock) in r.stdout
    rows = json.loads(_tsm("list", "--json").stdout)
    assert [row["key"] for row in rows] == [key] and rows[0]["kind"] == "uv.lock"
    shown = _tsm("show", key[:6])
    assert shown.returncode == 0 and "builds:     1 (" in shown.stdout and str(wheels) in shown.stdout
    data = json.loads(_tsm("show", key, "--json").stdout)
    assert data["key"] == key and len(data["builds"]) == 1 and data["builds"][0]["ok"]
    unknown = _tsm("show", "ffffffffffff")
    assert unknown.returncode == 2 and unknown.stderr.count("\n") == 1


def test_rm_keeps_an_environment_a_running_app_uses(built: tuple[str, Path, Path]) -> None:
    key, lock, wheels = built
    role = tsm.Role("sleeper", entrypoint="python", args=["-c", "import time; time.sleep(120)"],
                    environment=tsm.Environment(str(lock)))
    with get_runner() as runner:
        handle = runner.run(tsm.AppDef("busy", roles=[role]), "local", cfg={"find_links": [str(wheels)]})
        try:
            r = _tsm("rm", key)
            assert r.returncode == 1 and "a running app uses it" in r.stderr
            assert cache().is_ready(key)
        finally:
            runner.cancel(handle)
            runner.wait(handle, wait_interval=0.1)
    r = _tsm("rm", key)
    assert r.returncode == 0 and r.stdout == f"removed {key}\n"
    assert not cache().path(key).exists()


def test_gc_removes_only_what_was_not_used_for_that_long(built: tuple[str, Path, Path]) -> None:
    key, _lock, _wheels = built
    assert _tsm("gc", "--older-than", "1d").stdout == ""
    week_ago = time.time() - 8 * 86400
    os.utime(cache().path(key) / MARKER, (week_ago, week_ago))
    assert _tsm("gc", "--older-than", "7d", "--dry-run").stdout == f"would remove {key}\n"
    assert cache().is_ready(key)
    assert _tsm("gc", "--older-than", "7d").stdout == f"removed {key}\n"
    assert not cache().is_ready(key)
    bad = _tsm("gc", "--older-than", "soon")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1
