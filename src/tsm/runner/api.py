"""The Runner: the one door users go through to launch, watch, read and stop apps on any scheduler.

::

    with get_runner() as runner:
        handle = runner.run_component("utils.echo", ["--msg", "hi"], scheduler="local")
        print(runner.wait(handle).format())

The runner validates apps, adds ``TSM_APP_HANDLE`` to every role's env, fills run options from
config files (command line > project file > user file), records every app it launches in the store
(so ``list()`` shows recent apps across schedulers), and turns a handle nobody knows into
:class:`~tsm.errors.UnknownAppError`.
"""

from __future__ import annotations

import builtins
import copy
import json
import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any

from tsm.errors import (
    ConfigError,
    InvalidRunOptionError,
    StoreError,
    UnknownAppError,
    UnknownSchedulerError,
    did_you_mean,
)
from tsm.runner.config import Config, load_config
from tsm.schedulers import DEFAULT_SCHEDULER, get_scheduler, scheduler_names
from tsm.schedulers.api import ListAppResponse, Scheduler, Stream
from tsm.specs.api import AppDef, AppDryRunInfo, AppState, AppStatus
from tsm.specs.handles import make_app_handle, parse_app_handle
from tsm.specs.runopts import CfgVal, runopts
from tsm.specs.validate import validate_app

#: How many history rows ``list()`` shows.
LIST_LIMIT = 200


