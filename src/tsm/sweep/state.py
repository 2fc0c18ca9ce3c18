"""A sweep's durable state: one private SQLite file per sweep under ``$TSM_HOME/sweeps/<session>/<id>/``.

::

    meta    k, v (JSON)                       what was asked (component, space, scheduler, cfg, parallel,
                                              max_failures, ...), the sweep's state and reason, cancel
    trials  idx, params, state, handle, ...   one row per trial: PENDING -> LAUNCHING -> the app's states,
                                              or SKIPPED (never launched: cancelled, or too many failed)
    events  seq, t, idx, state                every trial transition, in order (what the cap is checked on)

``LAUNCHING`` is written *before* a trial is submitted, with the app name it will carry; a controller that
is killed between the two is reconciled on resume by looking that name up in the scheduler's list
(:mod:`tsm.sweep.controller`), so no trial is ever submitted twice. The folder is 0700 and the files
0600; the database is in WAL mode so ``tsm sweep show`` reads while the controller writes.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tsm.errors import MalformedAppHandleError, StoreError, UnknownAppError

SCHEME = "sweep"
_HANDLE = re.compile(r"sweep://([A-Za-z0-9][A-Za-z0-9_-]{0,62})/([a-z0-9][a-z0-9-]{0,62})")

#: trial states besides the app's own (:class:`tsm.specs.api.AppState` names)
PENDING, LAUNCHING, SKIPPED = "PENDING", "LAUNCHING", "SKIPPED"
#: states a trial ends in
TRIAL_TERMINAL = frozenset({"SUCCEEDED", "FAILED", "CANCELLED", SKIPPED})
#: the sweep's own states (``meta.state``)
SWEEP_TERMINAL = frozenset({"SUCCEEDED", "FAILED", "CANCELLED"})


class MalformedSweepHandleError(MalformedAppHandleError):
    """The string is not a sweep handle ``sweep://<session>/<id>`` (CLI exit code 2)."""


class UnknownSweepError(UnknownAppError):
    """No sweep has this handle (never made, or removed): CLI exit code 2."""


@dataclass(frozen=True)
class SweepHandle:
    """A parsed ``sweep://<session>/<id>``."""

    session: str
    sweep_id: str

    def __str__(self) -> str:
        return f"{SCHEME}://{self.session}/{self.sweep_id}"


def parse_sweep_handle(text: str) -> SweepHandle:
    """Parse ``sweep://<session>/<id>``; anything else raises :class:`MalformedSweepHandleError`."""
    m = _HANDLE.fullmatch(text) if isinstance(text, str) else None
    if m is None:
        raise MalformedSweepHandleError(
            f"{text!r} is not a sweep handle: expected sweep://SESSION/ID (as `tsm sweep` printed it)", handle=str(text)
        )
    return SweepHandle(m.group(1), m.group(2))


def is_sweep_handle(text: str) -> bool:
    """Whether ``text`` names a sweep rather than an app (it starts ``sweep://``)."""
    return text.startswith(f"{SCHEME}://")


def sweeps_root() -> Path:
    """``$TSM_HOME/sweeps`` (not created)."""
    from tsm.store import tsm_home

    return tsm_home() / "sweeps"


def sweep_dir(handle: SweepHandle) -> Path:
    return sweeps_root() / handle.session / handle.sweep_id


_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS trials (idx INTEGER PRIMARY KEY, params TEXT NOT NULL, state TEXT NOT NULL, "
    "name TEXT NOT NULL, handle TEXT, launched REAL, ended REAL, msg TEXT NOT NULL DEFAULT '')",
    "CREATE TABLE IF NOT EXISTS events (seq INTEGER PRIMARY KEY AUTOINCREMENT, t REAL NOT NULL, "
    "idx INTEGER NOT NULL, state TEXT NOT NULL)",
)


@dataclass(frozen=True)
class Trial:
    """One trial as recorded: its index, parameters, state, app handle (once submitted) and times."""

    idx: int
    params: dict[str, str]
    state: str
    name: str
    handle: str | None
    launched: float | None
    ended: float | None
    msg: str


def trial_args(params: Mapping[str, str], args: Sequence[str] = ()) -> list[str]:
    """The component's command line of a trial: ``--name value`` per parameter, then the sweep's fixed ``args``."""
    return [w for name, value in params.items() for w in (f"--{name}", value)] + list(args)


