"""The runner rows of docs/torchx-compat.md marked "same": TorchX 0.7 code runs after changing its imports.

Real apps run on the real local scheduler; where a test needs a scheduler that records what the runner
gave it (factory params, workspaces, resources), it injects ``Recorder``, a small in-memory scheduler,
through ``Runner(name, scheduler_factories)`` exactly as a TorchX user injects one.
"""

from __future__ import annotations

import inspect
import logging
import sys
import textwrap
import uuid
from collections.abc import Iterator, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tsm.errors import (
    InvalidAppError,
    InvalidRunOptionError,
    MalformedAppHandleError,
    NotSupportedError,
    UnknownAppError,
    UnknownSchedulerError,
)
from tsm.runner import events
from tsm.runner.api import Runner, get_runner, scheduler_params_from_env
from tsm.schedulers.api import DescribeAppResponse, ListAppResponse, Scheduler, SizedPlacement, Stream
from tsm.specs import AppDef, AppDryRunInfo, AppState, Resource, Role, runopts
from tsm.workspace.api import WorkspaceBuilder

HANG = 120  # seconds: a hang guard, never a performance claim


class Recorder(Scheduler[list[str]], SizedPlacement):
    """An in-memory scheduler that remembers its factory params and what it was asked to build.

    Declares ``SizedPlacement``: the runner refuses a role without a resource for it.
    """

    made: list[Recorder] = []

    def __init__(self, session_name: str, **params: Any) -> None:
        super().__init__("rec", session_name)
        self.params = params
        self.apps: dict[str, DescribeAppResponse] = {}
        self.workspaces: list[tuple[str, str]] = []
        self.cancelled: list[str] = []
        self.closed = False
        Recorder.made.append(self)

    def run_opts(self) -> runopts:
        o = runopts()
        o.add("queue", str, "where to run", default="q0")
        return o

    def _submit_dryrun(self, app: AppDef, cfg: Mapping[str, Any]) -> AppDryRunInfo[list[str]]:
        return AppDryRunInfo([f"{k}={v}" for k, v in sorted(app.roles[0].env.items())], fmt=" ".join)

    def schedule(self, dryrun_info: AppDryRunInfo[list[str]]) -> str:
        app_id = f"rec-{len(self.apps)}"
        self.apps[app_id] = DescribeAppResponse(app_id, AppState.RUNNING, app=dryrun_info.app)
        return app_id

    def describe(self, app_id: str) -> DescribeAppResponse | None:
        return self.apps.get(app_id)

    def list(self) -> list[ListAppResponse]:
        return [ListAppResponse(a.app_id, a.state) for a in self.apps.values()]

    def log_iter(self, app_id: str, role_name: str, k: int = 0, regex: str | None = None,
                 since: datetime | None = None, until: datetime | None = None, should_tail: bool = False,
                 streams: Stream | None = None) -> Iterator[str]:
        return iter(["line\n"])

    def cancel(self, app_id: str) -> None:
        self.cancelled.append(app_id)
        if app_id in self.apps:
            self.apps[app_id].state = AppState.CANCELLED

    def close(self) -> None:
        self.closed = True


class WorkspaceRecorder(Recorder, WorkspaceBuilder[None]):
    """A Recorder that builds workspaces itself (it declares ``WorkspaceBuilder``, TorchX's WorkspaceMixin shape)."""

    def build_workspace_and_update_role(self, role: Role, workspace: str, cfg: Mapping[str, Any]) -> None:
        self.workspaces.append((role.name, workspace))
        role.image = f"built:{workspace}"

    def dryrun_push_images(self, app: AppDef, cfg: Mapping[str, Any]) -> None:
        return None

    def push_images(self, images_to_push: None) -> None:
        pass


def sized_app(name: str = "app", **env: str) -> AppDef:
    return AppDef(name, [Role("r", entrypoint="true", env=env, resource=Resource(cpu=1, gpu=0, memMB=64))])


