"""Code written for TorchX's Scheduler and Runner works on tsm unchanged: both spellings of the scheduler hooks,
lazy plugins, the Runner attributes subclasses use, TorchX's ``log_event``, and one rule for factory keywords."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tsm.errors import InvalidRunOptionError
from tsm.runner import events
from tsm.runner.api import Runner, get_runner
from tsm.schedulers.api import DescribeAppResponse, EventWait, ListAppResponse, Scheduler, Stream
from tsm.specs import AppDef, AppDryRunInfo, AppState, Resource, Role, runopts


class TorchXStyle(Scheduler[str]):
    """Written as TorchX asks: ``_run_opts``, ``_cancel_existing`` and the 3-argument ``_validate``."""

    def __init__(self, session_name: str, **kwargs: Any) -> None:
        super().__init__("txs", session_name)
        self.apps: dict[str, DescribeAppResponse] = {}
        self.validated: list[tuple[str, str, dict[str, Any]]] = []
        self.cancelled: list[str] = []

    def _run_opts(self) -> runopts:
        opts = runopts()
        opts.add("queue", str, "where to run", default="q0")
        return opts

    def _validate(self, app: AppDef, scheduler: str, cfg: Mapping[str, Any]) -> None:  # type: ignore[override]
        self.validated.append((app.name, scheduler, dict(cfg)))

    def _submit_dryrun(self, app: AppDef, cfg: Mapping[str, Any]) -> AppDryRunInfo[str]:
        return AppDryRunInfo(f"run {app.name} on {cfg['queue']}", fmt=str)

    def schedule(self, dryrun_info: AppDryRunInfo[str]) -> str:
        app_id = f"tx-{len(self.apps)}"
        self.apps[app_id] = DescribeAppResponse(app_id, AppState.RUNNING)
        return app_id

    def describe(self, app_id: str) -> DescribeAppResponse | None:
        return self.apps.get(app_id)

    def list(self) -> list[ListAppResponse]:
        return [ListAppResponse(a.app_id, a.state) for a in self.apps.values()]

    def log_iter(self, app_id: str, role_name: str, k: int = 0, regex: str | None = None,
                 since: datetime | None = None, until: datetime | None = None, should_tail: bool = False,
                 streams: Stream | None = None) -> Iterator[str]:
        return iter([])

    def _cancel_existing(self, app_id: str) -> None:
        self.cancelled.append(app_id)
        self.apps[app_id].state = AppState.CANCELLED


def _app(name: str = "tx") -> AppDef:
    return AppDef(name, [Role("r", entrypoint="true", resource=Resource(cpu=1, gpu=0, memMB=64))])


def test_a_torchx_style_scheduler_can_be_made_and_used_directly() -> None:
    s = TorchXStyle("sess")
    assert "queue" in s.run_opts()
    app_id = s.submit(_app(), {"queue": "q1"}, workspace=None)
    assert s.validated == [("tx", "txs", {"queue": "q1"})]  # TorchX's call: (app, scheduler, cfg)
    s.cancel(app_id)
    s.cancel("tx-404")  # unknown: _cancel_existing is not called
    assert s.cancelled == [app_id]


def _wrapped(fn: Any) -> Any:
    """A decorator written with functools.wraps, as tools put around their hooks (logging, metrics)."""
    import functools

    @functools.wraps(fn)
    def inner(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    return inner


def test_torchx_validate_may_call_super_and_may_be_decorated() -> None:
    class CallsSuper(TorchXStyle):
        @_wrapped
        def _validate(self, app: AppDef, scheduler: str, cfg: Mapping[str, Any]) -> None:  # type: ignore[override]
            Scheduler._validate(self, app, scheduler, cfg)  # type: ignore[call-arg,arg-type]  # the base takes it
            super()._validate(app, scheduler, cfg)  # TorchX's idiom

    s = CallsSuper("sess")
    s.submit_dryrun(_app(), {"queue": "q3"})
    assert s.validated == [("tx", "txs", {"queue": "q3"})]


def test_a_torchx_style_scheduler_through_the_runner() -> None:
    with Runner("sess", {"txs": TorchXStyle}) as r:
        handle = r.run(_app(), "txs", {"queue": "q2"})
        assert str(r.dryrun(_app("again"), "txs")).startswith("run again on q0")
        r.cancel(handle)
        status = r.status(handle)
        assert status is not None and status.state == AppState.CANCELLED
        assert r.scheduler_run_opts("txs").get("queue") is not None


def test_a_scheduler_implementing_neither_spelling_is_refused_with_a_type_error() -> None:
    class NoOptions(TorchXStyle):
        _run_opts = Scheduler._run_opts  # type: ignore[assignment]

    assert len(NoOptions("s").run_opts()) == 0  # no run options is a valid choice, as in TorchX

    class NoCancel(TorchXStyle):
        _cancel_existing = Scheduler._cancel_existing  # type: ignore[assignment]

    with pytest.raises(TypeError, match="cancel"):
        NoCancel("s")


class PollRecorder(TorchXStyle):
    """Records the poll interval the runner passes to ``wait``."""

    def wait(self, app_id: str, timeout: float | None = None,
             poll_interval: float | None = None) -> DescribeAppResponse | None:
        self.intervals = [*getattr(self, "intervals", []), poll_interval]
        return self.describe(app_id)


class EventRecorder(PollRecorder, EventWait):
    """Declares an event-driven wait: the runner passes no interval."""


def test_wait_interval_reaches_a_polling_scheduler_and_not_an_event_driven_one() -> None:
    with Runner("sess", {"poll": PollRecorder, "event": EventRecorder}) as r:
        r.wait(r.run(_app(), "poll"), wait_interval=0.25)
        r.wait(r.run(_app(), "event"), wait_interval=0.25)
        assert r.scheduler("poll").intervals == [0.25]  # type: ignore[attr-defined]
        assert r.scheduler("event").intervals == [None]  # type: ignore[attr-defined]


def test_base_wait_polls_with_the_interval_as_its_longest_pause() -> None:
    s = TorchXStyle("s")
    app_id = s.submit(_app())
    looks: list[int] = []
    real = s.describe

    def describe(a: str) -> DescribeAppResponse | None:
        looks.append(1)
        if len(looks) == 3:
            s.apps[a].state = AppState.SUCCEEDED
        return real(a)

    s.describe = describe  # type: ignore[method-assign]
    desc = s.wait(app_id, timeout=30, poll_interval=0.01)
    assert desc is not None and desc.state == AppState.SUCCEEDED and len(looks) == 3


class MyRunner(Runner):
    """A Runner subclass as TorchX tools write them: it reads TorchX's private attributes."""

    def summary(self) -> dict[str, Any]:
        return {
            "name": self._name,
            "factories": sorted(self._scheduler_factories),
            "params": dict(self._scheduler_params),
            "instances": sorted(self._scheduler_instances),
            "apps": {h: a.name for h, a in self._apps.items()},
        }


