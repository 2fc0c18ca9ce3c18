"""AppRecord: the submitted app round-trips through its JSON; anything else reads as None."""

from __future__ import annotations

from pathlib import Path

from tsm.schedulers.common.record import AppRecord, role_replicas
from tsm.specs.api import AppDef, Role


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