@pytest.fixture(autouse=True)
def workdir(tsm_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("HOME", str(tmp_path))
    Recorder.made.clear()
    yield work


def recording_runner(**kw: Any) -> Runner:
    return Runner("sess", {"rec": Recorder, "wsrec": WorkspaceRecorder}, **kw)


# -- construction ------------------------------------------------------------------------------------------
def test_runner_signature_is_torchxs() -> None:
    params = list(inspect.signature(Runner).parameters)
    assert params[:4] == ["name", "scheduler_factories", "component_defaults", "scheduler_params"]
    get = inspect.signature(get_runner).parameters
    assert list(get)[:2] == ["name", "component_defaults"] and get["name"].default is None
    assert get["scheduler_params"].kind is inspect.Parameter.VAR_KEYWORD


def test_unknown_keywords_raise_instead_of_being_swallowed() -> None:
    with pytest.raises(TypeError):
        Runner("s", {}, bogus=1)  # type: ignore[call-arg]


def test_injected_factories_are_the_only_backends() -> None:
    with recording_runner() as r:
        assert r.scheduler_backends() == ["rec", "wsrec"]
        with pytest.raises(UnknownSchedulerError, match="did you mean 'rec'"):
            r.dryrun(sized_app(), "recc")
        with pytest.raises(UnknownSchedulerError):
            r.dryrun(sized_app(), "local")  # registered, but not given to this runner
    assert "local" in get_runner().scheduler_backends()


def test_get_runner_defaults_the_session_name() -> None:
    with get_runner() as r:
        assert r.name() == r.session_name == "default"
    with get_runner(None) as r:
        assert r.name() == "default"
    with get_runner("mine") as r:
        assert r.name() == "mine"
        assert "mine" in repr(r)


def test_scheduler_params_reach_every_factory_and_explicit_beats_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TSM_CACHE_SIZE", "7")
    monkeypatch.setenv("TSM_REGION", "env-region")
    with Runner("s", {"rec": Recorder}, scheduler_params={"region": "eu"}) as r:
        r.dryrun(sized_app(), "rec")
    (made,) = Recorder.made
    assert made.params["cache_size"] == "7"  # TSM_CACHE_SIZE, as TorchX reads TORCHX_CACHE_SIZE
    assert made.params["region"] == "eu"
    assert "home" not in made.params  # TSM_HOME is tsm's own setting, never a scheduler param


def test_params_from_env_skip_tsms_own_variables() -> None:
    env = {"TSM_HOME": "/h", "TSM_APP_ID": "x", "TSM_PORT_HTTP": "1", "TSM_TRACKER_X_CONFIG": "c", "TSM_FOO": "bar",
           "OTHER": "1", "TSM_": "z", "TSM_K8S_CACHE": "/c", "TSM_DOCKER_CACHE": "/d", "TSM_TEST_IMAGE_TAG": "t"}
    assert scheduler_params_from_env(env) == {"foo": "bar"}


def test_get_runner_passes_flat_scheduler_params_and_a_builtin_that_takes_none_says_so() -> None:
    with get_runner(cache_size=3) as r, pytest.raises(InvalidRunOptionError, match="cache_size"):
        r.dryrun(sized_app(), "local")


def test_component_defaults_of_get_runner_are_used(workdir: Path) -> None:
    with get_runner(component_defaults={"utils.echo": {"msg": "from defaults"}}) as r:
        info = r.dryrun_component("utils.echo", [], "local")
        assert info.app is not None and info.app.roles[0].args == ["from defaults"]
        info = r.dryrun_component("utils.echo", ["--msg", "given"], "local")
        assert info.app is not None and info.app.roles[0].args == ["given"]


# -- the watch API: None for apps the scheduler does not know ----------------------------------------------
def test_unknown_app_is_none_and_cancel_a_no_op() -> None:
    with recording_runner() as r:
        handle = "rec://sess/rec-404"
        assert r.status(handle) is None
        assert r.wait(handle, wait_interval=0.01) is None
        assert r.describe(handle) is None
        r.cancel(handle)
        assert Recorder.made[0].cancelled == []  # nothing was asked of the scheduler
        with pytest.raises(UnknownAppError) as ei:
            list(r.log_lines(handle, "r"))
        assert ei.value.handle == handle and ei.value.scheduler == "rec"


def test_unknown_scheduler_and_malformed_handles_still_raise() -> None:
    with recording_runner() as r:
        for call in (r.status, r.wait, r.describe, r.cancel):
            with pytest.raises(UnknownSchedulerError):
                call("nosuch://sess/x")
            with pytest.raises(MalformedAppHandleError):
                call("not a handle")


def test_cancel_only_asks_for_running_apps() -> None:
    with recording_runner() as r:
        handle = r.run(sized_app(), "rec")
        r.cancel(handle)
        r.cancel(handle)  # already CANCELLED: not asked again
        assert Recorder.made[0].cancelled == ["rec-0"]
        status = r.status(handle)
        assert status is not None and status.state == AppState.CANCELLED and status.is_terminal()


def test_stop_is_a_deprecated_cancel() -> None:
    with recording_runner() as r:
        handle = r.run(sized_app(), "rec")
        with pytest.warns(PendingDeprecationWarning):
            r.stop(handle)
        assert Recorder.made[0].cancelled == ["rec-0"]


def test_context_manager_closes_schedulers_and_close_is_idempotent() -> None:
    with recording_runner() as r:
        r.dryrun(sized_app(), "rec")
    assert Recorder.made[0].closed
    r.close()


def test_wait_takes_wait_interval_and_returns_the_terminal_status() -> None:
    with get_runner("waiter") as r:
        handle = r.run(AppDef("w", [Role("w", entrypoint="sh", args=["-c", "sleep 0.2"])]), "local")
        status = r.wait(handle, wait_interval=0.5)
        assert status is not None and status.state == AppState.SUCCEEDED
        status = r.wait(handle, 1)  # positional, as TorchX users write it
        assert status is not None and status.is_terminal()
        with pytest.raises(ValueError, match="wait_interval"):
            r.wait(handle, wait_interval=0)


def test_list_of_one_scheduler_fills_handles() -> None:
    with recording_runner() as r:
        handle = r.run(sized_app(), "rec")
        (row,) = r.list("rec")
        assert row.app_handle == handle


# -- launch: workspace, parent_run_id, the replica environment ---------------------------------------------
def test_workspace_is_built_by_a_scheduler_that_can_and_refused_by_one_that_cannot() -> None:
    with recording_runner() as r:
        info = r.dryrun(sized_app(), "wsrec", workspace="/src/project")
        assert info.app is not None and info.app.roles[0].image == "built:/src/project"
        assert Recorder.made[0].workspaces == [("r", "/src/project")]
        with pytest.raises(NotSupportedError, match="workspace") as ei:
            r.run(sized_app(), "rec", workspace="/src/project")
        assert isinstance(ei.value, NotImplementedError) and ei.value.scheduler == "rec"
        assert r.run(sized_app(), "rec", workspace=None).startswith("rec://sess/")


def test_parent_run_id_and_job_id_reach_the_replica_env() -> None:
    with recording_runner() as r:
        info = r.dryrun(sized_app(), "rec", parent_run_id="run-42")
        env = info.app.roles[0].env if info.app else {}
        assert env["TSM_PARENT_RUN_ID"] == env["TORCHX_PARENT_RUN_ID"] == "run-42"
        assert env["TORCHX_JOB_ID"] == env["TSM_APP_HANDLE"] == "rec://sess/${app_id}"
        for call in (r.run, r.dryrun):
            assert "parent_run_id" in inspect.signature(call).parameters
        for call in (r.run_component, r.dryrun_component):
            assert {"workspace", "parent_run_id"} <= set(inspect.signature(call).parameters)


def test_torchx_env_run_option_turns_torchx_names_off() -> None:
    with recording_runner() as r:
        assert "torchx_env" in r.scheduler_run_opts("rec")
        info = r.dryrun(sized_app(), "rec", {"torchx_env": False}, parent_run_id="p")
        env = info.app.roles[0].env if info.app else {}
        assert "TORCHX_JOB_ID" not in env and "TORCHX_PARENT_RUN_ID" not in env
        assert env["TSM_APP_HANDLE"] and env["TSM_PARENT_RUN_ID"] == "p"
        assert "torchx_env" not in info.cfg  # the runner's option, not the scheduler's


def test_a_real_replica_reads_torchx_job_id() -> None:
    with get_runner("jobid") as r:
        app = AppDef("jid", [Role("jid", entrypoint="sh", args=["-c", 'echo "$TORCHX_JOB_ID"'])])
        handle = r.run(app, "local")
        assert r.wait(handle) is not None
        assert list(r.log_lines(handle, "jid")) == [handle + "\n"]


@pytest.mark.parametrize("torchx_env", [True, False])
def test_a_real_replica_reads_torchx_rank0_host_beside_ours(torchx_env: bool) -> None:
    with get_runner("rank0") as r:
        script = 'echo "${TSM_RANK0_HOST}|${TORCHX_RANK0_HOST-unset}"'
        app = AppDef("r0", [Role("r0", entrypoint="sh", args=["-c", script])])
        handle = r.run(app, "local", {"torchx_env": torchx_env})
        assert r.wait(handle) is not None
        assert list(r.log_lines(handle, "r0")) == ["localhost|localhost\n" if torchx_env else "localhost|unset\n"]


def test_slurm_script_exports_torchx_rank0_host_only_with_torchx_names() -> None:
    with get_runner() as r:
        app = AppDef("r0", [Role("r0", entrypoint="true", resource=Resource(cpu=1, gpu=0, memMB=100))])
        on = str(r.dryrun(app, "slurm"))
        off = str(r.dryrun(app, "slurm", {"torchx_env": False}))
    assert 'export TORCHX_RANK0_HOST="$TSM_RANK0_HOST"' in on
    assert "TORCHX_RANK0_HOST" not in off


def test_role_without_resource_is_refused_where_size_matters_not_on_local() -> None:
    with recording_runner() as r, pytest.raises(InvalidAppError, match="no resource given"):
        r.dryrun(AppDef("n", [Role("r", entrypoint="true")]), "rec")
    with get_runner() as r:
        info = r.dryrun(AppDef("n", [Role("r", entrypoint="true")]), "local")
        assert info.scheduler == "local"


def test_cfg_from_str_types_values() -> None:
    with recording_runner() as r:
        assert r.cfg_from_str("rec", "queue=a", "torchx_env=false") == {"queue": "a", "torchx_env": False}


# -- events ------------------------------------------------------------------------------------------------
def test_one_event_per_call_to_the_logger(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="tsm.events"), recording_runner() as r:
        handle = r.run(sized_app(), "rec", {"queue": "q9"})
        r.status(handle)
        r.status("rec://sess/rec-404")
        with pytest.raises(UnknownSchedulerError):
            r.status("nosuch://sess/x")
    evs = [rec.tsm_event for rec in caplog.records if rec.name == "tsm.events"]
    assert [e.api for e in evs] == ["dryrun", "schedule", "run", "status", "status"]
    run = evs[2]
    assert (run.session, run.scheduler, run.app_id) == ("sess", "rec", "rec-0")
    assert run.runcfg == '{"queue": "q9"}' and run.wall_time_usec >= 0 and run.exception_type is None
    assert evs[1].app_id == "rec-0"


def test_event_records_the_exception_and_sinks_see_every_event() -> None:
    seen: list[events.TsmEvent] = []
    events.set_sinks([seen.append])
    try:
        with recording_runner() as r, pytest.raises(InvalidAppError):
            r.dryrun(AppDef("bad name", [Role("r", entrypoint="true")]), "rec")
    finally:
        events.set_sinks(None)
    (ev,) = seen
    assert ev.api == "dryrun" and ev.exception_type == "InvalidAppError" and "bad name" in (ev.exception_message or "")


def test_a_broken_sink_never_breaks_the_call(caplog: pytest.LogCaptureFixture) -> None:
    def broken(ev: events.TsmEvent) -> None:
        raise RuntimeError("sink down")

    events.set_sinks([broken])
    try:
        with recording_runner() as r:
            assert r.run(sized_app(), "rec").startswith("rec://")
    finally:
        events.set_sinks(None)
    assert "sink down" in caplog.text


def test_no_event_is_built_when_nothing_observes() -> None:
    events.set_sinks([])
    try:
        assert not events.enabled()
        with events.log_event("status", session="s") as ctx:
            assert ctx.event is None
    finally:
        events.set_sinks(None)


def test_entry_point_sinks_are_loaded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module = f"tsm_test_sink_{uuid.uuid4().hex[:8]}"
    site = tmp_path / "site"
    site.mkdir()
    (site / f"{module}.py").write_text(textwrap.dedent("""
        SEEN = []
        def sink(event):
            SEEN.append(event.api)
    """))
    info = site / f"{module}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[tsm.event_handlers]\nrec = {module}:sink\n")
    monkeypatch.syspath_prepend(str(site))
    events.set_sinks(None)
    try:
        with recording_runner() as r:
            r.status("rec://sess/none")
        import importlib

        assert importlib.import_module(module).SEEN == ["status"]
    finally:
        events.set_sinks(None)