def test_runner_subclass_sees_torchxs_attributes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TSM_FROM_ENV", "1")
    with MyRunner("sess", {"txs": TorchXStyle}, scheduler_params={"given": 2}) as r:
        assert r.summary() == {"name": "sess", "factories": ["txs"], "params": {"from_env": "1", "given": 2},
                               "instances": [], "apps": {}}
        handle = r.run(_app("one"), "txs")
        after = r.summary()
        assert after["instances"] == ["txs"] and after["apps"] == {handle: "one"}
        assert r._scheduler("txs") is r.scheduler("txs")  # TorchX's private name is the public method
    with MyRunner("s2", None) as reg:
        assert {"local", "slurm"} <= set(reg.summary()["factories"])  # the registry, as a mapping


def test_factory_rule_through_the_runner(monkeypatch: pytest.MonkeyPatch) -> None:
    with get_runner(bogus_param=1) as r, pytest.raises(InvalidRunOptionError, match="'bogus_param'"):
        r.scheduler("local")
    monkeypatch.setenv("TSM_BOGUS_PARAM", "1")  # only offered by the environment: a backend may decline it
    with get_runner() as r:
        assert r.scheduler("local").backend == "local"


def test_log_event_takes_torchxs_keywords_and_exposes_the_event() -> None:
    seen: list[events.TsmEvent] = []
    events.set_sinks([seen.append])
    try:
        with events.log_event(api="run", scheduler="s", app_id="a", workspace="w") as ctx:
            ctx._torchx_event.app_image = "img:1"
        with pytest.raises(ValueError), events.log_event("describe", "s", session="me"):
            raise ValueError("no")
    finally:
        events.set_sinks(None)
    first, second = seen
    assert (first.api, first.scheduler, first.app_id, first.workspace, first.app_image) == ("run", "s", "a", "w", "img:1")
    assert (second.api, second.session, second.exception_type) == ("describe", "me", "ValueError")


