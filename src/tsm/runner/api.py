"""The Runner: the one door users go through to launch, watch, read and stop apps on any scheduler.

::

    with get_runner() as runner:
        handle = runner.run_component("utils.echo", ["--msg", "hi"])  # on the default scheduler
        print(runner.wait(handle).format())

The runner validates apps, adds ``TSM_APP_HANDLE`` (and TorchX's ``TORCHX_JOB_ID``) to every role's env,
fills run options from config files (command line > project file > user file > ``.torchxconfig``), records
every app it launches in the history (``list()`` shows recent apps across schedulers) and reports each call
as one event (:mod:`tsm.runner.events`). It keeps TorchX's constructor, keywords and attributes, so code
written against ``torchx.runner`` runs after changing its imports (docs/torchx-compat.md says where it is
stricter); TorchX's own contract is :mod:`tsm.compat.torchx.runner.api`.

It asks schedulers what they can do by the capabilities they declare (:mod:`tsm.schedulers.api`), never by
their name or signature.
"""

from __future__ import annotations

import builtins
import copy
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, overload

from tsm._logging import warn as _warn
from tsm.errors import (
    AppStillRunningError,
    ConfigError,
    NotSupportedError,
    StoreError,
    UnknownAppError,
    UnknownSchedulerError,
)
from tsm.history import History
from tsm.runner import after as _after, hooks as _hooks
from tsm.runner.batch import live_list, remove_each
from tsm.runner.component_launch import ComponentLaunch
from tsm.runner.debug import ReplicaDebugging
from tsm.runner.events import log_event
from tsm.runner.params import (  # re-exported: where callers found them before
    ENV_PREFIX as ENV_PREFIX,
    RESERVED_ENV as RESERVED_ENV,
    RESERVED_ENV_PREFIXES as RESERVED_ENV_PREFIXES,
    TORCHX_ENV_OPTION as TORCHX_ENV_OPTION,
    RegistryFactories,
    SchedulerFactory as SchedulerFactory,
    add_job_env,
    add_secrets,
    cfg_from_strs,
    cfg_json as _cfg_json,
    factory_of,
    flag as _flag,
    make_scheduler,
    resolve_cfg,
    scheduler_params_from_env as scheduler_params_from_env,
    with_runner_opts,
)
from tsm.schedulers import DEFAULT_SCHEDULER
from tsm.schedulers.api import (
    EventWait,
    ListAppResponse,
    LockfileEnvironments,
    Scheduler,
    SizedPlacement,
    StoreRecords,
    Stream,
    SweepNative,
)
from tsm.specs.api import AppDef, AppDryRunInfo, AppState, AppStatus
from tsm.specs.handles import app_handle_template, make_app_handle, parse_app_handle
from tsm.specs.overrides import apply_overrides
from tsm.specs.runopts import CfgVal, runopts
from tsm.specs.validate import check_name, check_resources, validate_app

if TYPE_CHECKING:
    # the config files are read on first use (tomllib, configparser): ``tsm status``/``list`` never need them
    from tsm.runner.config import Config

#: How many history rows ``list()`` shows by default.
LIST_LIMIT = 200


