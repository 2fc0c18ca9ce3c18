"""Lockfile environments on Ray without a cluster: what the dry run ships, and the node-side build an actor runs.

The same path on a real Ray head (actors, a retry, a changed lock, a missing wheel): tests/integration/test_ray_envs.py.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import tsm
from envkit import make_wheel, uv_lock
from tsm.env.build import EnvCache
from tsm.errors import InvalidAppError
from tsm.schedulers.ray.envs import build_here, replica_env
from tsm.schedulers.ray.request import DriverPayload, RayOptions, build_request, format_request


@pytest.fixture
def lock(tmp_path: Path) -> Path:
    make_wheel(tmp_path / "wheels", "1.0")
    return uv_lock(tmp_path / "proj", tmp_path / "wheels", "tsmenvdemo==1.0")


def _app(lock: Path) -> tsm.AppDef:
    env = tsm.Environment(str(lock), python="3.11")
    return tsm.AppDef("envs", roles=[tsm.Role("a", entrypoint="python", args=["-c", "pass"], environment=env),
                                     tsm.Role("b", entrypoint="sh", args=["-c", "true"])])


def test_the_dry_run_ships_the_lock_files_text_and_names_the_key(lock: Path, tmp_path: Path) -> None:
    opts = RayOptions(find_links=[str(tmp_path / "wheels")])
    req = build_request(_app(lock), opts, "s", "http://h:8265", 1.0)
    env = req.payload.roles[0].environment
    assert env is not None and req.payload.roles[1].environment is None
    assert env["files"] == {"uv.lock": lock.read_text(), "pyproject.toml": (lock.parent / "pyproject.toml").read_text()}
    key = env["plan"]["key"]
    assert req.spec["roles"][0]["metadata"]["tsm.environment"] == {"key": key, "lock": str(lock), "python": "3.11"}
    shown = format_request(req)
    assert f"# environment of role a: {key} from {lock}, Python 3.11: built on each node" in shown
    back = DriverPayload.from_json(req.payload.to_json())  # what the driver reads on the cluster
    assert back.roles[0].environment == env


def test_the_run_option_environment_reaches_every_role(lock: Path) -> None:
    req = build_request(_app(lock), RayOptions(environment=str(lock)), "s", "http://h:8265", 1.0)
    assert [r.environment is not None for r in req.payload.roles] == [True, True]


def test_a_lock_that_is_not_text_is_refused_at_dry_run(tmp_path: Path) -> None:
    reqs = tmp_path / "requirements.txt"
    reqs.write_bytes(b"tsmenvdemo==1.0 \xff\n")
    app = tsm.AppDef("x", roles=[tsm.Role("a", entrypoint="python", environment=tsm.Environment(str(reqs)))])
    with pytest.raises(InvalidAppError, match="not UTF-8"):
        build_request(app, RayOptions(), "s", "http://h:8265", 1.0)


def test_the_node_builds_once_from_the_shipped_files_and_reuses_it(lock: Path, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    node_home = tmp_path / "node-home"
    monkeypatch.setenv("TSM_HOME", str(node_home))
    req = build_request(_app(lock), RayOptions(find_links=[str(tmp_path / "wheels")]), "s", "http://h:8265", 1.0)
    data = json.loads(json.dumps(req.payload.roles[0].environment))
    lock.unlink()  # the node never reads the submitter's files
    first, again = build_here(data), build_here(data)
    key = data["plan"]["key"]
    assert first["built"] is True and again["built"] is False and first["root"] == again["root"], (first, again)
    cache = EnvCache(node_home / "envs")
    assert [b["key"] for b in cache.builds()] == [key]
    assert (Path(first["root"]) / "bin" / "python").exists()
    assert oct((node_home / "envs" / ".sources" / key / "uv.lock").stat().st_mode & 0o777) == "0o600"

    full = {"PATH": "/usr/bin", "VIRTUAL_ENV": "/elsewhere", "PYTHONHOME": "/x"}
    replica_env(full, {}, first)
    assert full == {"PATH": f"{first['root']}/bin{os.pathsep}/usr/bin", "VIRTUAL_ENV": first["root"], "TSM_ENV_KEY": key}
    own = {"PATH": "/mine"}
    replica_env(own, {"PATH": "/mine", "VIRTUAL_ENV": "/v"}, first)
    assert own["PATH"] == "/mine" and "VIRTUAL_ENV" not in own and own["TSM_ENV_KEY"] == key


def test_a_missing_wheel_is_one_line_from_the_node_and_leaves_nothing_ready(lock: Path, tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TSM_HOME", str(tmp_path / "node-home"))
    empty = tmp_path / "empty"
    empty.mkdir()
    req = build_request(_app(lock), RayOptions(find_links=[str(empty)]), "s", "http://h:8265", 1.0)
    data = req.payload.roles[0].environment
    assert data is not None
    out = build_here(data)
    assert "\n" not in out["error"] and "tsmenvdemo" in out["error"] and "tsmenvdemo" in out["detail"], out
    assert not EnvCache(tmp_path / "node-home" / "envs").is_ready(data["plan"]["key"])


@pytest.mark.parametrize("name", ["../uv.lock", "a/b", "..", ""])
def test_a_shipped_file_name_that_is_not_a_plain_name_is_refused(lock: Path, tmp_path: Path, name: str,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TSM_HOME", str(tmp_path / "node-home"))
    req = build_request(_app(lock), RayOptions(find_links=[str(tmp_path / "wheels")]), "s", "http://h:8265", 1.0)
    data = req.payload.roles[0].environment
    assert data is not None
    data["files"][name] = "x"
    out = build_here(data)
    assert "not a plain file name" in out["error"]
    assert not (tmp_path / "node-home" / "envs" / "uv.lock").exists()
