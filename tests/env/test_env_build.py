"""Building environments with the real uv, offline from a wheelhouse: once per key, whole or not at all."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tsm.env.build import MARKER, EnvCache, summary
from tsm.env.spec import IndexSettings, default_python, plan
from tsm.errors import EnvBuildError
from tsm.specs.environment import Environment


def _version(python: str) -> str:
    out = subprocess.run([python, "-c", "import tsmenvdemo; print(tsmenvdemo.__version__)"],
                         capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_builds_once_then_reuses(tmp_path: Path, lock: Path, wheelhouse: Path) -> None:
    cache = EnvCache(tmp_path / "envs")
    p = plan(Environment(str(lock)), IndexSettings(find_links=(str(wheelhouse),)))
    first = cache.ensure(p)
    again = cache.ensure(p)
    assert first.built and not again.built
    assert _version(cache.python(p.key)) == "1.0"
    assert [b["key"] for b in cache.builds()] == [p.key]
    info = cache.info(p.key)
    assert info is not None and info["python_version"].startswith(default_python())
    assert not list((tmp_path / "envs" / ".building").iterdir())


def test_the_environment_is_relocated_whole(tmp_path: Path, lock: Path, wheelhouse: Path) -> None:
    """Built in a temporary folder and renamed: its interpreter works at the final place."""
    cache = EnvCache(tmp_path / "envs")
    p = plan(Environment(str(lock)), IndexSettings(find_links=(str(wheelhouse),)))
    cache.ensure(p)
    out = subprocess.run([cache.python(p.key), "-c", "import sys; print(sys.prefix)"], capture_output=True,
                         text=True, check=True).stdout.strip()
    assert out == str(cache.path(p.key))


def test_concurrent_launches_build_once(tmp_path: Path, lock: Path, wheelhouse: Path) -> None:
    root = tmp_path / "envs"
    code = (
        "import sys\nfrom tsm.env.build import EnvCache\nfrom tsm.env.spec import IndexSettings, plan\n"
        "from tsm.specs.environment import Environment\n"
        "p = plan(Environment(sys.argv[2]), IndexSettings(find_links=(sys.argv[3],)))\n"
        "print(EnvCache(sys.argv[1]).ensure(p).built)\n"
    )
    procs = [subprocess.Popen([sys.executable, "-c", code, str(root), str(lock), str(wheelhouse)],
                              stdout=subprocess.PIPE, text=True) for _ in range(4)]
    outs = [proc.communicate(timeout=300)[0].strip() for proc in procs]
    assert sorted(outs) == ["False", "False", "False", "True"]
    assert len(EnvCache(root).builds()) == 1


def test_a_build_that_died_half_way_is_never_used(tmp_path: Path, lock: Path, wheelhouse: Path) -> None:
    """What a killed build leaves (a .building folder, a final folder without its marker) is rebuilt."""
    cache = EnvCache(tmp_path / "envs")
    p = plan(Environment(str(lock)), IndexSettings(find_links=(str(wheelhouse),)))
    half = tmp_path / "envs" / ".building" / f"{p.key}-999-dead"
    (half / "bin").mkdir(parents=True)
    torn = cache.path(p.key) / "bin"
    torn.mkdir(parents=True)
    (torn / "python").write_text("#!/bin/sh\nexit 3\n")
    assert not cache.is_ready(p.key)
    assert cache.ensure(p).built
    assert not half.exists() and cache.is_ready(p.key)
    assert _version(cache.python(p.key)) == "1.0"


def test_a_missing_wheel_fails_in_one_line_and_leaves_nothing(tmp_path: Path, lock: Path) -> None:
    empty = tmp_path / "empty-wheelhouse"
    empty.mkdir()
    cache = EnvCache(tmp_path / "envs")
    p = plan(Environment(str(lock)), IndexSettings(find_links=(str(empty),)))
    with pytest.raises(EnvBuildError) as e:
        cache.ensure(p)
    assert "\n" not in str(e.value) and "installing the lock failed" in str(e.value)
    assert "tsmenvdemo" in e.value.detail
    assert not cache.path(p.key).exists() and not cache.is_ready(p.key)
    assert not list((tmp_path / "envs" / ".building").iterdir())
    assert [b["ok"] for b in cache.builds()] == [False]


def test_a_python_that_is_not_there_fails_in_one_line(tmp_path: Path, lock: Path, wheelhouse: Path) -> None:
    cache = EnvCache(tmp_path / "envs")
    p = plan(Environment(str(lock), "3.99"), IndexSettings(find_links=(str(wheelhouse),)))
    with pytest.raises(EnvBuildError, match=r"finding Python 3\.99 failed: No interpreter found") as e:
        cache.ensure(p)
    assert "\n" not in str(e.value)


def test_requirements_hashes_are_honoured(tmp_path: Path, wheelhouse: Path) -> None:
    wheel = wheelhouse / "tsmenvdemo-2.0-py3-none-any.whl"
    good = hashlib.sha256(wheel.read_bytes()).hexdigest()
    reqs = tmp_path / "requirements.txt"
    cache = EnvCache(tmp_path / "envs")
    settings = IndexSettings(find_links=(str(wheelhouse),))
    reqs.write_text(f"tsmenvdemo==2.0 --hash=sha256:{'0' * 64}\n")
    with pytest.raises(EnvBuildError, match="installing the lock failed"):
        cache.ensure(plan(Environment(str(reqs)), settings))
    reqs.write_text(f"tsmenvdemo==2.0 --hash=sha256:{good}\n")
    p = plan(Environment(str(reqs)), settings)
    cache.ensure(p)
    assert _version(cache.python(p.key)) == "2.0"


def test_pylock_builds(tmp_path: Path, lock: Path, wheelhouse: Path) -> None:
    from envkit import uv_bin

    pylock = tmp_path / "pylock.toml"
    subprocess.run([uv_bin(), "export", "--quiet", "--frozen", "--no-emit-project", "--format", "pylock.toml",
                    "--project", str(lock.parent), "-o", str(pylock)], check=True)
    cache = EnvCache(tmp_path / "envs")
    p = plan(Environment(str(pylock)), IndexSettings(find_links=(str(wheelhouse),)))
    cache.ensure(p)
    assert _version(cache.python(p.key)) == "1.0"
    assert json.loads((cache.path(p.key) / MARKER).read_text())["kind"] == "pylock"


def test_summary_keeps_the_cause() -> None:
    text = "Using Python 3.11\nerror: No solution found\n  cause: Because there is no version of x==3\n"
    assert summary(text) == "No solution found: Because there is no version of x==3"


def test_gc_clears_what_dead_builds_left_but_not_a_running_build(tmp_path: Path) -> None:
    from tsm.env.manage import stale_builds

    cache = EnvCache(tmp_path / "envs")
    dead = tmp_path / "envs" / ".building" / "aaaaaaaaaaaaaaaa-1-x"
    live = tmp_path / "envs" / ".building" / "bbbbbbbbbbbbbbbb-2-y"
    dead.mkdir(parents=True)
    live.mkdir(parents=True)
    with cache.locked("bbbbbbbbbbbbbbbb"):  # a build of that key holds its lock
        code = ("import sys\nfrom tsm.env.build import EnvCache\nfrom tsm.env.manage import stale_builds\n"
                "print(stale_builds(EnvCache(sys.argv[1])))")
        out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "envs")], capture_output=True, text=True,
                             check=True).stdout.strip()
    assert out == "['aaaaaaaaaaaaaaaa-1-x']"
    assert not dead.exists() and live.exists()
    assert stale_builds(cache) == ["bbbbbbbbbbbbbbbb-2-y"]