class Runner(ComponentLaunch, ReplicaDebugging):
    """Launches and tracks apps; create it with :func:`get_runner` and close it (or use ``with``).

    Args:
        name: the session name, part of every handle this runner makes.
        scheduler_factories: ``{name: create_scheduler}`` this runner may use; None: every registered
            scheduler (builtins and plugins).
        component_defaults: ``{component: {argument: value}}`` used when a component's argument is
            not given (over those of the config files).
        scheduler_params: keywords passed to every scheduler factory (over ``TSM_*`` variables).
        config: the config files' content (read on first use when None).
        env_params: parameters only offered to factories (default: the ``TSM_*`` variables' ones).
    """

    def __init__(
        self,
        name: str,
        scheduler_factories: Mapping[str, SchedulerFactory] | None = None,
        component_defaults: Mapping[str, Mapping[str, str]] | None = None,
        scheduler_params: Mapping[str, object] | None = None,
        *,
        config: Config | None = None,
        env_params: Mapping[str, str] | None = None,
    ) -> None:
        # TorchX's attributes, under its names, for subclasses written against torchx.runner.Runner
        self._name: str = name
        self._scheduler_factories: Mapping[str, SchedulerFactory] = (
            dict(scheduler_factories) if scheduler_factories is not None else RegistryFactories()
        )
        env = scheduler_params_from_env() if env_params is None else dict(env_params)
        self._scheduler_params: dict[str, Any] = {**env, **(scheduler_params or {})}
        #: keys of ``_scheduler_params`` that only the environment gave: offered to factories, not imposed
        self._offered_params = frozenset(k for k in env if k not in (scheduler_params or {}))
        self._scheduler_instances: dict[str, Scheduler] = {}
        self._apps: dict[str, AppDef] = {}  # handle -> app, for apps this runner scheduled
        self._component_defaults = {k: dict(v) for k, v in (component_defaults or {}).items()}
        self._config = config
        self._hist: History | None = None

    # -- plumbing ----------------------------------------------------------------------------------
    @property
    def session_name(self) -> str:
        """The session name, part of every handle this runner makes (TorchX keeps it as ``_name``)."""
        return self._name

    @session_name.setter
    def session_name(self, value: str) -> None:
        self._name = value

    @property
    def _schedulers(self) -> dict[str, Scheduler]:
        """The schedulers made so far (TorchX's ``_scheduler_instances``)."""
        return self._scheduler_instances

    def name(self) -> str:
        """The session name (TorchX's ``Runner.name()``)."""
        return self._name

    @property
    def config(self) -> Config:
        """The merged config files (read on first use)."""
        if self._config is None:
            from tsm.runner.config import load_config

            self._config = load_config()
        return self._config

    @property
    def default_scheduler(self) -> str:
        """The config's default scheduler, else ``local``."""
        return self.config.default_scheduler or DEFAULT_SCHEDULER

    @property
    def history(self) -> History:
        """The app history (opened on first use)."""
        if self._hist is None:
            self._hist = History()
        return self._hist

    def scheduler(self, name: str) -> Scheduler:
        """The scheduler this runner uses for ``name``, made on first use with the runner's scheduler params.

        An unknown name raises :class:`~tsm.errors.UnknownSchedulerError`; a parameter the factory does not
        take, :class:`~tsm.errors.InvalidRunOptionError` naming it (see :mod:`tsm.runner.params`); a plugin
        that cannot be imported, :class:`tsm.schedulers.SchedulerPluginError`.
        """
        if name not in self._scheduler_instances:
            factory = factory_of(self._scheduler_factories, name)
            self._scheduler_instances[name] = make_scheduler(
                name, factory, self._name, self._scheduler_params, self._offered_params
            )
        return self._scheduler_instances[name]

    def _scheduler(self, name: str) -> Scheduler:
        """TorchX's name for :meth:`scheduler` (what the runner's own methods call, so a subclass may override it)."""
        return self.scheduler(name)

    def _scheduler_name(self, scheduler: str | None) -> str:
        """``scheduler``, else the config's default (checked, and an error names the file that set it)."""
        if scheduler is None and self.config.default_scheduler:
            try:
                self._scheduler(self.config.default_scheduler)
            except UnknownSchedulerError as e:  # say which file named it
                raise ConfigError(f"{self.config.default_scheduler_origin}: default_scheduler: {e}") from e
        return scheduler or self.default_scheduler

    def check_cfg(self, scheduler: str | None, cfg: Mapping[str, CfgVal] | None) -> None:
        """Raise :class:`~tsm.errors.InvalidRunOptionError` for a key of ``cfg`` that ``scheduler`` does not declare.

        :meth:`dryrun` ignores such keys with a warning, as TorchX does, because a cfg may be shared by
        several schedulers; the command line, where ``-c`` names options of one scheduler, calls this
        first so a typo is an error there.
        """
        if cfg:
            self.scheduler_run_opts(self._scheduler_name(scheduler)).check_known(cfg)

    def _resolve_cfg(self, scheduler: str, cfg: Mapping[str, CfgVal] | None) -> dict[str, CfgVal]:
        """Config-file run options under ``cfg``; a bad file option is reported with its file."""
        return resolve_cfg(self.config, scheduler, self._scheduler(scheduler).run_opts(), cfg)

    # -- launch ------------------------------------------------------------------------------------
    def dryrun(self, app: AppDef, scheduler: str | None = None, cfg: Mapping[str, CfgVal] | None = None,
               workspace: str | None = None, parent_run_id: str | None = None,
               after: Iterable[str | _after.After] | None = None) -> AppDryRunInfo[Any]:
        """Validate the app and return what ``scheduler`` would submit, without submitting it.

        ``workspace`` is shipped with the app (:func:`tsm.workspace.dir.apply_workspace`: a snapshot
        directory, or the scheduler's own builder), else :class:`~tsm.errors.NotSupportedError`. Every
        replica gets the run-tracking variables (:func:`tsm.tracker.api.tracker_env`: ``TSM_JOB_ID``,
        ``TSM_PARENT_RUN_ID`` from ``parent_run_id``, ``TSM_TRACKERS``, ...) and TorchX's names for them;
        the run option ``torchx_env=False`` leaves TorchX's names out. ``after``: apps it waits for
        (``HANDLE[:ok|:any|:fail]``, :mod:`tsm.runner.after`).
        """
        with log_event("dryrun", scheduler, workspace=workspace,
                       parent_run_id=parent_run_id, runcfg=_cfg_json(cfg), session=self._name) as ctx:
            scheduler = self._scheduler_name(scheduler)
            ctx.set(scheduler=scheduler)
            validate_app(app)
            apply_overrides(app)  # Role.overrides: values computed now, before the copy (an awaitable cannot be copied)
            app = copy.deepcopy(app)
            sched = self._scheduler(scheduler)
            resolved = self._resolve_cfg(scheduler, cfg)
            torchx_env = _flag(resolved.pop(TORCHX_ENV_OPTION, True))
            on_state = resolved.pop("on_state", None)
            add_secrets(app, resolved.pop("secrets", None), sched, scheduler)
            # ${app_id} is filled in per replica
            add_job_env(app, app_handle_template(scheduler, self.session_name), parent_run_id, self.config, torchx_env,
                        resolved.pop("trackers", None))
            if isinstance(sched, SizedPlacement):  # a scheduler that places replicas by size
                check_resources(app, scheduler)
            if not isinstance(sched, LockfileEnvironments) and any(r.environment for r in app.roles):
                raise NotSupportedError(f"scheduler {scheduler} does not build lockfile environments yet (local does); "
                                      "drop the roles' environment or run on local")
            if workspace:
                from tsm.workspace.dir import ship_workspace

                ship_workspace(app, workspace, scheduler, sched, resolved)
            info = sched.submit_dryrun(app, resolved)
            info.scheduler = scheduler  # as the runner names it (an alias such as local_cwd stays itself)
            info.on_state = _hooks.check(on_state) if on_state else ""
            if info.app is not None:
                ctx.set(app_id=info.app.name, app_image=info.app.roles[0].image if info.app.roles else None,
                        app_metadata=dict(info.app.metadata))
            return _after.prepare(self, info, after) if after else info

    def schedule(self, dryrun_info: AppDryRunInfo[Any]) -> str:
        """Submit a dry run's request unchanged; returns the app handle and records it."""
        handle = self._schedule(dryrun_info)
        if dryrun_info.on_state:  # a detached helper tells it of each state change (tsm.runner.hooks)
            _hooks.follow(self, handle, dryrun_info.on_state, *self._likeness())
        return handle

    def _schedule(self, dryrun_info: AppDryRunInfo[Any]) -> str:
        scheduler = dryrun_info.scheduler
        with log_event("schedule", scheduler, runcfg=_cfg_json(dryrun_info.cfg), session=self._name) as ctx:
            if dryrun_info.after:  # tsm's helper submits it once its dependencies end
                handle = _after.hold(self, dryrun_info, *self._likeness())
                ctx.set(app_id=parse_app_handle(handle).app_id)
                return handle
            sched = self._scheduler(scheduler)
            # A scheduler whose records live in tsm's own store (the local one) writes the history's row in
            # the transaction of its own record: one store write less on the way to run()'s return.
            recorded = False
            if isinstance(sched, StoreRecords) and self.history.shares(sched.store):
                def history_row(app_id: str) -> tuple[str, tuple[Any, ...]]:
                    return self.history.add_statement(make_app_handle(scheduler, self._name, app_id), scheduler,
                                                      self.session_name, app_id, dryrun_info.app, dryrun_info.cfg)

                app_id = sched.schedule_recording(dryrun_info, history_row)
                recorded = True
            else:
                app_id = sched.schedule(dryrun_info)
            ctx.set(app_id=app_id)
            return self._record(scheduler, app_id, dryrun_info, in_history=recorded)

    def schedule_sweep(self, dryrun_infos: Sequence[AppDryRunInfo[Any]], parallel: int, name: str) -> builtins.list[str]:
        """Submit every trial's dry run as one native object of their one scheduler (:class:`SweepNative`, a
        job array holding the cap ``parallel``); each trial's handle, recorded as :meth:`schedule` records one."""
        scheduler = dryrun_infos[0].scheduler
        with log_event("schedule_sweep", scheduler, session=self._name) as ctx:
            sched = self._scheduler(scheduler)
            if not isinstance(sched, SweepNative) or any(i.scheduler != scheduler for i in dryrun_infos):
                raise NotSupportedError(f"the {scheduler} scheduler cannot take a sweep whole", scheduler=scheduler)
            app_ids = sched.schedule_sweep(builtins.list(dryrun_infos), parallel, name)
            ctx.set(app_id=",".join(app_ids))
            return [self._record(scheduler, i, info) for i, info in zip(app_ids, dryrun_infos, strict=True)]

    def _record(self, scheduler: str, app_id: str, info: AppDryRunInfo[Any], in_history: bool = False) -> str:
        """What the runner keeps of an app it submitted: its handle, its history row (unless the scheduler wrote
        it already) and the tracker's lineage; returns the handle."""
        handle = make_app_handle(scheduler, self._name, app_id)
        if info.app is not None:
            self._apps[handle] = info.app
        try:
            if not in_history:
                self.history.add(handle, scheduler, self.session_name, app_id, info.app, info.cfg)
        except StoreError as e:
            # The app runs: losing its handle would be worse than a missing history line.
            _warn("launched %s but could not add it to tsm's history (%s); `tsm list -s %s` still shows it",
                  handle, e, scheduler)
        from tsm.tracker.api import record_scheduled

        record_scheduled(handle, info.app)  # lineage: never raises for a tracker's failure
        return handle

    @overload
    def run(self, app: AppDef, scheduler: str | None = ..., cfg: Mapping[str, CfgVal] | None = ...,
            workspace: str | None = ..., parent_run_id: str | None = ..., *, dryrun: Literal[False] = ...,
            after: Iterable[str | _after.After] | None = ...) -> str: ...

    @overload
    def run(self, app: AppDef, scheduler: str | None = ..., cfg: Mapping[str, CfgVal] | None = ...,
            workspace: str | None = ..., parent_run_id: str | None = ..., *,
            dryrun: Literal[True], after: Iterable[str | _after.After] | None = ...) -> AppDryRunInfo[Any]: ...

    def run(self, app: AppDef, scheduler: str | None = None, cfg: Mapping[str, CfgVal] | None = None,
            workspace: str | None = None, parent_run_id: str | None = None, *,
            dryrun: bool = False, after: Iterable[str | _after.After] | None = None) -> str | AppDryRunInfo[Any]:
        """Dry-run then schedule ``app``; returns its handle. With ``after``, it starts once those apps end as
        asked (``HANDLE[:ok|:any|:fail]``, :mod:`tsm.runner.after`), and its handle is returned at once.

        ``dryrun=True`` (TorchX's nightly keyword) submits nothing and returns the :class:`AppDryRunInfo`
        that :meth:`dryrun` gives, which :meth:`schedule` accepts unchanged.
        """
        if dryrun:
            return self.dryrun(app, scheduler, cfg, workspace=workspace, parent_run_id=parent_run_id, after=after)
        with log_event("run", scheduler, workspace=workspace, parent_run_id=parent_run_id,
                       runcfg=_cfg_json(cfg), session=self._name) as ctx:
            handle = self.schedule(self.dryrun(app, scheduler, cfg, workspace=workspace, parent_run_id=parent_run_id,
                                               after=after))
            parsed = parse_app_handle(handle)
            ctx.set(scheduler=parsed.scheduler, app_id=parsed.app_id)
            return handle

    # -- queries -----------------------------------------------------------------------------------
    def _locate(self, app_handle: str) -> tuple[Scheduler, str, str]:
        parsed = parse_app_handle(app_handle)
        return self._scheduler(parsed.scheduler), parsed.scheduler, parsed.app_id

    def _unknown(self, app_handle: str, scheduler: str | None = None) -> UnknownAppError:
        return UnknownAppError(f"unknown app {app_handle}: its scheduler does not know it (never launched, or removed); "
                               "`tsm list` shows known apps", handle=app_handle, scheduler=scheduler)

    def _to_status(self, app_handle: str, desc: Any) -> AppStatus:
        status = AppStatus(
            state=desc.state, num_restarts=desc.num_restarts, msg=desc.msg,
            structured_error_msg=desc.structured_error_msg, ui_url=desc.ui_url, roles=desc.roles_statuses,
        )
        self.history.set_state(app_handle, desc.state)
        return status

    def status(self, app_handle: str) -> AppStatus | None:
        """The app's current status, or None when its scheduler does not know it (any more) and it is not held."""
        sched, name, app_id = self._locate(app_handle)
        with log_event("status", name, app_id, session=self._name):
            desc = sched.describe(app_id)
            return _after.status(self, app_handle) if desc is None else self._to_status(app_handle, desc)

    def wait(
        self, app_handle: str, wait_interval: float | None = None, timeout: float | None = None
    ) -> AppStatus | None:
        """Block until the app is terminal (or ``timeout`` seconds pass); its status, or None if unknown.

        Schedulers with an event to wait on (``EventWait``, the local one) return as soon as the app ends;
        for the others ``wait_interval`` is the longest pause between two polls of the backend (passed as
        ``Scheduler.wait``'s ``poll_interval``); None (the default; TorchX polls every 10 s) leaves the
        backend's own back-off, which sees a quick end within about 0.1 s. With ``timeout`` the status
        returned may not be terminal.
        """
        if wait_interval is not None and not wait_interval > 0:
            raise ValueError(f"wait_interval must be > 0 seconds, got {wait_interval!r}")
        sched, name, app_id = self._locate(app_handle)
        with log_event("wait", name, app_id, session=self._name):
            start = time.monotonic()
            if not _after.wait(self, app_handle, timeout):  # held, still waiting for its dependencies
                return _after.status(self, app_handle)
            if timeout is not None:
                timeout = max(0.0, timeout - (time.monotonic() - start))
            if wait_interval is None or isinstance(sched, EventWait):  # an interval would mean nothing
                desc = sched.wait(app_id, timeout=timeout)
            else:
                desc = sched.wait(app_id, timeout=timeout, poll_interval=wait_interval)
            return _after.status(self, app_handle) if desc is None else self._to_status(app_handle, desc)

    def cancel(self, app_handle: str) -> None:
        """Stop the app; idempotent, and nothing happens for an app its scheduler does not know."""
        sched, name, app_id = self._locate(app_handle)
        with log_event("cancel", name, app_id, session=self._name):
            desc = sched.describe(app_id)
            if desc is None and not _after.cancel(self, app_handle):  # held: a cancel ends the wait
                desc = sched.describe(app_id)  # it was being submitted as the cancel came
            if desc is None:
                return
            if not desc.state.is_terminal:
                sched.cancel(app_id)
                desc = sched.describe(app_id)
            if desc is not None:
                self.history.set_state(app_handle, desc.state)

    def delete(self, app_handle: str) -> None:
        """Cancel the app if it runs, then forget it and delete what its scheduler keeps (state, logs).

        TorchX's nightly ``Runner.delete``; an app its scheduler does not know is forgotten from the
        history, and nothing else happens (idempotent, as :meth:`cancel`).
        """
        sched, name, app_id = self._locate(app_handle)
        with log_event("delete", name, app_id, session=self._name):
            desc = sched.describe(app_id)
            if desc is None and not _after.cancel(self, app_handle):
                desc = sched.describe(app_id)
            if desc is not None and not desc.state.is_terminal:
                sched.cancel(app_id)  # idempotent, and ends the app on every builtin backend before it returns
            self._forget_function_files(app_handle, desc)
            sched.remove(app_id)
            _after.forget(self, app_handle)
            self.history.forget(app_handle)
            self._apps.pop(app_handle, None)

    def stop(self, app_handle: str) -> None:
        """Deprecated alias of :meth:`cancel` (as in TorchX; warns with PendingDeprecationWarning)."""
        warnings.warn("Runner.stop() will be removed; use Runner.cancel()", PendingDeprecationWarning, stacklevel=2)
        self.cancel(app_handle)

    def describe(self, app_handle: str) -> AppDef | None:
        """The app definition as launched (from the scheduler, else the history), or None if unknown."""
        sched, name, app_id = self._locate(app_handle)
        with log_event("describe", name, app_id, session=self._name):
            desc = sched.describe(app_id)
            if desc is not None and desc.app is not None:
                return desc.app
            spec = self.history.spec(app_handle)
            if spec is not None:
                return spec
            if desc is None:
                return None
            return AppDef(name=app_id, roles=list(desc.roles), metadata=dict(desc.metadata))  # TorchX's form

    def log_lines(self, app_handle: str, role_name: str, k: int = 0, regex: str | None = None,
                  since: datetime | None = None, until: datetime | None = None, should_tail: bool = False,
                  streams: Stream | None = None) -> Iterator[str]:
        """Lines of replica ``k`` of ``role_name`` (see :meth:`Scheduler.log_iter`); an unknown app raises."""
        sched, name, app_id = self._locate(app_handle)
        with log_event("log_lines", name, app_id, session=self._name):
            if not sched.exists(app_id):
                raise self._unknown(app_handle, name)
            return sched.log_iter(app_id, role_name, k, regex, since, until, should_tail, streams)

    def log_events(self, app_handle: str, targets: Sequence[tuple[str, int]] | None = None, regex: str | None = None,
                   since: datetime | None = None, until: datetime | None = None, should_tail: bool = False,
                   streams: Stream | None = None, attempt: int | None = None,
                   idle: Callable[[], object] | None = None) -> Iterator[Any]:
        """The lines of many replicas ``(role, k)`` (None: every replica) as :class:`~tsm.runner.logs.LogEvent`
        values, with a ``marker`` event where a restarted attempt begins (see :mod:`tsm.runner.logs`).

        The iterator reads through runners of its own, so any thread may consume it; ``idle()`` is called
        whenever it is about to wait for more.
        """
        from tsm.runner.logs import replica_events

        return replica_events(self._sibling, app_handle, targets, regex=regex, since=since, until=until,
                              should_tail=should_tail, streams=streams, attempt=attempt, idle=idle)

    def _likeness(self) -> tuple[Mapping[str, SchedulerFactory] | None, dict[str, Any]]:
        """What makes a runner like this one: the factories it was given (None: the registry's) and the
        scheduler parameters it was given (not those only offered by the environment)."""
        factories = None if isinstance(self._scheduler_factories, RegistryFactories) else self._scheduler_factories
        return factories, {k: v for k, v in self._scheduler_params.items() if k not in self._offered_params}

    def _sibling(self) -> Runner:
        """A runner like this one (session, factories, given parameters, config) for another thread."""
        factories, given = self._likeness()
        return Runner(self._name, factories, self._component_defaults, given, config=self._config)

    def list(self, scheduler: str | None = None, limit: int | None = LIST_LIMIT) -> builtins.list[ListAppResponse]:
        """Apps newest first: one scheduler's own list, or (None) the ``limit`` newest apps launched through
        tsm anywhere (``limit=None``: all of them).

        Without a scheduler, live states come from one ``list()`` call per scheduler involved, not one
        query per app; an unreachable scheduler leaves the last recorded state.
        """
        with log_event("list", scheduler, session=self._name):
            if scheduler is not None:
                apps = self._scheduler(scheduler).list()
                for a in apps:
                    if not a.app_handle:
                        a.app_handle = make_app_handle(scheduler, self.session_name, a.app_id)
                return apps
            rows = self.history.recent(limit)
            out, changed = live_list(rows, lambda name: {a.app_id: a.state for a in self._scheduler(name).list()})
            self.history.set_states(changed)
            return out

    def remove(self, app_handles: Sequence[str], older_than_days: float | None = None) -> builtins.list[str]:
        """Forget ended apps and delete their scheduler-side state and logs; returns the handles removed.

        ``older_than_days`` adds every ended app in the history created more than that many days ago.
        A running app named in ``app_handles`` raises :class:`~tsm.errors.AppStillRunningError` (cancel it
        first); an unknown one :class:`~tsm.errors.UnknownAppError`. A scheduler that fails (an engine that
        is down) stops nothing else: every other app is removed, then
        :class:`~tsm.errors.IncompleteRemovalError` says what was removed and why each other app was not
        (the apps of a scheduler found unavailable are not asked again).
        """
        with log_event("remove", None, session=self._name):
            targets = list(app_handles)
            if older_than_days is not None:
                cutoff = time.time() - older_than_days * 86400
                targets += [h for h in self.history.created_before(cutoff) if h not in targets]
            return remove_each(targets, app_handles, self._remove_one)

    def _remove_one(self, handle: str, named: bool) -> bool:
        """Remove one ended app; False for one still running that was not ``named``, or already gone."""
        sched, name, app_id = self._locate(handle)
        desc = sched.describe(app_id)
        held = _after.status(self, handle) if desc is None else None  # an app held for its dependencies
        state = desc.state if desc is not None else held.state if held is not None else AppState.SUCCEEDED
        if not state.is_terminal:
            if named:
                raise AppStillRunningError(f"{handle} is still {state.name}; cancel it first",
                                           handle=handle, scheduler=name)
            return False
        self._forget_function_files(handle, desc)
        gone = sched.remove(app_id) | _after.forget(self, handle)
        known = self.history.forget(handle)
        if not gone and not known and named:
            raise self._unknown(handle, name)
        return gone or known

    def _forget_function_files(self, handle: str, desc: Any) -> None:
        """What a function job (:mod:`tsm.functions`) left in its directory goes with its app."""
        from tsm.functions import files

        if files.root().is_dir():
            files.forget(desc.app if desc is not None and desc.app is not None else self.history.spec(handle))

    def scheduler_run_opts(self, scheduler: str) -> runopts:
        """The run options ``scheduler`` accepts, plus the runner's own ``torchx_env``."""
        return with_runner_opts(self._scheduler(scheduler).run_opts())

    def cfg_from_str(self, scheduler: str, *cfg_literal: str) -> dict[str, CfgVal]:
        """Parse ``"k=v,k2=a;b"`` strings into typed run options of ``scheduler`` (see :meth:`runopts.cfg_from_str`);
        an option given in two of them is an :class:`~tsm.errors.InvalidRunOptionError` naming it."""
        return cfg_from_strs(self.scheduler_run_opts(scheduler), cfg_literal)

    def scheduler_backends(self) -> builtins.list[str]:
        """The scheduler names this runner can use: its factories, or every registered one."""
        return builtins.list(self._scheduler_factories)

    # -- functions as jobs: the logic is tsm.functions ------------------------------------------------
    def submit(self, fn: Any, *args: Any, **options: Any) -> Any:
        """Run ``fn(*args)`` as a job; a :class:`~tsm.functions.job.Job` (a ``concurrent.futures.Future``).
        Options (``scheduler``, ``resource``, ``replicas``, ``kwargs``, run options): :mod:`tsm.functions`."""
        from tsm.functions.launch import submit

        return submit(self, fn, *args, **options)

    def map(self, fn: Any, *iterables: Any, **options: Any) -> Any:
        """``fn`` once per item of ``zip(*iterables)`` as a sweep, ``parallel=N`` at a time; a
        :class:`~tsm.functions.mapping.MapJob` of one job per item (options: :mod:`tsm.functions`)."""
        from tsm.functions.launch import map_

        return map_(self, fn, *iterables, **options)

    # -- lifetime ----------------------------------------------------------------------------------
    def close(self) -> None:
        """Close every scheduler and the store; safe to call twice, and the runner reopens what it needs."""
        for sched in self._schedulers.values():
            sched.close()
        self._schedulers.clear()
        if self._hist is not None:
            self._hist.close()

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Runner(name={self.session_name!r}, schedulers={self.scheduler_backends()!r})"


def get_runner(name: str | None = None, component_defaults: Mapping[str, Mapping[str, str]] | None = None,
               **scheduler_params: Any) -> Runner:
    """A :class:`Runner` for session ``name`` (default ``"default"``; the session is part of every handle).

    ``component_defaults`` override the config files' component defaults; ``scheduler_params`` are passed
    to every scheduler factory (a scheduler that does not take one says so when first used).
    """
    name = "default" if name is None else name
    check_name(name, "session name")
    return Runner(name, None, component_defaults, scheduler_params)