class SweepState:
    """The state file of one sweep; thread-safe (one connection behind a lock), safe across processes."""

    def __init__(self, path: Path, create: bool = False) -> None:
        self.dir = path
        db = path / "state.db"
        if not create and not db.exists():
            raise UnknownSweepError(f"unknown sweep: no state at {path}; `tsm sweep list` shows known sweeps")
        self._lock = threading.Lock()
        try:
            if create:
                from tsm.schedulers.common.files import make_private_dirs

                make_private_dirs(path)
                os.close(os.open(db, os.O_WRONLY | os.O_CREAT, 0o600))
            self._conn = sqlite3.connect(db, timeout=30, isolation_level=None, check_same_thread=False)
            self._conn.row_factory = sqlite3.Row
            if create:
                self._conn.execute("PRAGMA journal_mode=WAL")
                for sql in _SCHEMA:
                    self._conn.execute(sql)
            self._conn.execute("PRAGMA synchronous=NORMAL")
        except (OSError, sqlite3.Error) as e:
            raise StoreError(f"cannot open sweep state {db}: {e}") from e

    @classmethod
    def open(cls, handle: SweepHandle) -> SweepState:
        """The state of sweep ``handle``; :class:`UnknownSweepError` when there is none."""
        if not (sweep_dir(handle) / "state.db").exists():
            raise UnknownSweepError(
                f"unknown sweep {handle}: never started here, or removed; `tsm sweep list` shows known sweeps",
                handle=str(handle),
            )
        return cls(sweep_dir(handle))

    def close(self) -> None:
        self._conn.close()

    # -- writes ------------------------------------------------------------------------------------
    def _tx(self, statements: Iterable[tuple[str, tuple[Any, ...]]]) -> None:
        with self._lock:
            try:
                self._conn.execute("BEGIN IMMEDIATE")
                for sql, params in statements:
                    self._conn.execute(sql, params)
                self._conn.execute("COMMIT")
            except sqlite3.Error as e:
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                raise StoreError(f"cannot write sweep state {self.dir}: {e}") from e

    def init(self, meta: Mapping[str, object], trials: list[dict[str, str]], names: list[str]) -> None:
        """Write a new sweep: its meta and every trial PENDING."""
        stmts: list[tuple[str, tuple[Any, ...]]] = [
            ("INSERT OR REPLACE INTO meta (k, v) VALUES (?, ?)", (k, json.dumps(v))) for k, v in meta.items()
        ]
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            for sql, params in stmts:
                self._conn.execute(sql, params)
            self._conn.executemany(
                "INSERT INTO trials (idx, params, state, name) VALUES (?, ?, ?, ?)",
                [(i, json.dumps(p), PENDING, n) for i, (p, n) in enumerate(zip(trials, names, strict=True))],
            )
            self._conn.execute("COMMIT")

    def set_meta(self, **values: object) -> None:
        self._tx(("INSERT OR REPLACE INTO meta (k, v) VALUES (?, ?)", (k, json.dumps(v))) for k, v in values.items())

    def set_trial(self, idx: int, state: str, handle: str | None = None, msg: str | None = None,
                  launched: float | None = None, ended: float | None = None) -> None:
        """Move trial ``idx`` to ``state`` (recording the handle, the message, and the launch/end time).

        ``launched``/``ended`` are times the scheduler reported (a native sweep's trials: when Slurm started
        and ended each task); without them, LAUNCHING and an end are stamped now.
        """
        now = time.time()
        sets: list[str] = ["state=?"]
        params: list[object] = [state]
        if handle is not None:
            sets.append("handle=?")
            params.append(handle)
        if msg is not None:
            sets.append("msg=?")
            params.append(msg)
        if state == LAUNCHING or launched is not None:
            sets.append("launched=?")
            params.append(now if launched is None else launched)
        if state in TRIAL_TERMINAL:
            sets.append("ended=?")
            params.append(now if ended is None else ended)
        self._tx([
            (f"UPDATE trials SET {', '.join(sets)} WHERE idx=?", (*params, idx)),
            ("INSERT INTO events (t, idx, state) VALUES (?, ?, ?)", (now, idx, state)),
        ])

    def skip_pending(self, msg: str) -> None:
        """Every trial never launched becomes SKIPPED (the sweep was cancelled or stopped)."""
        self._tx([("UPDATE trials SET state=?, msg=? WHERE state=?", (SKIPPED, msg, PENDING))])

    # -- reads -------------------------------------------------------------------------------------
    def meta(self) -> dict[str, Any]:
        with self._lock:
            rows = self._conn.execute("SELECT k, v FROM meta").fetchall()
        return {r["k"]: json.loads(r["v"]) for r in rows}

    def trials(self) -> list[Trial]:
        with self._lock:
            rows = self._conn.execute(
                "SELECT idx, params, state, name, handle, launched, ended, msg FROM trials ORDER BY idx"
            ).fetchall()
        return [
            Trial(r["idx"], json.loads(r["params"]), r["state"], r["name"], r["handle"],
                  None if r["launched"] is None else float(r["launched"]),
                  None if r["ended"] is None else float(r["ended"]), r["msg"])
            for r in rows
        ]

    def trial(self, idx: int) -> Trial:
        """One trial (by index)."""
        with self._lock:
            r = self._conn.execute(
                "SELECT idx, params, state, name, handle, launched, ended, msg FROM trials WHERE idx=?", (idx,)
            ).fetchone()
        return Trial(r["idx"], json.loads(r["params"]), r["state"], r["name"], r["handle"],
                     r["launched"], r["ended"], r["msg"])

    def counts(self) -> dict[str, int]:
        with self._lock:
            rows = self._conn.execute("SELECT state, COUNT(*) AS n FROM trials GROUP BY state").fetchall()
        return {r["state"]: r["n"] for r in rows}

    def events(self) -> list[tuple[float, int, str]]:
        with self._lock:
            rows = self._conn.execute("SELECT t, idx, state FROM events ORDER BY seq").fetchall()
        return [(r["t"], r["idx"], r["state"]) for r in rows]


def max_concurrent(events: Iterable[tuple[float, int, str]]) -> int:
    """The most trials between LAUNCHING and their end at any point of ``events`` (the cap, as recorded)."""
    live: set[int] = set()
    most = 0
    for _, idx, state in events:
        if state == LAUNCHING:
            live.add(idx)
            most = max(most, len(live))
        elif state in TRIAL_TERMINAL or state == PENDING:
            live.discard(idx)
    return most


def all_sweeps(session: str | None = None) -> list[SweepHandle]:
    """Every sweep under ``$TSM_HOME`` (one session's when given), in no particular order."""
    root = sweeps_root()
    out = []
    try:
        sessions = [session] if session else [p.name for p in root.iterdir()]
    except OSError:
        return []
    for s in sessions:
        try:
            out += [SweepHandle(s, p.name) for p in (root / s).iterdir() if (p / "state.db").exists()]
        except OSError:
            continue
    return out
