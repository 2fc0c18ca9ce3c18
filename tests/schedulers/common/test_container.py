"""The container kit's base (:class:`tsm.schedulers.common.container.ContainerScheduler`) on an engine of a
few lines (an in-memory table of apps, named a fake): what it answers from the engine, what from the store,
and what it asks the engine's seam to do."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

import pytest

from tsm.errors import NotSupportedError
from tsm.schedulers.api import DescribeAppResponse, Stream
from tsm.schedulers.common.container import ContainerScheduler, mark_cancelled
from tsm.schedulers.common.container_request import LifecycleFields, lifecycle_fields
from tsm.schedulers.common.lifecycle_opts import LifecycleOptions
from tsm.schedulers.common.record import AppRecord
from tsm.schedulers.common.status import AppStatusView
from tsm.schedulers.common.viewmodel import AppSummary
from tsm.specs.api import AppDef, AppDryRunInfo, AppState, ReplicaStatus, Role, RoleStatus
from tsm.specs.runopts import CfgVal


@dataclass
class FakeRequest(LifecycleFields):
    app_id: str
    roles: list[list[Any]]

    def to_json(self) -> str:
        return json.dumps(asdict(self))


@dataclass
class FakeView:
    app_id: str
    created: float | None
    state: AppState


@dataclass
class FakeEngine:
    """Apps by id, each with its state; counts the lists and looks the base asks for."""

    apps: dict[str, AppState] = field(default_factory=dict)
    lists: int = 0
    looks: list[str] = field(default_factory=list)
    cancels: list[str] = field(default_factory=list)


class FakeContainers(ContainerScheduler[FakeRequest, FakeView]):
    def __init__(self, engine: FakeEngine) -> None:
        super().__init__("fakecontainers", "test", in_process=True)
        self.engine = engine

    def _submit_dryrun(self, app: AppDef, cfg: Mapping[str, CfgVal]) -> AppDryRunInfo[FakeRequest]:
        return AppDryRunInfo(FakeRequest(app_id=f"{app.name}-1", roles=[[r.name, r.num_replicas] for r in app.roles]))

    def schedule(self, dryrun_info: AppDryRunInfo[FakeRequest]) -> str:
        req = dryrun_info.request
        app = dryrun_info.app or AppDef("x", [Role("w", "img", "echo")])
        self.app_dir(req.app_id).save_submission(req.to_json(), AppRecord(self.backend, "test", app))
        self.engine.apps[req.app_id] = AppState.RUNNING
        self._watcher.submitted(req.app_id)
        return req.app_id

    def _parse_request(self, text: str) -> FakeRequest:
        return FakeRequest(**json.loads(text))

    def _observe(self, app_id: str | None = None) -> dict[str, tuple[FakeView, Any]]:
        self.engine.lists += 1
        return {a: (FakeView(a, 1.0, s), None) for a, s in self.engine.apps.items() if app_id in (None, a)}

    def look(self, view: FakeView, mark: Any = None) -> DescribeAppResponse:
        self.engine.looks.append(view.app_id)
        return self._describe_view(view)

    def _app_status(self, view: FakeView) -> AppStatusView:
        replicas = [ReplicaStatus(0, view.state, "w", "host")]
        return AppStatusView(view.state, "", [RoleStatus("w", replicas)], 0, None)

    def _lines(self, app_id: str, role: str, k: int, streams: list[str], since: datetime | None,
               until: datetime | None, tail: bool) -> Iterator[str]:
        return iter([f"{role}/{k} {'+'.join(streams)}\n", "other\n"])

    def _log_streams(self, streams: Stream | None) -> list[str]:
        if streams == Stream.STDERR:
            raise NotSupportedError("one log only")
        return super()._log_streams(streams)

    def _cancel(self, app_id: str, current: DescribeAppResponse) -> None:
        self.engine.cancels.append(app_id)
        self.engine.apps.pop(app_id)
        self.app_dir(app_id).save_final(mark_cancelled(current), 1.0, 2.0)

    @contextlib.contextmanager
    def _removing(self, app_id: str) -> Iterator[bool]:
        yield self.engine.apps.pop(app_id, None) is not None

    def _new_view(self) -> Any:
        return _View(self)


class _View:
    def __init__(self, sched: FakeContainers) -> None:
        self.sched = sched

    def snapshot(self, app_ids: Sequence[str]) -> list[AppSummary]:
        from tsm.schedulers.common.viewmodel import view_of_describe

        live = self.sched.live_statuses()
        return [view_of_describe(d, "fake", name=a) for a in app_ids
                if (d := live.get(a) or self.sched.kept_status(a)) is not None]

    def close(self) -> None:
        pass


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine()


def submit(s: FakeContainers, name: str = "a") -> str:
    return s.schedule(s.submit_dryrun(AppDef(name, [Role("w", "img", "echo")]), {}))


def test_a_running_app_is_answered_by_a_look_at_the_engines_list(engine: FakeEngine) -> None:
    s = FakeContainers(engine)
    app_id = submit(s)
    desc = s.describe(app_id)
    assert desc is not None and desc.state == AppState.RUNNING and engine.looks == [app_id]
    assert s.describe("nope-1") is None  # not on the engine, nothing kept: unknown
    assert s.request(app_id) == FakeRequest(app_id=app_id, roles=[["w", 1]])
    assert s.request("nope-1") is None
    assert [r.app_id for r in s.list()] == [app_id]


def test_an_ended_app_is_answered_from_the_store_and_never_looked_at_again(engine: FakeEngine) -> None:
    s = FakeContainers(engine)
    app_id = submit(s)
    s.cancel(app_id)
    assert engine.cancels == [app_id]
    fresh = FakeContainers(engine)  # another process: only the store knows it
    desc = fresh.describe(app_id)
    assert desc is not None and desc.state == AppState.CANCELLED
    assert fresh.final_status(app_id) is not None and fresh.app_dir(app_id).final_times() == (1.0, 2.0)
    fresh.cancel(app_id)  # idempotent: an ended app is not stopped again
    assert engine.cancels == [app_id] and engine.looks == [app_id]


def test_an_app_whose_end_is_kept_is_skipped_by_the_snapshot(engine: FakeEngine) -> None:
    s = FakeContainers(engine)
    app_id = submit(s)
    s.app_dir(app_id).save_final(DescribeAppResponse(app_id=app_id, state=AppState.FAILED, msg="kept"))
    desc = s.describe(app_id)  # the engine still lists it (its objects are being removed): the store answers
    assert desc is not None and (desc.state, desc.msg) == (AppState.FAILED, "kept") and engine.looks == []


def test_remove_deletes_the_objects_and_the_app_directory(engine: FakeEngine) -> None:
    s = FakeContainers(engine)
    app_id = submit(s)
    assert s.remove(app_id) is True
    assert not s.app_dir(app_id).exists() and app_id not in engine.apps
    assert s.describe(app_id) is None and s.remove(app_id) is False


def test_log_iter_checks_the_target_then_reads_the_engines_lines(engine: FakeEngine) -> None:
    s = FakeContainers(engine)
    app_id = submit(s)
    assert list(s.log_iter(app_id, "w", 0, regex="^w")) == ["w/0 stdout+stderr\n"]
    with pytest.raises(Exception, match="'x'"):
        list(s.log_iter(app_id, "x", 0))
    with pytest.raises(NotSupportedError):
        s.log_iter(app_id, "w", 0, streams=Stream.STDERR)


def test_the_views_hook_is_made_once_and_closed(engine: FakeEngine) -> None:
    s = FakeContainers(engine)
    app_id = submit(s)
    (view,) = s.view_snapshot([app_id, "nope-1"])
    assert view.app_id == app_id and s.view_snapshot([app_id]) and s._view is not None
    s.close()
    assert s._view is None


def test_a_request_takes_the_lifecycle_fields_from_the_options() -> None:
    opts = LifecycleOptions(time_limit="1h", stall_timeout="15m", on_stall="fail", max_preemptions=5)
    req = FakeRequest(app_id="a-1", roles=[], **lifecycle_fields(opts))
    assert (req.time_limit, req.stall_timeout, req.on_stall, req.max_preemptions) == (3600.0, 900.0, "fail", 5)
    assert FakeRequest(**json.loads(req.to_json())) == req  # saved flat, read back whole
