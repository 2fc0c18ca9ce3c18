"""TorchX's runner face (``torchx.runner`` under the alias) on tsm's runner: TorchX's contract, tsm's history."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tsm.compat.torchx.runner.api import Runner, get_configured_trackers, get_runner
from tsm.compat.torchx.schedulers import get_default_scheduler_name, get_scheduler_factories
from tsm.compat.torchx.schedulers.local_scheduler import LocalScheduler
from tsm.history import History
from tsm.specs import AppDef, AppState, Resource, Role


def _app(entrypoint: str = "true") -> AppDef:
    return AppDef("face", [Role("face", image="", entrypoint=entrypoint, resource=Resource())])


def test_dryrun_writes_torchxs_variables_into_the_given_app(tsm_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHX_TRACKERS", "mine,yours")
    monkeypatch.setenv("TORCHX_TRACKER_MINE_CONFIG", "s3://cfg")
    assert get_configured_trackers() == {"mine": "s3://cfg", "yours": None}  # named, never loaded
    app = _app()
    with Runner("sess", {"local_cwd": get_scheduler_factories()["local_cwd"]}) as r:
        r.dryrun(app, "local_cwd", parent_run_id="p1")
    env = app.roles[0].env
    assert env["TORCHX_JOB_ID"] == "local_cwd://sess/${app_id}" and env["TORCHX_PARENT_RUN_ID"] == "p1"
    assert env["TORCHX_TRACKERS"] == "mine,yours" and env["TORCHX_TRACKER_MINE_CONFIG"] == "s3://cfg"
    assert not any(k.startswith("TSM_") for k in env)


def test_an_app_run_through_the_face_is_in_tsms_history(tsm_home: Path) -> None:
    with get_runner() as r:
        handle = r.run(_app(), "local_cwd")
        status = r.wait(handle, wait_interval=0.1)
        assert status is not None and status.state == AppState.SUCCEEDED
        assert r.describe(handle) is not None
    assert handle.startswith("local_cwd://torchx/")
    assert any(row.handle == handle for row in History().recent(10))


class OddIds(LocalScheduler):
    """A scheduler whose app ids are not handle parts (TorchX lets them through)."""

    def schedule(self, dryrun_info: Any) -> str:
        return "odd id/" + super().schedule(dryrun_info)

    def describe(self, app_id: str) -> Any:
        return super().describe(app_id.removeprefix("odd id/"))


def test_a_handle_tsm_cannot_name_is_kept_by_the_runner_only(tsm_home: Path) -> None:
    def factory(session_name: str, **kwargs: Any) -> OddIds:
        from tsm.compat.torchx.schedulers.local_scheduler import CWDImageProvider

        return OddIds(session_name, CWDImageProvider)

    with Runner("sess", {"odd": factory}) as r:
        handle = r.run(_app(), "odd")
        assert handle.startswith("odd://sess/odd id/")
        status = r.wait(handle, wait_interval=0.1)
        assert status is not None and status.state == AppState.SUCCEEDED
    assert all(row.handle != handle for row in History().recent(10))


def test_torchx_registry_and_default(monkeypatch: pytest.MonkeyPatch) -> None:
    names = list(get_scheduler_factories())
    assert names[:2] == ["local_docker", "local_cwd"] and get_default_scheduler_name() == "local_docker"
    assert isinstance(get_scheduler_factories()["local_cwd"]("s"), LocalScheduler)


def test_torchx_variables_are_offered_as_scheduler_params(tsm_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHX_CACHE_SIZE", "5")  # a param of TorchX's local scheduler, offered to every factory
    monkeypatch.setenv("TORCHX_JOB_ID", "x")  # TorchX's own variable: never a param
    seen: dict[str, Any] = {}

    def factory(session_name: str, **kwargs: Any) -> LocalScheduler:
        seen.update(kwargs)
        from tsm.compat.torchx.schedulers.local_scheduler import create_scheduler

        return create_scheduler(session_name)

    with Runner("s", {"f": factory}) as r:
        r.scheduler_run_opts("f")
    assert seen == {"cache_size": "5"}



def test_torchxs_in_process_local_scheduler_cannot_hold_an_app_and_says_so(tsm_home: Path) -> None:
    from tsm.errors import NotSupportedError

    with get_runner() as r:
        first = r.run(AppDef("gate", [Role("gate", image="", entrypoint="sleep", args=["60"], resource=Resource())]),
                      "local_cwd")
        try:  # its apps live in this process: no helper could submit one later
            with pytest.raises(NotSupportedError, match="local_cwd scheduler cannot wait for"):
                r.dryrun(_app(), "local_cwd", after=[first])
        finally:
            r.cancel(first)
