"""TorchX's ``runner.api``: TorchX's runner contract, on tsm's :class:`tsm.runner.api.Runner`.

tsm's runner is deliberately stricter and does more: it dry-runs a *copy* of the app, adds tsm's own
variables, fills run options from config files, refuses a tracker it cannot load, and knows only handles
tsm can name. Code written against ``torchx.runner`` counts on TorchX's behaviour instead, so this runner
keeps it (and everything else of tsm's runner: the history, ``tsm list``, sweeps, ``delete``):

* :meth:`Runner.dryrun` checks the roles (one at least, each with an entrypoint and replicas), then
  writes TorchX's variables into the *given* app's roles (``TORCHX_JOB_ID``, ``TORCHX_PARENT_RUN_ID`` from
  the argument or ``$TORCHX_PARENT_RUN_ID``, ``TORCHX_TRACKERS`` and each ``TORCHX_TRACKER_<NAME>_CONFIG``
  from :func:`get_configured_trackers`), resolves ``cfg`` with the scheduler's own ``run_opts()`` only,
  builds a workspace where the scheduler can ship one (else ignores it, as TorchX does), and submits;
* scheduler parameters also come from ``TORCHX_<NAME>`` variables (offered, as ``TSM_*`` are to tsm's);
* :meth:`Runner.schedule` names the app ``scheduler://session/<str(app id)>`` whatever the scheduler
  returned; a handle tsm's history cannot hold is kept by this runner only;
* :meth:`Runner.describe` gives the app this runner launched, as it was given; :meth:`Runner.log_lines`
  passes TorchX's arguments to ``log_iter``; ``scheduler_run_opts`` is the scheduler's own.

:func:`get_runner` names the session ``torchx`` and takes TorchX's registry
(:func:`tsm.compat.torchx.schedulers.get_scheduler_factories`: ``local_cwd`` is TorchX's in-process
scheduler, the default ``local_docker``). ``log_event``, ``get_configured_trackers`` and
``get_scheduler_factories`` are this module's own names, so a test may patch them here.
"""

from __future__ import annotations

import builtins
import logging
import os
from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime
from typing import Any

from tsm.compat.torchx.runner._nightly import apply_overrides, build_workspace, ship_role_workspaces
from tsm.compat.torchx.schedulers import get_scheduler_factories
from tsm.errors import MalformedAppHandleError, UnknownAppError
from tsm.runner.after import After, prepare as prepare_after
from tsm.runner.api import Runner as _TsmRunner
from tsm.runner.config import get_config, get_configs
from tsm.runner.events import log_event
from tsm.runner.params import SchedulerFactory
from tsm.schedulers.api import Scheduler, Stream
from tsm.specs.api import AppDef, AppDryRunInfo, AppStatus, macros
from tsm.specs.handles import ParsedAppHandle, parse_app_handle
from tsm.specs.runopts import CfgVal, runopts
from tsm.tracker.api import (
    ENV_TORCHX_JOB_ID,
    ENV_TORCHX_PARENT_RUN_ID,
    ENV_TORCHX_TRACKERS,
    tracker_config_env_var_name,
)

__all__ = ["Runner", "get_configured_trackers", "get_runner", "get_scheduler_factories", "log_event"]

logger = logging.getLogger(__name__)

#: ``TORCHX_*`` variables that are TorchX's own settings, never scheduler parameters.
_RESERVED = (ENV_TORCHX_JOB_ID, ENV_TORCHX_PARENT_RUN_ID, ENV_TORCHX_TRACKERS, "TORCHX_TRACKER_", "TORCHX_TRACKING_",
             "TORCHX_RANK0_HOST", "TORCHX_IMAGE")


def get_configured_trackers() -> dict[str, str | None]:
    """``{tracker: config}``: the names of ``.torchxconfig``'s ``[torchx:tracker]`` (or ``$TORCHX_TRACKERS``,
    comma-separated, which wins), each with ``[tracker:<name>] config`` (or its ``TORCHX_TRACKER_<NAME>_CONFIG``)."""
    names = list(get_configs(prefix="torchx", name="tracker"))
    if ENV_TORCHX_TRACKERS in os.environ:
        names = [n for n in os.environ[ENV_TORCHX_TRACKERS].split(",") if n]
    out: dict[str, str | None] = {}
    for name in names:
        out[name] = os.environ.get(tracker_config_env_var_name(name, "TORCHX")) or get_config("tracker", name, "config")
    return out