def test_scheduler_factory_protocol_and_default_name() -> None:
    import tsm.schedulers as registry

    factories = registry.get_scheduler_factories()
    assert {"local", "local_cwd", "slurm"} <= set(factories)
    factory: registry.SchedulerFactory = factories["local"]
    sched = factory("s")
    try:
        assert isinstance(sched, Scheduler)
    finally:
        sched.close()
    assert registry.get_default_scheduler_name() == "local"
    assert set(inspect.signature(registry.SchedulerFactory.__call__).parameters) == {"self", "session_name", "kwargs"}


def test_removing_a_running_app_is_refused_with_app_still_running_error() -> None:
    from tsm.errors import AppStillRunningError

    with recording_runner() as r:
        handle = r.run(sized_app(), "rec")
        with pytest.raises(AppStillRunningError, match="cancel it first") as ei:
            r.remove([handle])
        assert ei.value.handle == handle and ei.value.scheduler == "rec"
        r.cancel(handle)
        assert r.remove([handle]) == [handle]  # ended: forgotten from the history
        assert handle not in [a.app_handle for a in r.list()]


def test_check_cfg_is_the_strict_form_the_command_line_uses() -> None:
    with recording_runner() as r:
        r.check_cfg("rec", {"queue": "a", "torchx_env": False})
        r.check_cfg("rec", None)
        with pytest.raises(InvalidRunOptionError, match="unknown run option 'queu' \\(did you mean 'queue'\\?\\)"):
            r.check_cfg("rec", {"queu": "a"})


def test_workspace_on_local_runs_the_app_in_a_snapshot(tmp_path: Path) -> None:
    ws = tmp_path / "project"
    ws.mkdir()
    (ws / "main.py").write_text("import os\nprint(os.getcwd() != os.environ['WS'], open('data.txt').read())\n")
    (ws / "data.txt").write_text("v1")
    app = AppDef("wsrun", [Role("main", entrypoint=sys.executable, args=["main.py"], env={"WS": str(ws)})])
    with get_runner("wsrunner") as r:
        handle = r.run(app, "local", workspace=str(ws))
        (ws / "data.txt").write_text("edited after launch")
        status = r.wait(handle)
        assert status is not None and status.state == AppState.SUCCEEDED
        assert list(r.log_lines(handle, "main")) == ["True v1\n"]  # ran in the snapshot, not the live tree
