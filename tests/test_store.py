"""The state store: creation, permissions, migration of older files, clear errors, concurrency."""

from __future__ import annotations

import multiprocessing
import os
import sqlite3
import stat
from pathlib import Path

import pytest

from tsm.errors import StoreError
from tsm.store import SCHEMA_VERSION, Store, tsm_home


def test_home_and_database_are_private(tsm_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tsm_home / "sub" / "home"
    monkeypatch.setenv("TSM_HOME", str(home))
    assert tsm_home_fn() == home
    with Store() as store:
        store.write([("INSERT INTO apps VALUES (?,?,?,?,?,?,?,?,?,?)", ("h", "s", "x", "a", "n", 1, 0.0, 0.0, None, None))])
        files = list(home.glob("tsm.db*"))
        assert len(files) >= 2  # the database and its WAL while a connection is open
        for f in files:
            assert stat.S_IMODE(f.stat().st_mode) == 0o600
    assert stat.S_IMODE(home.stat().st_mode) == 0o700


def test_older_schema_is_migrated(tsm_home: Path) -> None:
    db = tsm_home / "tsm.db"
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE local_apps (app_id TEXT PRIMARY KEY, session TEXT NOT NULL, name TEXT NOT NULL, "
                 "state INTEGER NOT NULL, created REAL NOT NULL, app_dir TEXT NOT NULL, log_dir TEXT NOT NULL, spec TEXT NOT NULL)")
    conn.execute("INSERT INTO local_apps VALUES ('a', 's', 'n', 4, 1.0, '/d', '/l', '{}')")
    conn.execute("PRAGMA user_version=1")
    conn.commit()
    conn.close()
    with Store() as store:
        row = store.query("SELECT * FROM local_apps")[0]
        assert row["app_id"] == "a" and row["watchdog_start"] is None and row["num_restarts"] == 0
        assert store.query("PRAGMA user_version")[0][0] == SCHEMA_VERSION


def test_newer_schema_is_refused(tsm_home: Path) -> None:
    conn = sqlite3.connect(tsm_home / "tsm.db")
    conn.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    conn.commit()
    conn.close()
    with pytest.raises(StoreError, match="newer tsm"):
        Store()


def test_damaged_file_is_a_clear_error(tsm_home: Path) -> None:
    (tsm_home / "tsm.db").write_bytes(b"this is not a database" * 100)
    with pytest.raises(StoreError, match="damaged|not a database"):
        Store()


def test_home_that_is_a_file(tsm_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tsm_home / "file"
    f.write_text("x")
    monkeypatch.setenv("TSM_HOME", str(f))
    with pytest.raises(StoreError, match="TSM_HOME"):
        tsm_home_fn()


def tsm_home_fn() -> Path:
    return tsm_home()


def _writer(n: int) -> None:
    with Store() as store:
        for i in range(n):
            store.write([(
                "INSERT INTO apps VALUES (?,?,?,?,?,?,?,?,?,?)",
                (f"h-{os.getpid()}-{i}", "s", "x", "a", "n", 1, 0.0, 0.0, None, None),
            )])


def test_concurrent_writers_lose_nothing(tsm_home: Path) -> None:
    Store().close()
    procs = [multiprocessing.get_context("spawn").Process(target=_writer, args=(50,)) for _ in range(6)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    with Store() as store:
        assert store.query("SELECT COUNT(*) FROM apps")[0][0] == 300