def _env_params() -> dict[str, str]:
    """``TORCHX_<NAME>=value`` as scheduler parameter ``<name>`` (TorchX's own variables left out)."""
    return {k[len("TORCHX_"):].lower(): v for k, v in os.environ.items()
            if k.startswith("TORCHX_") and len(k) > len("TORCHX_") and not k.startswith(_RESERVED)}


class Runner(_TsmRunner):
    """tsm's runner with TorchX's contract (see the module docstring)."""

    def __init__(
        self,
        name: str,
        scheduler_factories: Mapping[str, SchedulerFactory] | None = None,
        component_defaults: Mapping[str, Mapping[str, str]] | None = None,
        scheduler_params: Mapping[str, object] | None = None,
    ) -> None:
        super().__init__(name, scheduler_factories, component_defaults, scheduler_params, env_params=_env_params())
        #: handles this runner made that tsm's history cannot hold (an app id that is not a handle part)
        self._unrecorded: dict[str, ParsedAppHandle] = {}

    # -- launch ------------------------------------------------------------------------------------
    def dryrun(
        self,
        app: AppDef,
        scheduler: str | None = None,
        cfg: Mapping[str, CfgVal] | None = None,
        workspace: str | None = None,
        parent_run_id: str | None = None,
        after: Iterable[str | After] | None = None,
    ) -> AppDryRunInfo[Any]:
        """What ``scheduler`` would submit for ``app``, TorchX's way (the module docstring says how); ``after``
        is tsm's (:mod:`tsm.runner.after`)."""
        scheduler = self._scheduler_name(scheduler)
        _check_roles(app)
        for role in app.roles:
            apply_overrides(role)
        parent_run_id = os.environ.get(ENV_TORCHX_PARENT_RUN_ID, parent_run_id)
        trackers = get_configured_trackers()
        for role in app.roles:
            role.env[ENV_TORCHX_JOB_ID] = f"{scheduler}://{self._name}/{macros.app_id}"
            if parent_run_id:
                role.env[ENV_TORCHX_PARENT_RUN_ID] = parent_run_id
            if trackers:
                role.env[ENV_TORCHX_TRACKERS] = ",".join(trackers)
            for tracker, config in trackers.items():
                if config:
                    role.env[tracker_config_env_var_name(tracker, "TORCHX")] = config
        with log_event("dryrun", scheduler, workspace=workspace, session=self._name):
            sched = self._scheduler(scheduler)
            resolved = sched.run_opts().resolve(dict(cfg or {}))
            if workspace:
                self._ship(app, workspace, scheduler, sched, resolved)
            if any(r.workspace for r in app.roles):
                ship_role_workspaces(app, self._builder(scheduler, sched), resolved)
            if isinstance(sched, Scheduler):  # TorchX's check (every role sized); the backend's own runs below
                Scheduler._validate(sched, app, scheduler)  # type: ignore[arg-type]  # the base takes both spellings
            else:  # a stand-in (a test's mock): TorchX's own call
                sched._validate(app, scheduler)
            info = sched.submit_dryrun(app, resolved)
            info._scheduler = scheduler
            return prepare_after(self, info, after) if after else info

    def _builder(self, scheduler: str, sched: Any) -> Any:
        """The workspace builder of ``sched``; NotSupportedError when it ships none (a role asked for one)."""
        from tsm.errors import NotSupportedError
        from tsm.workspace.dir import builder_for

        builder = builder_for(scheduler, sched)
        if builder is None:
            raise NotSupportedError(f"the {scheduler} scheduler ships no workspace, and a role names one")
        return builder

    def build_workspace(self, app: AppDef, scheduler: str | None = None,
                        cfg: Mapping[str, CfgVal] | None = None) -> dict[tuple[str, Any], str]:
        """Build each ``(image, workspace)`` pair of ``app``'s roles once (``app`` unchanged): the images by pair,
        for :func:`tsm.compat.torchx.workspace.pin_workspace_images` (TorchX nightly)."""
        scheduler = self._scheduler_name(scheduler)
        with log_event("build_workspace", scheduler, session=self._name):
            sched = self._scheduler(scheduler)
            resolved = sched.run_opts().resolve(dict(cfg or {}))
            return build_workspace(app, self._builder(scheduler, sched), resolved)

    def describe_native(self, app_handle: str) -> AppDryRunInfo[Any] | None:
        """The app's request as its scheduler reads it back (``Scheduler.describe_native``); None when unknown
        or when the scheduler does not read requests back (TorchX nightly)."""
        sched, name, app_id = self._locate(app_handle)
        with log_event("describe_native", name, app_id, session=self._name):
            return sched.describe_native(app_id)

    def _ship(self, app: AppDef, workspace: str, scheduler: str, sched: Any, cfg: Mapping[str, CfgVal]) -> None:
        from tsm.workspace.dir import apply_workspace, builder_for

        builder = builder_for(scheduler, sched)
        if builder is None:
            logger.info("the %s scheduler ships no workspace; %s is not used", scheduler, workspace)
            return
        apply_workspace(app, workspace, cfg, builder)

    def schedule(self, dryrun_info: AppDryRunInfo[Any]) -> str:
        """Submit the dry run's request; the handle ``scheduler://session/<app id>``."""
        if isinstance(dryrun_info, AppDryRunInfo) and dryrun_info.after:  # held for tsm's helper (tsm.runner.after)
            return super().schedule(dryrun_info)
        scheduler = dryrun_info._scheduler
        with log_event("schedule", scheduler, session=self._name):
            app_id = str(self._scheduler(scheduler).schedule(dryrun_info))
            handle = f"{scheduler}://{self._name}/{app_id}"
            app = dryrun_info._app
            if app is not None:
                self._apps[handle] = app
            try:
                parse_app_handle(handle)
            except MalformedAppHandleError:
                self._unrecorded[handle] = ParsedAppHandle(scheduler, self._name, app_id)
                return handle
            if isinstance(app, AppDef):
                self.history.add(handle, scheduler, self._name, app_id, app, dryrun_info._cfg)
            return handle

    def run(  # type: ignore[override]  # TorchX's signature: no dryrun keyword overloads
        self,
        app: AppDef,
        scheduler: str | None = None,
        cfg: Mapping[str, CfgVal] | None = None,
        workspace: str | None = None,
        parent_run_id: str | None = None,
        *,
        dryrun: bool = False,
    ) -> Any:
        """:meth:`dryrun`, then :meth:`schedule` (``dryrun=True``: the dry run only); the handle."""
        info = self.dryrun(app, scheduler, cfg, workspace=workspace, parent_run_id=parent_run_id)
        return info if dryrun else self.schedule(info)

    def dryrun_component(
        self,
        component: str | None,
        component_args: builtins.list[str] | Mapping[str, Any] | None = None,
        scheduler: str | None = None,
        cfg: Mapping[str, CfgVal] | None = None,
        workspace: str | None = None,
        parent_run_id: str | None = None,
        after: Iterable[str | After] | None = None,
    ) -> AppDryRunInfo[Any]:
        """:meth:`dryrun` of ``component`` found and called as TorchX finds and calls it.

        ``component_args`` is its command line, or (TorchX's nightly, ``torchx run --stdin``) a mapping of
        parameter names to values."""
        from tsm.compat.torchx.specs.builders import materialize_appdef
        from tsm.compat.torchx.specs.finder import get_component

        component = self.config.component(component)
        fn = get_component(component).fn
        defaults = self._component_defaults.get(component)
        if isinstance(component_args, Mapping):
            app = materialize_appdef(fn, [], defaults, config=dict(component_args))
        else:
            app = materialize_appdef(fn, list(component_args or []), defaults)
        return self.dryrun(app, scheduler, cfg=cfg, workspace=workspace, parent_run_id=parent_run_id, after=after)

    def run_component(
        self,
        component: str | None,
        component_args: builtins.list[str] | Mapping[str, Any] | None = None,
        scheduler: str | None = None,
        cfg: Mapping[str, CfgVal] | None = None,
        workspace: str | None = None,
        parent_run_id: str | None = None,
        after: Iterable[str | After] | None = None,
    ) -> str:
        """:meth:`dryrun_component`, then :meth:`schedule`; the handle."""
        return self.schedule(self.dryrun_component(component, component_args, scheduler, cfg,
                                                   workspace=workspace, parent_run_id=parent_run_id, after=after))

    # -- queries -----------------------------------------------------------------------------------
    def _locate(self, app_handle: str) -> tuple[Scheduler, str, str]:
        parsed = self._unrecorded.get(app_handle) or parse_app_handle(app_handle)
        return self._scheduler(parsed.scheduler), parsed.scheduler, parsed.app_id

    def status(self, app_handle: str) -> AppStatus | None:
        """The app's status, or None (and forgotten here) when its scheduler no longer knows it."""
        sched, name, app_id = self._locate(app_handle)
        with log_event("status", name, app_id, session=self._name):
            desc = sched.describe(app_id)
            if not desc:
                self._apps.pop(app_handle, None)
                return None
            status = AppStatus(desc.state, desc.num_restarts, msg=desc.msg,
                               structured_error_msg=desc.structured_error_msg, roles=desc.roles_statuses)
            status.ui_url = desc.ui_url
            if app_handle not in self._unrecorded:
                self.history.set_state(app_handle, desc.state)
            return status

    def describe(self, app_handle: str) -> AppDef | None:
        """The app as this runner launched it, else as its scheduler describes it; None when unknown."""
        sched, name, app_id = self._locate(app_handle)
        with log_event("describe", name, app_id, session=self._name):
            app = self._apps.get(app_handle)
            if app is None:
                desc = sched.describe(app_id)
                if desc:
                    app = desc.app if desc.app is not None else AppDef(name=app_id, roles=list(desc.roles))
            return app

    def log_lines(
        self,
        app_handle: str,
        role_name: str,
        k: int = 0,
        regex: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        should_tail: bool = False,
        streams: Stream | None = None,
    ) -> Iterator[str]:
        """The scheduler's ``log_iter`` of replica ``k`` of ``role_name``; an unknown app raises UnknownAppError."""
        sched, name, app_id = self._locate(app_handle)
        with log_event("log_lines", name, app_id, session=self._name):
            if not self.status(app_handle):
                raise UnknownAppError(app_handle, handle=app_handle, scheduler=name)
            return sched.log_iter(app_id, role_name, k, regex, since, until, should_tail, streams=streams)

    def scheduler_run_opts(self, scheduler: str) -> runopts:
        """The run options of ``scheduler``, as it declares them."""
        return self._scheduler(scheduler).run_opts()


def _check_roles(app: AppDef) -> None:
    """TorchX's checks before a dry run: a role at least, each with an entrypoint and a positive replica count."""
    if not app.roles:
        raise ValueError(f"No roles for app: {app.name}. Did you forget to add roles to AppDef?")
    for role in app.roles:
        if not role.entrypoint:
            raise ValueError(f"No entrypoint for role: {role.name}. Did you forget to call role.runs(entrypoint, args, env)?")
        if role.num_replicas <= 0:
            raise ValueError(f"Non-positive replicas for role: {role.name}. Did you forget to set role.num_replicas?")


def get_runner(
    name: str | None = None,
    component_defaults: Mapping[str, Mapping[str, str]] | None = None,
    **scheduler_params: Any,
) -> Runner:
    """A :class:`Runner` over TorchX's scheduler registry, for session ``name`` (default ``torchx``)."""
    if name:
        import warnings

        warnings.warn(f"Custom session names are deprecated (got name={name!r}); prefix the app name instead",
                      FutureWarning, stacklevel=2)
    return Runner(name or "torchx", get_scheduler_factories(), component_defaults, scheduler_params=scheduler_params)
