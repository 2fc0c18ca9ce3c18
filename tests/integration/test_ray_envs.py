"""Lockfile environments on the real Ray head, offline from a wheelhouse the test makes itself.

Two roles x two replicas run the environment's interpreter with the package in it, built on the node by
the actors once for all four replicas and a retry; a second app of the same lock builds nothing; a changed
lock builds once more; a missing wheel fails the app with uv's line before any replica starts.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import tsm
from envkit import make_wheel, uv_lock
from integration.ray_cluster import RayCluster, ray_cluster  # noqa: F401 (the fixture test modules ask for)
from tsm.env.build import EnvCache
from tsm.runner import get_runner
from tsm.specs.api import AppState, Resource, RetryPolicy

pytestmark = [pytest.mark.integration, pytest.mark.ray]
HANG = 300.0  # seconds: a guard against a hang, never a performance claim
SMALL = Resource(cpu=1, memMB=100)
# one write (replicas run unbuffered: print() of three values would be several)
PRINT = ("import os, sys, tsmenvdemo; "
         "sys.stdout.write(f'{sys.executable} {tsmenvdemo.__version__} {os.environ.get(\"TSM_ENV_KEY\")}\\n')")


def _app(lock: Path, flag: Path) -> tsm.AppDef:
    """Roles a and b, two replicas each; b/0 fails its first attempt (``flag`` says it did) and is retried."""
    env = tsm.Environment(str(lock))
    fail_once = (f"import os, sys\nif os.environ['TSM_REPLICA_ID'] == '0' and not os.path.exists({str(flag)!r}):\n"
                 f"    open({str(flag)!r}, 'w').close(); sys.exit(1)\n" + PRINT)
    return tsm.AppDef("envs", roles=[
        tsm.Role("a", entrypoint="python", args=["-c", PRINT], num_replicas=2, resource=SMALL, environment=env),
        tsm.Role("b", entrypoint="python", args=["-c", fail_once], num_replicas=2, resource=SMALL, environment=env,
                 max_retries=1, retry_policy=RetryPolicy.REPLICA),
    ])


def _lines(runner: tsm.Runner, handle: str, role: str) -> list[str]:
    return [ln.strip() for k in range(2) for ln in runner.log_lines(handle, role, k) if ln.strip()]


def test_two_roles_and_a_retry_build_once_per_node_and_a_changed_lock_once_more(
        ray_cluster: RayCluster, tmp_path: Path) -> None:  # noqa: F811
    wheels = tmp_path / "wheels"
    make_wheel(wheels, "1.0")
    make_wheel(wheels, "2.0")
    lock = uv_lock(tmp_path / "proj", wheels, "tsmenvdemo==1.0")
    cfg = {"address": ray_cluster.address, "find_links": [str(wheels)], "ship_cwd": False}
    with get_runner("ray-envs") as runner:
        info = runner.dryrun(_app(lock, tmp_path / "failed-once"), "ray", cfg=cfg)
        key = info.request.payload.roles[0].environment["plan"]["key"]
        assert f"# environment of role a: {key} from {lock}" in str(info)
        handle = runner.schedule(info)
        status = runner.wait(handle, timeout=HANG)
        assert status is not None and status.state == AppState.SUCCEEDED, status
        assert status.num_restarts == 1 and (tmp_path / "failed-once").exists()
        lines = _lines(runner, handle, "a") + _lines(runner, handle, "b")
        assert len(lines) == 4, lines
        python = lines[0].split()[0]
        assert all(line == f"{python} 1.0 {key}" for line in lines), lines
        root = Path(python).parents[2]  # <node's tsm home>/envs/<key>/bin/python
        assert Path(python).parent.parent == root / key
        cache = EnvCache(root)
        assert [b["key"] for b in cache.builds() if b["key"] == key] == [key]
        described = runner.describe(handle)
        assert described is not None and described.roles[0].metadata["tsm.environment"]["key"] == key

        again = runner.run(_app(lock, tmp_path / "failed-once"), "ray", cfg=cfg)  # the same lock: nothing built
        status = runner.wait(again, timeout=HANG)
        assert status is not None and status.state == AppState.SUCCEEDED, status
        assert [b["key"] for b in cache.builds() if b["key"] == key] == [key]

        pyproject = lock.parent / "pyproject.toml"
        pyproject.write_text(pyproject.read_text().replace("==1.0", "==2.0"))
        lock = uv_lock(lock.parent, wheels, "tsmenvdemo==2.0")
        changed = runner.dryrun(_app(lock, tmp_path / "failed-once"), "ray", cfg=cfg)
        key2 = changed.request.payload.roles[0].environment["plan"]["key"]
        assert key2 != key
        handle = runner.schedule(changed)
        status = runner.wait(handle, timeout=HANG)
        assert status is not None and status.state == AppState.SUCCEEDED, status
        assert set(_lines(runner, handle, "a")) == {f"{root / key2 / 'bin' / 'python'} 2.0 {key2}"}
        assert [b["key"] for b in cache.builds() if b["key"] in (key, key2)] == [key, key2]


def test_a_missing_wheel_fails_the_app_in_one_line_before_any_replica_starts(
        ray_cluster: RayCluster, tmp_path: Path) -> None:  # noqa: F811
    wheels, empty = tmp_path / "wheels", tmp_path / "empty"
    make_wheel(wheels, "1.0")
    empty.mkdir()
    lock = uv_lock(tmp_path / "proj", wheels, "tsmenvdemo==1.0")
    cfg = {"address": ray_cluster.address, "find_links": [str(empty)], "ship_cwd": False}
    with get_runner("ray-envs") as runner:
        handle = runner.run(_app(lock, tmp_path / "failed-once"), "ray", cfg=cfg)
        status = runner.wait(handle, timeout=HANG)
        assert status is not None and status.state == AppState.FAILED, status
        assert "tsmenvdemo" in status.msg and "\n" not in status.msg, status.msg
        replicas = [r for role in status.roles for r in role.replicas]
        assert len(replicas) == 4 and all(r.error_msg.startswith("not started: ") for r in replicas), replicas
        assert _lines(runner, handle, "a") == [] and _lines(runner, handle, "b") == []
        assert not (tmp_path / "failed-once").exists()
