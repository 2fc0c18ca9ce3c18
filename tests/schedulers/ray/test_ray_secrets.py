"""Secrets on the ray scheduler without a cluster: the dry run and the job hold names only, the values go to
the cluster's store apart from the job (a stand-in dashboard records what is sent), the driver gives them to
every start of its roles' replicas (fake actors), and what a driver never took is withdrawn. The real head:
``tests/integration/test_ray_secrets.py``."""

from __future__ import annotations

import dataclasses
import io
import json
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

from schedulers.ray.test_ray_client import FakeDashboard
from schedulers.ray.test_ray_driver import FakeActor, FakeRay
from tsm.errors import NotSupportedError, SchedulerError, SecretError
from tsm.runner import get_runner
from tsm.schedulers.ray import create_scheduler, driver as drv, secrets as rs
from tsm.schedulers.ray.client import RayClient
from tsm.schedulers.ray.request import RayOptions, build_request, payload_module
from tsm.specs.api import AppDef, Resource, RetryPolicy, Role

CANARY = "tsm-canary-ray-51c0de"
NASTY = "a b'c\"$HOME`;\n\\x é\n"


@pytest.fixture
def dashboard() -> Any:
    d = FakeDashboard()
    yield d
    d.close()


def _app(tmp_path: Path, nasty_in: Path | None = None, replicas: int = 2) -> AppDef:
    path = (nasty_in or tmp_path) / "nasty"
    path.write_text(NASTY + "\n")  # one trailing newline is dropped: NASTY keeps its own
    return AppDef("sec", [
        Role("w", entrypoint=sys.executable, args=["-c", "pass"], num_replicas=replicas,
             resource=Resource(cpu=1, gpu=0, memMB=64), secrets=["TOKEN:env:SRC", f"NASTY:file:{path}"]),
        Role("other", entrypoint="true", resource=Resource(cpu=1, gpu=0, memMB=64)),
    ])


def _puts(dashboard: FakeDashboard, uri: str) -> list[bytes]:
    name = uri.partition("://")[2]
    return [body for m, p, body in dashboard.requests if m == "PUT" and p == f"/api/packages/gcs/{name}"]


