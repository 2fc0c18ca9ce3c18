"""AppRecord: the submitted app round-trips through its JSON; anything else reads as None."""

from __future__ import annotations

from pathlib import Path

from tsm.schedulers.api import DescribeAppResponse
from tsm.schedulers.common.record import (
    AppRecord,
    ended_status,
    load_final,
    role_replicas,
    save_final,
    status_from_json,
    with_record,
)
from tsm.specs.api import AppDef, AppState, ReplicaStatus, Role, RoleStatus


def test_round_trip_keeps_the_app_and_details(tmp_path: Path) -> None:
    app = AppDef("a", [Role("r", entrypoint="echo", args=["$x 'y'"], num_replicas=3, env={"K": "v\n"})])
    rec = AppRecord(scheduler="s", session="sess", app=app, submit_dir="/w", details={"job_dir": "/j"})
    text = rec.to_json()
    assert text == AppRecord.from_json(text).to_json()  # type: ignore[union-attr]
    (tmp_path / "app.json").write_text(text)
    back = AppRecord.load(tmp_path / "app.json")
    assert back is not None and back.app == app and back.details == {"job_dir": "/j"}
    assert (back.scheduler, back.session, back.submit_dir) == ("s", "sess", "/w")
    assert role_replicas(back.app) == {"r": 3} and role_replicas(None) == {}


def test_unreadable_records_are_none(tmp_path: Path) -> None:
    assert AppRecord.load(tmp_path / "missing") is None
    for text in ("", "{", "[]", '{"app": 1}', '{"scheduler": "s"}'):
        assert AppRecord.from_json(text) is None, text


def test_final_status_round_trips_and_a_missing_one_is_none(tmp_path: Path) -> None:
    app_dir = tmp_path / "app-1"
    assert load_final(app_dir) is None
    rep = ReplicaStatus(id=1, state=AppState.FAILED, role="w", exit_code=3, error_msg="exited", restarts=2, hostname="h")
    d = DescribeAppResponse(app_id="app-1", state=AppState.FAILED, msg="m", num_restarts=2, created=5.0,
                            roles_statuses=[RoleStatus("w", [rep])])
    save_final(app_dir, d)
    assert load_final(app_dir) == d
    assert not (app_dir / "final.json.tmp").exists()
    for text in ("", "{", '{"app_id": "x"}', '{"app_id": "x", "state": "NOPE", "roles": []}'):
        assert status_from_json(text) is None, text


def test_final_status_keeps_the_preempted_flag_and_metadata(tmp_path: Path) -> None:
    rep = ReplicaStatus(id=0, state=AppState.FAILED, role="w", error_msg="preempted: evicted", preempted=True)
    d = DescribeAppResponse(app_id="app-2", state=AppState.FAILED, msg="m", roles_statuses=[RoleStatus("w", [rep])],
                            metadata={"excluded_nodes": "node1: lost"})
    save_final(tmp_path, d)
    back = load_final(tmp_path)
    assert back == d and back.roles_statuses[0].replicas[0].preempted
    # a status written before the flag was kept (six fields a row, no metadata) still reads
    old = ('{"app_id": "a", "state": "FAILED", "msg": "", "num_restarts": 0, "created": null, '
           '"roles": [["w", [[0, "FAILED", 1, "exited", 0, "h"]]]]}')
    back = status_from_json(old)
    assert back is not None and not back.roles_statuses[0].replicas[0].preempted and back.metadata == {}


def test_ended_status_gives_every_replica_the_state() -> None:
    d = ended_status("app-1", [["w", 2, 0, "APPLICATION"], ["ps", 1, 0, "ROLE"]], AppState.FAILED, "could not start")
    assert (d.app_id, d.state, d.msg) == ("app-1", AppState.FAILED, "could not start")
    assert [(rs.role, [(r.id, r.state, r.error_msg) for r in rs.replicas]) for rs in d.roles_statuses] == [
        ("w", [(0, AppState.FAILED, "could not start"), (1, AppState.FAILED, "could not start")]),
        ("ps", [(0, AppState.FAILED, "could not start")]),
    ]
    assert d.created is not None


def test_with_record_attaches_the_app_without_changing_the_shared_status(tmp_path: Path) -> None:
    assert with_record(None, tmp_path / "app.json") is None
    shared = DescribeAppResponse(app_id="a", state=AppState.PENDING, msg="m", created=1.0)
    assert with_record(shared, tmp_path / "app.json") == shared  # no record: the status as it is
    app = AppDef("a", [Role("w", entrypoint="echo", num_replicas=2), Role("ps", entrypoint="echo")])
    (tmp_path / "app.json").write_text(AppRecord("s", "sess", app).to_json())
    out = with_record(shared, tmp_path / "app.json")
    assert out is not None and out.app == app and (out.state, out.msg, out.created) == (AppState.PENDING, "m", 1.0)
    assert [rs.role for rs in out.roles_statuses] == ["w", "ps"]  # nothing made yet: roles from the record
    assert shared.roles_statuses == [] and shared.app is None
    running = DescribeAppResponse(app_id="a", state=AppState.RUNNING, roles_statuses=[RoleStatus("w")])
    out = with_record(running, tmp_path / "app.json")
    assert out is not None and [rs.role for rs in out.roles_statuses] == ["w"]  # the engine's view wins
