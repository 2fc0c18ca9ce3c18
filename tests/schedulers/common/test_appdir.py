"""AppDir and the kit's client base: private atomic files, the final status with its times, HTTP statuses kept."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from tsm.errors import SchedulerError, TsmError
from tsm.schedulers.api import DescribeAppResponse
from tsm.schedulers.common.appdir import (
    PREEMPTIONS,
    REQUEST,
    AppDir,
    app_dirs,
    list_rows,
    preemption_events,
    record_preemption,
)
from tsm.schedulers.common.errors import ApiError, ClientBase, is_status
from tsm.schedulers.common.owner import label_safe
from tsm.schedulers.common.polling import poll_until
from tsm.schedulers.common.record import AppRecord
from tsm.specs.api import AppDef, AppState, Role


def test_every_file_and_folder_is_private_and_written_whole(tmp_path: Path) -> None:
    tmp_path.chmod(0o755)
    old = os.umask(0)
    try:
        d = AppDir(tmp_path / "docker", "app-1")
        d.save_submission('{"env": "secret"}', AppRecord("docker", "s", AppDef("a", [Role("r", "echo")])))
        d.write("logs/c/attempt-0/stdout", iter([b"a\n", b"b\n"]))
        d.save_final(DescribeAppResponse(app_id="app-1", state=AppState.SUCCEEDED), started=1.0, ended=2.0)
        with d.cancel_marker():
            assert d.cancelling
    finally:
        os.umask(old)
    assert not d.cancelling
    paths = list((tmp_path / "docker").rglob("*")) + [tmp_path / "docker"]
    assert all(stat.S_IMODE(p.stat().st_mode) == (0o700 if p.is_dir() else 0o600) for p in paths)
    assert not [p for p in paths if p.name.endswith(".tmp")]
    assert (d.path / "logs/c/attempt-0/stdout").read_bytes() == b"a\nb\n"
    assert d.final() is not None and d.final_times() == (1.0, 2.0)
    assert d.record() is not None and [a.app_id for a in app_dirs(tmp_path / "docker")] == ["app-1"]
    d.set_attempts({"r": 2})
    assert d.attempts() == {"r": 2} and d.remove() and not d.exists()


def test_a_failed_stream_leaves_the_old_file(tmp_path: Path) -> None:
    d = AppDir(tmp_path, "a")
    d.write("f", "old")

    def broken():  # type: ignore[no-untyped-def]
        yield b"new"
        raise OSError("engine went away")

    with pytest.raises(OSError):
        d.write("f", broken())
    assert d.read("f") == "old" and [p.name for p in d.path.iterdir()] == ["f"]
    with pytest.raises(ValueError):
        AppDir(tmp_path, "../x")


def test_the_client_base_counts_and_keeps_the_http_status() -> None:
    class Client(ClientBase):
        def translate(self, what: str, e: BaseException) -> TsmError | None:
            return ApiError(f"{what} failed", 404) if isinstance(e, KeyError) else None

    c = Client()
    with pytest.raises(ApiError) as err, c.call("get"):
        raise KeyError("x")
    assert err.value.status == 404 and is_status(err.value, 404, 410) and isinstance(err.value, SchedulerError)
    with pytest.raises(ZeroDivisionError), c.call("get"):
        _ = 1 / 0
    assert c.calls["get"] == 2 and not is_status(SchedulerError("x"), 404)


def test_owner_labels_and_poll_until() -> None:
    assert label_safe("alice") == "alice" and label_safe("Al Ice") != label_safe("Al-Ice")
    assert len(label_safe("x" * 100)) <= 63 and label_safe("-") != "-"
    seen = iter([None, None, 3])
    assert poll_until(lambda: next(seen), 10, initial=0.001) == 3
    assert poll_until(lambda: None, 0.05, initial=0.01) is None


def test_preemption_restarts_are_recorded_once_each_with_their_roles(tmp_path: Path) -> None:
    d = AppDir(tmp_path, "a")
    assert preemption_events(d) == []
    record_preemption(d, 1, ["w", "ps"])
    record_preemption(d, 1, ["ps", "w"])  # a second process deciding the same restart
    record_preemption(d, 1, ["x"])  # another role's restart into the same try is another restart
    assert preemption_events(d) == [(1, ("ps", "w")), (1, ("x",))]
    d.write(PREEMPTIONS, "{not json")
    assert preemption_events(d) == []


def test_a_listed_app_whose_end_is_kept_is_listed_as_it_ended(tmp_path: Path) -> None:
    """A list of the engine taken while another process finished an app says it is "being stopped"; once its
    end is kept, ``list()`` gives the end (as ``describe`` does), not that older list's word."""
    AppDir(tmp_path, "a-1").save_final(DescribeAppResponse(app_id="a-1", state=AppState.FAILED, created=5.0))
    AppDir(tmp_path, "b-2").write(REQUEST, "{}")
    live = {
        "a-1": DescribeAppResponse(app_id="a-1", state=AppState.RUNNING, msg="being stopped", created=5.0),
        "b-2": DescribeAppResponse(app_id="b-2", state=AppState.RUNNING, created=6.0),
        "c-3": DescribeAppResponse(app_id="c-3", state=AppState.RUNNING, created=7.0),  # not this home's
    }
    rows = {r.app_id: (r.state, r.created) for r in list_rows(tmp_path, live)}
    assert rows == {"a-1": (AppState.FAILED, 5.0), "b-2": (AppState.RUNNING, 6.0), "c-3": (AppState.RUNNING, 7.0)}
