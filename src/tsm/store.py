"""The embedded state store under ``$TSM_HOME``: one SQLite file in WAL mode, safe across processes.

Two users: the runner records every app it launches on any scheduler (table ``apps``, so ``tsm list``
shows recent apps everywhere), and the local scheduler records its apps and replicas
(``local_apps``, ``local_replicas``). Writers take ``BEGIN IMMEDIATE`` and retry on a busy database
with back-off, so concurrent launches never surface "database is locked"; a disk or permission
problem becomes one :class:`~tsm.errors.StoreError` that says what to fix. ``$TSM_HOME`` is created
0700 and the database files 0600.
"""

from __future__ import annotations

import contextlib
import os
import random
import sqlite3
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from tsm.errors import StoreError

SCHEMA_VERSION = 2

_SCHEMA = """
CREATE TABLE IF NOT EXISTS apps (
    handle TEXT PRIMARY KEY,
    scheduler TEXT NOT NULL,
    session TEXT NOT NULL,
    app_id TEXT NOT NULL,
    name TEXT NOT NULL,
    state INTEGER NOT NULL,
    created REAL NOT NULL,
    updated REAL NOT NULL,
    spec TEXT,
    cfg TEXT
);
CREATE INDEX IF NOT EXISTS apps_created ON apps(created);
CREATE TABLE IF NOT EXISTS local_apps (
    app_id TEXT PRIMARY KEY,
    session TEXT NOT NULL,
    name TEXT NOT NULL,
    state INTEGER NOT NULL,
    created REAL NOT NULL,
    started REAL,
    ended REAL,
    num_restarts INTEGER NOT NULL DEFAULT 0,
    msg TEXT NOT NULL DEFAULT '',
    app_dir TEXT NOT NULL,
    log_dir TEXT NOT NULL,
    sup_pid INTEGER,
    sup_start INTEGER,
    watchdog_pid INTEGER,
    watchdog_start INTEGER,
    spec TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS local_apps_created ON local_apps(created);
CREATE TABLE IF NOT EXISTS local_replicas (
    app_id TEXT NOT NULL,
    role TEXT NOT NULL,
    idx INTEGER NOT NULL,
    state INTEGER NOT NULL,
    pid INTEGER,
    pid_start INTEGER,
    exit_code INTEGER,
    started REAL,
    ended REAL,
    restarts INTEGER NOT NULL DEFAULT 0,
    error TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (app_id, role, idx)
);
"""


def tsm_home() -> Path:
    """``$TSM_HOME`` (default ``~/.tsm``), created 0700 when missing."""
    home = Path(os.environ.get("TSM_HOME") or Path.home() / ".tsm")
    try:
        home.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as e:
        raise StoreError(f"cannot create TSM_HOME {home}: {e.strerror}; set TSM_HOME to a writable directory") from e
    if not home.is_dir():
        raise StoreError(f"TSM_HOME {home} is not a directory; set TSM_HOME to a directory")
    return home


def _describe(e: BaseException, path: Path) -> str:
    text = str(e)
    low = text.lower()
    if "readonly" in low or "read-only" in low:
        return f"state store {path} is read-only: make it (and {path.parent}) writable or set TSM_HOME elsewhere"
    if "disk is full" in low or "no space" in low:
        return f"no space left for the state store {path}: free disk space or set TSM_HOME elsewhere"
    if "malformed" in low or "not a database" in low:
        return f"state store {path} is damaged ({text}); move it aside and tsm will start a new one"
    if "unable to open" in low:
        return f"cannot open the state store {path}: check that {path.parent} exists and is writable"
    return f"state store {path}: {text}"


class Store:
    """A connection to the store; cheap to create, one per thread (SQLite connections are not shared).

    Reads run in autocommit mode and see the latest committed data; :meth:`write` runs a function in
    one immediate transaction, retrying while another process holds the write lock.
    """

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or tsm_home() / "tsm.db"
        try:
            # Create it 0600 ourselves; SQLite gives its -wal and -shm files the database file's mode.
            if not self.path.exists():
                os.close(os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600))
            self.conn = sqlite3.connect(self.path, timeout=10.0, isolation_level=None, check_same_thread=False)
            self.conn.execute("PRAGMA busy_timeout=10000")
            version = self.conn.execute("PRAGMA user_version").fetchone()[0]
            if version != SCHEMA_VERSION:
                self._retry(self._migrate)
            self.conn.execute("PRAGMA synchronous=NORMAL")
        except sqlite3.Error as e:
            raise StoreError(_describe(e, self.path)) from e
        except OSError as e:
            raise StoreError(_describe(e, self.path)) from e

    def _migrate(self) -> None:
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            version = self.conn.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise StoreError(
                    f"state store {self.path} was written by a newer tsm (schema {version} > {SCHEMA_VERSION}); "
                    "upgrade tsm or set TSM_HOME to another directory"
                )
            if version != SCHEMA_VERSION:
                for statement in filter(str.strip, _SCHEMA.split(";")):
                    self.conn.execute(statement)
                self._add_missing_columns()
                self.conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            self.conn.execute("COMMIT")
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise

    def _add_missing_columns(self) -> None:
        """Bring tables made by an older tsm up to date: add every column the schema has and they lack."""
        import re

        for table, body in re.findall(r"CREATE TABLE IF NOT EXISTS (\w+) \((.*?)\n\)", _SCHEMA, re.S):
            have = {row[1] for row in self.conn.execute(f"PRAGMA table_info({table})")}
            for line in body.strip().splitlines():
                column = line.strip().rstrip(",")
                name = column.split()[0]
                if name.isupper() or name in have:  # PRIMARY KEY clause, or already there
                    continue
                self.conn.execute(f"ALTER TABLE {table} ADD COLUMN {column}")

    def _retry(self, fn: Any, *args: Any) -> Any:
        delay = 0.005
        deadline = time.monotonic() + 60.0
        while True:
            try:
                return fn(*args)
            except sqlite3.OperationalError as e:
                busy = "locked" in str(e) or "busy" in str(e)
                if not busy or time.monotonic() > deadline:
                    raise
                time.sleep(delay * (1 + random.random()))
                delay = min(delay * 2, 0.2)

    def write(self, statements: Sequence[tuple[str, Sequence[Any]]]) -> None:
        """Run ``(sql, params)`` statements in one transaction, retrying while the database is busy."""

        def run() -> None:
            self.conn.execute("BEGIN IMMEDIATE")
            try:
                for sql, params in statements:
                    self.conn.execute(sql, params)
                self.conn.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    self.conn.execute("ROLLBACK")
                raise

        try:
            self._retry(run)
        except sqlite3.Error as e:
            raise StoreError(_describe(e, self.path)) from e

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        """One statement over many rows in one transaction."""
        self.write([(sql, r) for r in rows])

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[sqlite3.Row]:
        """Rows of a read-only query, as ``sqlite3.Row`` (index by column name)."""
        try:
            cur = self.conn.execute(sql, params)
            cur.row_factory = sqlite3.Row
            return list(self._retry(cur.fetchall))
        except sqlite3.Error as e:
            raise StoreError(_describe(e, self.path)) from e

    def iter_query(self, sql: str, params: Sequence[Any] = ()) -> Iterator[sqlite3.Row]:
        """Like :meth:`query` but lazily."""
        yield from self.query(sql, params)

    def close(self) -> None:
        """Close the connection."""
        with contextlib.suppress(sqlite3.Error):
            self.conn.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