def test_delete_cancels_and_forgets() -> None:
    with Runner("sess", {"txs": TorchXStyle}) as r:
        handle = r.run(_app(), "txs")
        r.delete(handle)
        assert r.scheduler("txs").cancelled == ["tx-0"]  # type: ignore[attr-defined]
        assert handle not in [a.app_handle for a in r.list()] and handle not in r._apps
        r.delete(handle)  # again: nothing to do


# -- plugins load lazily ---------------------------------------------------------------------------------
def _plugin_site(tmp_path: Path) -> Path:
    """A site with two scheduler plugins: ``good`` and ``broken`` (its module raises on import)."""
    site = tmp_path / "site"
    info = site / "plugs-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: plugs\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[torchx.schedulers]\ngood = plug_good:create_scheduler\nbroken = plug_broken:create_scheduler\n")
    (site / "plug_broken.py").write_text("from torchx.schedulers.api import NoSuchThing  # a TorchX name tsm lacks\n")
    (site / "plug_good.py").write_text(textwrap.dedent("""
        import sys
        sys.modules[__name__].IMPORTED = True
        def create_scheduler(session_name, **kwargs):
            from tsm.schedulers.local import create_scheduler as local
            return local(session_name)
    """))
    return site


def test_plugins_are_imported_only_when_used_and_a_broken_one_is_reported_then(tmp_path: Path) -> None:
    site = _plugin_site(tmp_path)
    code = textwrap.dedent(f"""
        import json, sys
        sys.path.insert(0, {str(site)!r})
        import tsm.schedulers as reg
        from tsm.runner.api import get_runner
        factories = reg.get_scheduler_factories()
        runner = get_runner()
        out = {{"names": sorted(factories), "imported_at_start": [m for m in ("plug_good", "plug_broken") if m in sys.modules]}}
        try:
            runner.scheduler("broken")
        except reg.SchedulerPluginError as e:
            out["error"] = [type(e).__name__, e.plugin, str(e)]
        out["good"] = runner.scheduler("good").backend
        out["load_errors"] = reg.load_errors()
        print(json.dumps(out))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    import json

    out = json.loads(proc.stdout)
    assert {"good", "broken", "local"} <= set(out["names"])
    assert out["imported_at_start"] == []  # neither get_scheduler_factories() nor get_runner() imported them
    kind, plugin, message = out["error"]
    assert (kind, plugin) == ("SchedulerPluginError", "broken")
    assert "plug_broken:create_scheduler" in message and "ModuleNotFoundError" in message
    assert out["good"] == "local"
    assert list(out["load_errors"]) == ["broken"]


def test_a_broken_plugin_is_named_in_the_runopts_listing_and_the_rest_still_list(tmp_path: Path) -> None:
    import os

    site = _plugin_site(tmp_path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "tsm.cli.main", "runopts"], capture_output=True, text=True,
                          timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "broken:\n    (unavailable: scheduler plugin 'broken' (plug_broken:create_scheduler)" in proc.stdout
    assert "good:\n" in proc.stdout and "local:\n" in proc.stdout


def test_run_with_dryrun_returns_the_request_and_submits_nothing() -> None:
    """TorchX's nightly ``Runner.run(..., dryrun=True)``: the dry-run info, which ``schedule`` then submits."""
    with Runner("sess", {"txs": TorchXStyle}) as r:
        info = r.run(_app(), "txs", {"queue": "q4"}, dryrun=True)
        assert isinstance(info, AppDryRunInfo) and str(info).startswith("run tx on q4")
        sched = r.scheduler("txs")
        assert isinstance(sched, TorchXStyle) and sched.apps == {}  # nothing submitted
        handle = r.schedule(info)
        assert r.status(handle) is not None and list(sched.apps) == ["tx-0"]
