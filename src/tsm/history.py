"""The app history: every app the runner launched, on any scheduler, in the ``apps`` table of the store.

This module is the one owner of that table's SQL; the runner calls these typed methods and holds none.
The history is what ``tsm list`` shows across schedulers, what ``describe`` falls back to when a
scheduler has forgotten an app (Slurm forgets old jobs), and what ``tsm rm --older-than`` walks.

A row is written when an app is scheduled and updated whenever a later call learns a new state;
states are kept as :class:`~tsm.specs.AppState` numbers. Those updates are made on read paths (``tsm
list``, ``status``, ``wait``, ``cancel``) and are best effort: the row is a cache of what the scheduler
knows, so a store that cannot take them (a full or read-only disk, a held lock) never takes a read or a
cancel away. A launch's row and a removal are not: their errors are the caller's. The store itself (locking, faults, the file
under ``$TSM_HOME``) is :class:`tsm.store.Store`.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tsm.specs.api import AppDef, AppState


@dataclass(frozen=True)
class AppRecord:
    """One row of the history: an app as launched through tsm, with its last known state."""

    handle: str
    scheduler: str
    session: str
    app_id: str
    name: str
    state: AppState
    created: float
    updated: float


class History:
    """Typed access to the ``apps`` table; opens the store on first use and closes it with :meth:`close`."""

    def __init__(self, store: Any = None) -> None:
        self._store = store

    @property
    def store(self) -> Any:
        """The :class:`tsm.store.Store` under ``$TSM_HOME`` (opened on first use)."""
        if self._store is None:
            from tsm.store import Store

            self._store = Store()
        return self._store

    # -- writes ------------------------------------------------------------------------------------
    def add(
        self,
        handle: str,
        scheduler: str,
        session: str,
        app_id: str,
        app: AppDef | None,
        cfg: Mapping[str, Any],
        state: AppState = AppState.SUBMITTED,
    ) -> None:
        """Record a just-launched app (replacing any older row with the same handle)."""
        self.store.write([self.add_statement(handle, scheduler, session, app_id, app, cfg, state)])

    @staticmethod
    def add_statement(
        handle: str,
        scheduler: str,
        session: str,
        app_id: str,
        app: AppDef | None,
        cfg: Mapping[str, Any],
        state: AppState = AppState.SUBMITTED,
    ) -> tuple[str, tuple[Any, ...]]:
        """The ``(sql, params)`` of :meth:`add`, for a writer that records the app in the same transaction."""
        now = time.time()
        return (
            "INSERT OR REPLACE INTO apps (handle, scheduler, session, app_id, name, state, created, updated, spec, cfg) "
            "VALUES (?,?,?,?,?,?,?,?,?,?)",
            (
                handle, scheduler, session, app_id, app.name if app else app_id, int(state), now, now,
                json.dumps(app.to_dict()) if app else None, json.dumps(dict(cfg), default=str),
            ),
        )

    def shares(self, store: Any) -> bool:
        """Whether ``store`` is this history's database (so one transaction can write both)."""
        return bool(getattr(store, "path", None) == self.store.path)

    def set_state(self, handle: str, state: AppState) -> None:
        """Record ``state`` for ``handle`` (a no-op when it is already recorded or the app is not in the history)."""
        self.set_states([(handle, state)])

    def set_states(self, changes: Iterable[tuple[str, AppState]]) -> None:
        """Record several ``(handle, state)`` changes in one transaction, if the store takes it (best effort:
        see the module docstring; the next read that learns the state records it)."""
        from tsm.errors import StoreError

        now = time.time()
        statements = [
            ("UPDATE apps SET state=?, updated=? WHERE handle=? AND state != ?", (int(s), now, h, int(s)))
            for h, s in changes
        ]
        if statements:
            with contextlib.suppress(StoreError):
                self.store.write(statements)

    def mark_failed(self, handle: str) -> None:
        """Record that ``handle`` ended FAILED (the one place that spells it)."""
        self.set_state(handle, AppState.FAILED)

    def forget(self, handle: str) -> bool:
        """Delete the row of ``handle``; True when there was one."""
        if not self.contains(handle):
            return False
        self.store.write([("DELETE FROM apps WHERE handle=?", (handle,))])
        return True

    # -- reads -------------------------------------------------------------------------------------
    def contains(self, handle: str) -> bool:
        """True when the history has a row for ``handle``."""
        return bool(self.store.query("SELECT 1 FROM apps WHERE handle=?", (handle,)))

    def spec(self, handle: str) -> AppDef | None:
        """The app definition recorded at launch, or None."""
        rows = self.store.query("SELECT spec FROM apps WHERE handle=?", (handle,))
        if rows and rows[0]["spec"]:
            return AppDef.from_dict(json.loads(rows[0]["spec"]))
        return None

    def recent(self, limit: int | None) -> list[AppRecord]:
        """The ``limit`` most recently launched apps (None: all), newest first."""
        rows = self.store.query(
            "SELECT handle, scheduler, session, app_id, name, state, created, updated FROM apps "
            "ORDER BY created DESC LIMIT ?",
            (-1 if limit is None else limit,),
        )
        return [
            AppRecord(r["handle"], r["scheduler"], r["session"], r["app_id"], r["name"], AppState(r["state"]),
                      r["created"], r["updated"])
            for r in rows
        ]

    def created_before(self, cutoff: float) -> list[str]:
        """Handles of apps launched before ``cutoff`` (seconds since the epoch), oldest first."""
        rows = self.store.query("SELECT handle FROM apps WHERE created < ? ORDER BY created", (cutoff,))
        return [r["handle"] for r in rows]

    def close(self) -> None:
        """Close the store (it reopens on the next call)."""
        if self._store is not None:
            self._store.close()
            self._store = None