def test_the_dry_run_names_the_secrets_and_holds_no_value(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SRC", CANARY)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "nasty").write_text(NASTY)
    role = Role("w", entrypoint=sys.executable, args=["-c", "pass"], num_replicas=2,
                secrets=[f"NASTY:file:{tmp_path / 'nasty'}"])
    info = get_runner().dryrun(AppDef("sec", [role]), "ray", cfg={"secrets": ["TOKEN:env:SRC"]})
    req, shown = info.request, str(info)
    assert sorted(req.secrets) == sorted(["TOKEN:env:SRC", f"NASTY:file:{tmp_path / 'nasty'}"])
    assert [sorted(r.secrets) for r in req.payload.replicas] == [["NASTY", "TOKEN"]] * 2
    assert req.payload.secrets_uri.startswith(rs.URI_PREFIX) and len(req.payload.secrets_uri) == len(rs.URI_PREFIX) + 32
    actors = [ln for ln in shown.splitlines() if ln.startswith("actor ")]
    assert len(actors) == 2 and all("TOKEN=<secret>" in ln and "NASTY=<secret>" in ln for ln in actors)
    assert f"# secrets {', '.join(req.secrets)}: read at submit" in shown
    job = json.dumps([req.entrypoint, req.metadata, req.runtime_env])
    assert req.payload.secrets_uri not in job  # the job names no key: only the driver's payload does
    for text in (shown, json.dumps(dataclasses.asdict(req), default=str), req.payload.to_json()):
        assert CANARY not in text and "$HOME`;" not in text


def test_without_secrets_nothing_changes(tmp_path: Path) -> None:
    req = build_request(AppDef("a", [Role("w", entrypoint="true")]), RayOptions(), "s", "http://h:8265", 0.0)
    assert req.secrets == [] and req.payload.secrets_uri == "" and req.payload.replicas[0].secrets == []


def test_a_kubernetes_secret_is_refused_at_dry_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(NotSupportedError, match="not k8s"):
        get_runner().dryrun(AppDef("sec", [Role("w", entrypoint="true")]), "ray", cfg={"secrets": ["B:k8s:creds/b"]})


def test_values_are_stored_byte_exact_behind_a_fixed_header() -> None:
    values = {"NASTY": NASTY, "RAW": "caf\udce9 \udcff"}  # bytes that are not UTF-8, as os.environ holds them
    data = rs.encode(values)
    assert data.startswith(rs.HEADER) and len(rs.HEADER) == 15  # what Ray's upload error quotes of a package
    assert data.isascii() and rs.decode(data) == values
    assert rs.decode(rs.REVOKED) is None and rs.decode(b"") is None and rs.decode(None) is None
    assert rs.decode(rs.HEADER + b"{not json") is None and rs.decode(b'{"A": "1"}') is None


def test_schedule_puts_the_values_apart_from_the_job(dashboard: FakeDashboard, tsm_home: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SRC", CANARY)
    launch = tmp_path / "launch"
    launch.mkdir()
    monkeypatch.chdir(launch)
    s = create_scheduler("t", address=dashboard.address)
    info = s.submit_dryrun(_app(tmp_path, nasty_in=launch), {})
    uri = info.request.payload.secrets_uri
    app_id = s.schedule(info)
    assert [rs.decode(b) for b in _puts(dashboard, uri)] == [{"TOKEN": CANARY, "NASTY": NASTY}]
    name = uri.partition("://")[2]
    calls = [(m, p) for m, p, _ in dashboard.requests]
    put = calls.index(("PUT", f"/api/packages/gcs/{name}"))
    # after the job's own packages, pinned by the GET that follows, then the job
    assert calls[put + 1] == ("GET", f"/api/packages/gcs/{name}") and calls[put + 2] == ("POST", "/api/jobs/")
    assert all(not p.startswith("/api/packages/") or m == "GET" for m, p in calls[put + 1:])
    job = dashboard.jobs[app_id]
    assert CANARY not in json.dumps(job) and "$HOME`;" not in json.dumps(job) and name not in json.dumps(job)
    # the token file in the launching directory (shipped as the working_dir) was left out of it
    zips = [body for m, p, body in dashboard.requests if m == "PUT" and p.startswith("/api/packages/gcs/_ray_pkg_")]
    names = [n for z in zips for n in zipfile.ZipFile(io.BytesIO(z)).namelist()]
    assert names and not any(n.endswith("nasty") for n in names)
    assert all(CANARY.encode() not in z and b"$HOME`;" not in z for z in zips)
    for p in tsm_home.rglob("*"):
        if p.is_file():
            assert CANARY.encode() not in p.read_bytes() and b"$HOME`;" not in p.read_bytes(), p
    assert rs.recorded_uri(tsm_home / "ray" / app_id, payload_module(app_id)) == uri


def test_a_secret_without_a_value_fails_before_anything_is_written(
        dashboard: FakeDashboard, tsm_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SRC", raising=False)
    monkeypatch.chdir(tmp_path)
    s = create_scheduler("t", address=dashboard.address)
    with pytest.raises(SecretError, match=r"secret TOKEN: \$SRC is not set"):
        s.schedule(s.submit_dryrun(_app(tmp_path), {}))
    assert dashboard.requests == [] and not (tsm_home / "ray").exists()


def test_a_failed_submission_withdraws_the_values(dashboard: FakeDashboard, tsm_home: Path, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SRC", CANARY)
    monkeypatch.chdir(tmp_path)
    real = RayClient._json

    def refuse_the_job(self: RayClient, what: str, *a: Any, **kw: Any) -> Any:
        if what == "submit job":
            raise SchedulerError("refused")
        return real(self, what, *a, **kw)

    monkeypatch.setattr(RayClient, "_json", refuse_the_job)
    s = create_scheduler("t", address=dashboard.address)
    info = s.submit_dryrun(_app(tmp_path), {})
    with pytest.raises(SchedulerError, match="refused"):
        s.schedule(info)
    assert _puts(dashboard, info.request.payload.secrets_uri)[-1] == rs.REVOKED


def test_cancel_and_remove_withdraw_values_no_driver_took(dashboard: FakeDashboard, tsm_home: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SRC", CANARY)
    monkeypatch.chdir(tmp_path)
    s = create_scheduler("t", address=dashboard.address)
    info = s.submit_dryrun(_app(tmp_path), {})
    uri = info.request.payload.secrets_uri
    app_id = s.schedule(info)
    s.cancel(app_id)  # the stand-in has no driver: nothing took them
    assert [b == rs.REVOKED for b in _puts(dashboard, uri)] == [False, True]
    assert s.remove(app_id) is False  # Ray keeps the ended job; tsm its record
    assert _puts(dashboard, uri)[-1] == rs.REVOKED
    # once taken (the key gone) nothing is put again
    dashboard.packages.discard(f"/api/packages/gcs/{uri.partition('://')[2]}")
    s.remove(app_id)
    assert len(_puts(dashboard, uri)) == 3


def test_excludes_anchor_the_files_inside_the_shipped_directory(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    entries = [f"A:file:{tmp_path / 'sub' / 'tok*en'}", f"B:file:{tmp_path.parent / 'elsewhere'}", "C", "D:env:E"]
    assert rs.excludes(entries, str(tmp_path)) == ["/sub/tok\\*en"]


def _driver(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, secrets: dict[str, str]) -> drv.Driver:
    monkeypatch.setattr(drv, "ray", FakeRay())
    monkeypatch.setattr(drv, "logs_dir", lambda: str(tmp_path))
    app = AppDef("a", [
        Role("w", entrypoint="true", num_replicas=2, max_retries=1, retry_policy=RetryPolicy.REPLICA,
             secrets=["TOKEN", "NASTY:file:/x"]),
        Role("other", entrypoint="true", secrets=["NASTY:file:/x"]),
    ])
    d = drv.Driver(build_request(app, RayOptions(), "s", "http://h:8265", 0.0).payload, secrets)
    d.specs = {(r.role, r.replica_id): r for r in d.p.replicas}
    d.actors = {k: FakeActor() for k in d.specs}
    return d


def test_every_start_gets_its_roles_secrets_retries_and_preemptions_included(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    d = _driver(monkeypatch, tmp_path, {"TOKEN": CANARY, "NASTY": NASTY})
    waits = d._start_all(list(d.specs))
    waits.pop(next(ref for ref, k in waits.items() if k == ("w", 0)))
    assert d._ended(("w", 0), 3, waits)  # retried (REPLICA)
    monkeypatch.setattr(d, "_place", lambda keys: True)
    assert d._preempted(("w", 1), "node n was lost", waits)  # restarted elsewhere
    starts = {k: a.starts() for k, a in d.actors.items()}  # type: ignore[attr-defined]
    assert [e["TSM_ATTEMPT"] for e in starts[("w", 0)]] == ["0", "1"]
    assert [e["TSM_LAST_EXIT"] for e in starts[("w", 1)]] == ["", "preempted"]
    for env in starts[("w", 0)] + starts[("w", 1)]:
        assert (env["TOKEN"], env["NASTY"]) == (CANARY, NASTY)
    assert starts[("other", 0)] and all(e["NASTY"] == NASTY and "TOKEN" not in e for e in starts[("other", 0)])
    assert CANARY not in (tmp_path / "tsm").joinpath(d.p.app_id, "status.json").read_text()


def test_a_driver_that_finds_no_values_fails_the_app_saying_why(monkeypatch: pytest.MonkeyPatch,
                                                                tmp_path: Path) -> None:
    payload = build_request(AppDef("a", [Role("w", entrypoint="true", secrets=["TOKEN"])]), RayOptions(), "s",
                            "http://h:8265", 0.0).payload
    pkg = tmp_path / "mods" / payload_module(payload.app_id)
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "payload.json").write_text(payload.to_json())
    monkeypatch.syspath_prepend(str(tmp_path / "mods"))
    fake = FakeRay()
    fake.init = lambda **kw: None  # type: ignore[attr-defined]
    monkeypatch.setattr(drv, "ray", fake)
    monkeypatch.setattr(drv, "logs_dir", lambda: str(tmp_path))
    asked: list[str] = []
    monkeypatch.setattr(rs, "take", lambda uri: asked.append(uri))
    assert drv.main([payload_module(payload.app_id)]) == 1
    assert asked == [payload.secrets_uri]
    record = json.loads((tmp_path / "tsm" / payload.app_id / "status.json").read_text())
    assert (record["state"], record["msg"]) == ("FAILED", rs.MISSING)


def test_the_driver_takes_the_values_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from ray.experimental import internal_kv

    store = {"gcs://_tsm_secrets_x": rs.encode({"TOKEN": CANARY})}
    monkeypatch.setattr(internal_kv, "_internal_kv_get", lambda key: store.get(key))
    monkeypatch.setattr(internal_kv, "_internal_kv_del", lambda key: store.pop(key) and 1)
    assert rs.take("gcs://_tsm_secrets_x") == {"TOKEN": CANARY}
    assert store == {} and rs.take("gcs://_tsm_secrets_x") is None