class Runner:
    """Launches and tracks apps; create it with :func:`get_runner` and close it (or use ``with``)."""

    def __init__(self, name: str = "default", config: Config | None = None, **scheduler_kwargs: Any) -> None:
        self.session_name = name
        self._config = config
        self._scheduler_kwargs = scheduler_kwargs
        self._schedulers: dict[str, Scheduler] = {}
        self._store: Any = None

    # -- plumbing ----------------------------------------------------------------------------------
    @property
    def config(self) -> Config:
        """The merged config files (read on first use)."""
        if self._config is None:
            self._config = load_config()
        return self._config

    @property
    def default_scheduler(self) -> str:
        """The config's default scheduler, else ``local``."""
        return self.config.default_scheduler or DEFAULT_SCHEDULER

    def _scheduler(self, name: str) -> Scheduler:
        if name not in self._schedulers:
            self._schedulers[name] = get_scheduler(name, self.session_name, **self._scheduler_kwargs.get(name, {}))
        return self._schedulers[name]

    def _history(self) -> Any:
        if self._store is None:
            from tsm.store import Store

            self._store = Store()
        return self._store

    def _resolve_cfg(self, scheduler: str, cfg: Mapping[str, CfgVal] | None) -> dict[str, CfgVal]:
        """Config-file run options under ``cfg``; a bad file option is reported with its file."""
        opts = self._scheduler(scheduler).run_opts()
        file_cfg = dict(self.config.scheduler_cfg.get(scheduler, {}))
        for key, value in file_cfg.items():
            origin = self.config.origin.get((scheduler, key), "config file")
            opt = opts.get(key)
            if opt is None:
                raise ConfigError(
                    f"{origin}: [scheduler.{scheduler}] unknown run option '{key}'{did_you_mean(key, dict(opts))}; "
                    f"`tsm runopts {scheduler}` lists them"
                )
            alone = runopts()  # check this one option's type without demanding the required ones
            alone.add(key, opt.type_, opt.help)
            try:
                alone.resolve({key: value})
            except InvalidRunOptionError as e:
                raise ConfigError(f"{origin}: [scheduler.{scheduler}] {e}") from e
        file_cfg.update(cfg or {})
        return file_cfg

    # -- launch ------------------------------------------------------------------------------------
    def dryrun(
        self, app: AppDef, scheduler: str | None = None, cfg: Mapping[str, CfgVal] | None = None
    ) -> AppDryRunInfo:
        """Validate the app and return what ``scheduler`` would submit, without submitting it."""
        if scheduler is None and self.config.default_scheduler:
            try:
                self._scheduler(self.config.default_scheduler)
            except UnknownSchedulerError as e:  # say which file named it
                raise ConfigError(f"{self.config.default_scheduler_origin}: default_scheduler: {e}") from e
        scheduler = scheduler or self.default_scheduler
        validate_app(app)
        app = copy.deepcopy(app)
        handle = f"{scheduler}://{self.session_name}/${{app_id}}"
        for role in app.roles:
            role.env.setdefault("TSM_APP_HANDLE", handle)
        sched = self._scheduler(scheduler)
        return sched.submit_dryrun(app, self._resolve_cfg(scheduler, cfg))

    def schedule(self, dryrun_info: AppDryRunInfo) -> str:
        """Submit a dry run's request unchanged; returns the app handle and records it."""
        scheduler = dryrun_info.scheduler
        app_id = self._scheduler(scheduler).schedule(dryrun_info)
        handle = make_app_handle(scheduler, self.session_name, app_id)
        app = dryrun_info.app
        now = time.time()
        try:
            self._history().write([(
                "INSERT OR REPLACE INTO apps (handle, scheduler, session, app_id, name, state, created, updated, spec, cfg) "
                "VALUES (?,?,?,?,?,?,?,?,?,?)",
                (
                    handle, scheduler, self.session_name, app_id, app.name if app else app_id, int(AppState.SUBMITTED),
                    now, now, json.dumps(app.to_dict()) if app else None, json.dumps(dryrun_info.cfg, default=str),
                ),
            )])
        except StoreError as e:
            # The app runs: losing its handle would be worse than a missing history line.
            logging.getLogger("tsm").warning(
                "launched %s but could not add it to tsm's history (%s); `tsm list -s %s` still shows it",
                handle, e, scheduler,
            )
        return handle

    def run(self, app: AppDef, scheduler: str | None = None, cfg: Mapping[str, CfgVal] | None = None) -> str:
        """Dry-run then schedule ``app``; returns its handle."""
        return self.schedule(self.dryrun(app, scheduler, cfg))

    def component_app(self, component: str, component_args: list[str] | None = None) -> AppDef:
        """Materialize a component (builtin, entry point or ``file.py:fn``) with its arguments."""
        from tsm.components import get_component, materialize

        comp = get_component(component)
        defaults = self.config.component_defaults.get(component)
        return materialize(comp.fn, list(component_args or []), defaults=defaults, prog=f"tsm run {component}")

    def dryrun_component(
        self,
        component: str,
        component_args: list[str] | None = None,
        scheduler: str | None = None,
        cfg: Mapping[str, CfgVal] | None = None,
    ) -> AppDryRunInfo:
        """:meth:`dryrun` of a component."""
        return self.dryrun(self.component_app(component, component_args), scheduler, cfg)

    def run_component(
        self,
        component: str,
        component_args: list[str] | None = None,
        scheduler: str | None = None,
        cfg: Mapping[str, CfgVal] | None = None,
    ) -> str:
        """:meth:`run` of a component; returns the handle."""
        return self.schedule(self.dryrun_component(component, component_args, scheduler, cfg))

    # -- queries -----------------------------------------------------------------------------------
    def _locate(self, app_handle: str) -> tuple[Scheduler, str]:
        parsed = parse_app_handle(app_handle)
        return self._scheduler(parsed.scheduler), parsed.app_id

    def _unknown(self, app_handle: str) -> UnknownAppError:
        return UnknownAppError(
            f"unknown app {app_handle}: its scheduler does not know it (never launched, or removed); "
            "`tsm list` shows known apps"
        )

    def _to_status(self, app_handle: str, desc: Any) -> AppStatus:
        status = AppStatus(
            state=desc.state, num_restarts=desc.num_restarts, msg=desc.msg,
            structured_error_msg=desc.structured_error_msg, ui_url=desc.ui_url, roles=desc.roles_statuses,
        )
        self._record_state(app_handle, desc.state)
        return status

    def _record_state(self, app_handle: str, state: AppState) -> None:
        self._history().write([(
            "UPDATE apps SET state=?, updated=? WHERE handle=? AND state != ?",
            (int(state), time.time(), app_handle, int(state)),
        )])

    def status(self, app_handle: str) -> AppStatus:
        """The app's current status."""
        sched, app_id = self._locate(app_handle)
        desc = sched.describe(app_id)
        if desc is None:
            raise self._unknown(app_handle)
        return self._to_status(app_handle, desc)

    def wait(self, app_handle: str, timeout: float | None = None) -> AppStatus:
        """Block until the app is terminal, or ``timeout`` seconds pass; returns its status either way."""
        sched, app_id = self._locate(app_handle)
        desc = sched.wait(app_id, timeout=timeout)
        if desc is None:
            raise self._unknown(app_handle)
        return self._to_status(app_handle, desc)

    def cancel(self, app_handle: str) -> None:
        """Stop the app (idempotent: cancelling an ended app does nothing)."""
        sched, app_id = self._locate(app_handle)
        if not sched.exists(app_id):
            raise self._unknown(app_handle)
        sched.cancel(app_id)
        desc = sched.describe(app_id)
        if desc is not None:
            self._record_state(app_handle, desc.state)

    stop = cancel  # seed TSM name

    def describe(self, app_handle: str) -> AppDef:
        """The app definition as launched (rebuilt by the scheduler or from history)."""
        sched, app_id = self._locate(app_handle)
        desc = sched.describe(app_id)
        if desc is not None and desc.app is not None:
            return desc.app
        rows = self._history().query("SELECT spec FROM apps WHERE handle=?", (app_handle,))
        if rows and rows[0]["spec"]:
            return AppDef.from_dict(json.loads(rows[0]["spec"]))
        if desc is not None:
            return AppDef(name=app_id)
        raise self._unknown(app_handle)

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
        """Lines of replica ``k`` of ``role_name`` (see :meth:`Scheduler.log_iter`)."""
        sched, app_id = self._locate(app_handle)
        if not sched.exists(app_id):
            raise self._unknown(app_handle)
        return sched.log_iter(app_id, role_name, k, regex, since, until, should_tail, streams)

    def list(self, scheduler: str | None = None, limit: int | None = LIST_LIMIT) -> list[ListAppResponse]:
        """Apps newest first: one scheduler's own list, or (None) the ``limit`` newest apps launched through
        tsm anywhere (``limit=None``: all of them).

        Without a scheduler, live states come from one ``list()`` call per scheduler involved, not one
        query per app; an unreachable scheduler leaves the last recorded state.
        """
        if scheduler is not None:
            return self._scheduler(scheduler).list()
        rows = self._history().query(
            "SELECT handle, scheduler, app_id, name, state, created FROM apps ORDER BY created DESC LIMIT ?",
            (-1 if limit is None else limit,),
        )
        live: dict[str, dict[str, AppState]] = {}
        for sched_name in {r["scheduler"] for r in rows if not AppState(r["state"]).is_terminal}:
            try:
                live[sched_name] = {a.app_id: a.state for a in self._scheduler(sched_name).list()}
            except Exception:  # noqa: BLE001 - an unreachable backend must not hide the others
                live[sched_name] = {}
        out = []
        changed = []
        for r in rows:
            state = AppState(r["state"])
            if not state.is_terminal:
                new = live.get(r["scheduler"], {}).get(r["app_id"])
                if new is not None and new != state:
                    state = new
                    changed.append((int(new), time.time(), r["handle"]))
            out.append(ListAppResponse(r["app_id"], state, r["handle"], r["name"], r["created"]))
        if changed:
            self._history().write([("UPDATE apps SET state=?, updated=? WHERE handle=?", c) for c in changed])
        return out

    def remove(self, app_handles: Sequence[str], older_than_days: float | None = None) -> builtins.list[str]:
        """Forget ended apps and delete their scheduler-side state and logs; returns the handles removed.

        ``older_than_days`` adds every ended app in the history created more than that many days ago.
        A running app is refused with an error (cancel it first).
        """
        targets = list(app_handles)
        if older_than_days is not None:
            cutoff = time.time() - older_than_days * 86400
            rows = self._history().query("SELECT handle, state FROM apps WHERE created < ?", (cutoff,))
            targets += [r["handle"] for r in rows if r["handle"] not in targets]
        removed = []
        for handle in targets:
            sched, app_id = self._locate(handle)
            desc = sched.describe(app_id)
            if desc is not None and not desc.state.is_terminal:
                if handle in app_handles:
                    from tsm.errors import SchedulerError

                    raise SchedulerError(f"{handle} is still {desc.state.name}; cancel it first")
                continue
            gone = sched.remove(app_id)
            rows = self._history().query("SELECT 1 FROM apps WHERE handle=?", (handle,))
            if rows:
                self._history().write([("DELETE FROM apps WHERE handle=?", (handle,))])
            if gone or rows:
                removed.append(handle)
            elif handle in app_handles:
                raise self._unknown(handle)
        return removed

    def scheduler_run_opts(self, scheduler: str) -> runopts:
        """The run options ``scheduler`` accepts."""
        return self._scheduler(scheduler).run_opts()

    def scheduler_backends(self) -> builtins.list[str]:
        """Every scheduler name, builtins and plugins."""
        return scheduler_names()

    # -- lifetime ----------------------------------------------------------------------------------
    def close(self) -> None:
        """Close every scheduler and the store."""
        for sched in self._schedulers.values():
            sched.close()
        self._schedulers.clear()
        if self._store is not None:
            self._store.close()
            self._store = None

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def get_runner(name: str = "default", **scheduler_kwargs: Any) -> Runner:
    """A :class:`Runner` for session ``name`` (the session is part of every handle it makes)."""
    from tsm.specs.validate import check_name

    check_name(name, "session name")
    return Runner(name, **scheduler_kwargs)
