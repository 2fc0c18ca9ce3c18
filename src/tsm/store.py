"""The embedded state store under ``$TSM_HOME``: one SQLite file in WAL mode, safe across processes.

Two users: the runner records every app it launches on any scheduler (table ``apps``, so ``tsm list``
shows recent apps everywhere), and the local scheduler records its apps and replicas
(``local_apps``, ``local_replicas``). ``$TSM_HOME`` is created 0700 and the database files 0600.

Faults, and what the store does about them:

* **Busy.** Writers take ``BEGIN IMMEDIATE``; a busy database is waited for (SQLite's busy handler,
  then back-off) for at most ``timeout`` seconds (``$TSM_STORE_TIMEOUT``, default 30). Past that the
  write raises :class:`~tsm.errors.StoreError` naming the process that holds the lock (read from
  ``/proc/locks``), never a raw "database is locked". A holder that died released its lock with it
  (POSIX locks end with the process) and its uncommitted frames in the WAL are ignored.
* **Full or read-only disk.** Every SQLite or OS error becomes one ``StoreError`` line that says what
  to fix. When the store cannot be opened for writing but can be read (a read-only file system, or
  a full one where SQLite cannot size its ``-shm`` file), it is opened read-only so reads such as
  ``tsm list`` keep working; a write first tries to reopen it for writing (so a store recovers by
  itself once space is freed or the file system remounted) and else raises the original error.
* **Crash mid-write.** A transaction is all or nothing: SQLite checksums WAL frames and replays only
  committed ones; torn or garbage frames are dropped. A damaged main file is reported as such.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sqlite3
import stat
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from tsm.errors import StoreError

TYPE_CHECKING = False  # typing is left out at run time: the supervisor (python -S) would import it only for this
if TYPE_CHECKING:
    from typing import Any, TypeVar

    _T = TypeVar("_T")

#: Seconds a writer waits for another process's write lock before giving up (``$TSM_STORE_TIMEOUT``).
DEFAULT_TIMEOUT = 30.0

SCHEMA_VERSION = 3

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
CREATE TABLE IF NOT EXISTS holds (
    handle TEXT PRIMARY KEY,
    after TEXT NOT NULL,
    state TEXT NOT NULL,
    msg TEXT NOT NULL DEFAULT '',
    dir TEXT NOT NULL,
    created REAL NOT NULL,
    updated REAL NOT NULL
);
"""


def tsm_home() -> Path:
    """``$TSM_HOME`` (default ``~/.tsm``), created 0700 when missing.

    An existing one must be this user's and writable by nobody else: in a folder another user owns or may
    write to (a guessable name under ``/tmp`` made first by someone else), that user could replace the
    requests a supervisor runs, or the sockets tsm connects to. Such a home raises :class:`StoreError`.
    """
    home = Path(os.environ.get("TSM_HOME") or Path.home() / ".tsm")
    try:
        home.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.stat(home)
    except OSError as e:
        raise StoreError(f"cannot create TSM_HOME {home}: {e.strerror}; set TSM_HOME to a writable directory") from e
    if not stat.S_ISDIR(st.st_mode):
        raise StoreError(f"TSM_HOME {home} is not a directory; set TSM_HOME to a directory")
    if st.st_uid != os.geteuid():
        raise StoreError(f"TSM_HOME {home} belongs to uid {st.st_uid}, not to you (uid {os.geteuid()}); "
                         "set TSM_HOME to a directory of yours")
    if st.st_mode & 0o022:
        raise StoreError(f"TSM_HOME {home} is writable by other users (mode {stat.S_IMODE(st.st_mode):04o}); "
                         f"run chmod go-w {home}, or set TSM_HOME to a directory of yours alone")
    return home


def store_timeout() -> float:
    """``$TSM_STORE_TIMEOUT``: seconds to wait for a busy store (default :data:`DEFAULT_TIMEOUT`)."""
    raw = os.environ.get("TSM_STORE_TIMEOUT", "").strip()
    if not raw:
        return DEFAULT_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise StoreError(f"TSM_STORE_TIMEOUT must be a number of seconds >= 0, not {raw!r}")
    return value


# SQLite primary result codes (``sqlite3`` exposes them as ``sqlite_errorcode`` from Python 3.11).
_BUSY, _LOCKED, _READONLY, _IOERR, _CORRUPT, _FULL, _CANTOPEN, _NOTADB = 5, 6, 8, 10, 11, 13, 14, 26
_BY_TEXT = (  # Python 3.10 has only the message
    ("database is locked", _BUSY), ("is locked", _LOCKED), ("readonly", _READONLY), ("disk i/o", _IOERR),
    ("malformed", _CORRUPT), ("disk is full", _FULL), ("unable to open", _CANTOPEN), ("not a database", _NOTADB),
)
#: Less free space than this under the store, and an I/O error is reported as a full disk.
_NEARLY_FULL = 1 << 20
#: Bytes of the ``-shm`` file whose exclusive lock keeps writers out: the WAL write lock and recovery.
_SHM_WRITER_BYTES = (120, 122)


def _sqlite_code(e: BaseException) -> int | None:
    """The primary SQLite result code of ``e``, or None when it is not an SQLite error."""
    if not isinstance(e, sqlite3.Error):
        return None
    code = getattr(e, "sqlite_errorcode", None)
    if isinstance(code, int):
        return code & 0xFF
    low = str(e).lower()
    return next((c for text, c in _BY_TEXT if text in low), None)


def _is_busy(e: BaseException) -> bool:
    return _sqlite_code(e) in (_BUSY, _LOCKED)


def _file_locks(path: Path) -> list[tuple[int, str, int, float]]:
    """POSIX locks held on ``path`` per ``/proc/locks``: ``(pid, READ|WRITE, first byte, last byte)``."""
    try:
        st = os.stat(path)
        text = Path("/proc/locks").read_text()
    except OSError:
        return []
    want = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    out = []
    for line in text.splitlines():
        f = line.split()
        # "1: POSIX  ADVISORY  WRITE 4071 00:3b:2 120 120"; waiters have "->" after the id and hold nothing.
        if len(f) != 8 or f[5] != want:
            continue
        try:
            out.append((int(f[4]), f[3], int(f[6]), float("inf") if f[7] == "EOF" else int(f[7])))
        except ValueError:
            continue
    return out


def _process(pid: int) -> str:
    """``process 1234 (python -c ..., stopped)``: who a pid is, from ``/proc``, as far as it can be told."""
    details = []
    with contextlib.suppress(OSError):
        cmd = " ".join(Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").replace("\0", " ").split())
        details.append(cmd if len(cmd) <= 60 else cmd[:57] + "...")
    with contextlib.suppress(OSError, IndexError):
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        if state in ("T", "t"):
            details.append("stopped")
    return f"process {pid}" + (f" ({', '.join(details)})" if details else "")


class Store:
    """A connection to the store; cheap to create, one per thread (SQLite connections are not shared).

    Reads run in autocommit mode and see the latest committed data; :meth:`write` runs statements in
    one immediate transaction, waiting up to ``timeout`` seconds (default ``$TSM_STORE_TIMEOUT``) while
    another process holds the write lock. :attr:`read_only` is the reason writes are refused when the
    store could only be opened for reading (empty when it is writable).
    """

    def __init__(self, path: Path | None = None, timeout: float | None = None) -> None:
        self.path = path or tsm_home() / "tsm.db"
        self.timeout = store_timeout() if timeout is None else timeout
        self.read_only = ""
        try:
            self.conn = self._open()
        except StoreError:
            raise
        except (sqlite3.Error, OSError) as e:
            conn = self._open_read_only(e)
            if conn is None:
                raise StoreError(self._describe(e)) from e
            self.conn = conn
            self.read_only = self._describe(e)

    # -- opening -----------------------------------------------------------------------------------
    def _connect(self, target: str | Path, uri: bool = False) -> sqlite3.Connection:
        return sqlite3.connect(target, timeout=self.timeout, isolation_level=None, check_same_thread=False, uri=uri)

    def _open(self) -> sqlite3.Connection:
        """Open for reading and writing, creating or migrating the schema as needed."""
        # Create it 0600 ourselves; SQLite gives its -wal and -shm files the database file's mode.
        if not self.path.exists():
            os.close(os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600))
        conn = self._connect(self.path)
        try:
            version = self._retry(lambda: conn.execute("PRAGMA user_version").fetchone()[0])
            if version != SCHEMA_VERSION:
                self._retry(lambda: self._migrate(conn))
            conn.execute("PRAGMA synchronous=NORMAL")
        except BaseException:
            conn.close()
            raise
        return conn

    def _open_read_only(self, error: BaseException) -> sqlite3.Connection | None:
        """A read-only connection when ``error`` says the disk is full or read-only, else None.

        ``mode=ro`` is SQLite's own read-only mode: it still needs a usable ``-shm`` file. Failing
        that, ``immutable=1`` reads the main file alone, which is right only when nothing is in the WAL
        and nobody has the store open (no lock on it): then the main file holds every commit.
        """
        if self._kind(error) not in ("full", "read-only fs", "read-only"):
            return None
        try:
            if self.path.stat().st_size == 0:
                return None  # never initialised: nothing to read
        except OSError:
            return None
        wal = self.path.with_name(self.path.name + "-wal")
        import urllib.parse  # only for this rescue path: kept out of every command's start-up

        uri = "file:" + urllib.parse.quote(str(self.path.resolve()))
        for params in ("mode=ro", "immutable=1"):
            if params == "immutable=1":
                wal_size = wal.stat().st_size if wal.exists() else 0
                if wal_size or _file_locks(self.path):
                    return None
            try:
                conn = self._connect(f"{uri}?{params}", uri=True)
            except sqlite3.Error:
                continue
            try:
                if conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION:
                    return conn
            except sqlite3.Error:
                pass
            conn.close()
        return None

    def _reopen_for_writing(self) -> None:
        """Leave read-only mode if the store can now be written (space freed, file system remounted)."""
        try:
            conn = self._open()
        except StoreError:
            raise
        except (sqlite3.Error, OSError) as e:
            raise StoreError(self._describe(e)) from e
        self.close()
        self.conn = conn
        self.read_only = ""

    def _migrate(self, conn: sqlite3.Connection) -> None:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("BEGIN IMMEDIATE")
        try:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise StoreError(
                    f"state store {self.path} was written by a newer tsm (schema {version} > {SCHEMA_VERSION}); "
                    "upgrade tsm or set TSM_HOME to another directory"
                )
            if version != SCHEMA_VERSION:
                for statement in filter(str.strip, _SCHEMA.split(";")):
                    conn.execute(statement)
                self._add_missing_columns(conn)
                conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            conn.execute("COMMIT")
        except BaseException:
            # SQLite may already have rolled back (a full disk does): a failing ROLLBACK must not hide why.
            if conn.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
            raise

    @staticmethod
    def _add_missing_columns(conn: sqlite3.Connection) -> None:
        """Bring tables made by an older tsm up to date: add every column the schema has and they lack."""
        import re

        for table, body in re.findall(r"CREATE TABLE IF NOT EXISTS (\w+) \((.*?)\n\)", _SCHEMA, re.S):
            have = {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}
            for line in body.strip().splitlines():
                column = line.strip().rstrip(",")
                name = column.split()[0]
                if name.isupper() or name in have:  # PRIMARY KEY clause, or already there
                    continue
                conn.execute(f"ALTER TABLE {table} ADD COLUMN {column}")

    # -- errors ------------------------------------------------------------------------------------
    def _kind(self, e: BaseException) -> str:
        """What went wrong, as one of: locked, damaged, full, read-only fs, read-only, cannot open, io, other."""
        code = _sqlite_code(e)
        if code in (_BUSY, _LOCKED):
            return "locked"
        if code in (_CORRUPT, _NOTADB):
            return "damaged"
        err = e.errno if isinstance(e, OSError) else None
        if code == _FULL or err in (errno.ENOSPC, errno.EDQUOT):
            return "full"
        try:
            fs = os.statvfs(self.path.parent)
        except OSError:
            fs = None
        if fs is not None and fs.f_flag & os.ST_RDONLY and (code in (_READONLY, _IOERR, _CANTOPEN) or err is not None):
            return "read-only fs"
        if code == _READONLY or err in (errno.EROFS, errno.EACCES, errno.EPERM):
            return "read-only"
        if code in (_IOERR, _CANTOPEN) or err is not None:
            # SQLite reports a -shm or WAL file it cannot grow as an I/O error: look at the disk.
            free = (fs.f_bfree if os.geteuid() == 0 else fs.f_bavail) * fs.f_frsize if fs else _NEARLY_FULL
            if free < _NEARLY_FULL:
                return "full"
            if code == _CANTOPEN and not os.access(self.path.parent, os.W_OK):
                return "read-only"
            return "io" if code == _IOERR else "cannot open"
        return "other"

    def _describe(self, e: BaseException) -> str:
        """One line that says what failed and what to do about it."""
        path, where = self.path, self.path.parent
        text = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        kind = self._kind(e)
        if kind == "full":
            return f"no space left on device under {where} (state store {path.name}): free space there or set TSM_HOME elsewhere"
        if kind == "read-only fs":
            return f"state store {path} is on a read-only file system: remount {where} read-write or set TSM_HOME elsewhere"
        if kind == "read-only":
            return f"state store {path} is read-only: make it and {where} writable or set TSM_HOME elsewhere"
        if kind == "locked":
            holders = self._lock_holders()
            others = [_process(pid) for pid in holders if pid != os.getpid()]
            who = ", ".join(others) or ("another connection in this process" if holders else "another process")
            return (
                f"state store {path} is locked: {who} has held its write lock for over {self.timeout:g}s; "
                "wait for it or end it (TSM_STORE_TIMEOUT sets how long tsm waits)"
            )
        if kind == "damaged":
            return f"state store {path} is damaged ({text}); move it aside (with its -wal and -shm files) and tsm will start a new one"
        if kind == "cannot open":
            return f"cannot open the state store {path} ({text}): check that {where} exists and is writable"
        if kind == "io":
            return f"state store {path}: {text}: check the disk under {where}"
        return f"state store {path}: {text}"

    def _lock_holders(self) -> list[int]:
        """Pids that keep writers out: the WAL write or recovery lock in ``-shm``, or a write lock on the file."""
        shm = [
            pid for pid, rw, first, last in _file_locks(self.path.with_name(self.path.name + "-shm"))
            if rw == "WRITE" and any(first <= byte <= last for byte in _SHM_WRITER_BYTES)
        ]
        main = [pid for pid, rw, _, _ in _file_locks(self.path) if rw == "WRITE"]
        return [pid for pid in dict.fromkeys(shm + main) if pid > 0]

    # -- use ---------------------------------------------------------------------------------------
    def _retry(self, fn: Callable[[], _T]) -> _T:
        """``fn()``, retried with back-off while the database is busy, for up to ``timeout`` seconds."""
        delay = 0.005
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                return fn()
            except sqlite3.OperationalError as e:
                left = deadline - time.monotonic()
                if not _is_busy(e) or left <= 0:
                    raise
                import random  # only while another process holds the database

                time.sleep(min(delay * (1 + random.random()), left))
                delay = min(delay * 2, 0.2)

    def write(self, statements: Sequence[tuple[str, Sequence[Any]]]) -> int:
        """Run ``(sql, params)`` statements in one transaction, waiting while another process writes.

        Returns the number of rows the statements changed (what a conditional ``UPDATE`` needs to know
        whether it took effect, without a second query).
        """
        if self.read_only:
            self._reopen_for_writing()
        conn = self.conn

        def run() -> int:
            conn.execute("BEGIN IMMEDIATE")
            try:
                changed = 0
                for sql, params in statements:
                    changed += max(conn.execute(sql, params).rowcount, 0)
                conn.execute("COMMIT")
                return changed
            except BaseException:
                if conn.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        conn.execute("ROLLBACK")
                raise

        try:
            return self._retry(run)
        except sqlite3.Error as e:
            raise StoreError(self._describe(e)) from e

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        """One statement over many rows in one transaction."""
        self.write([(sql, r) for r in rows])

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[sqlite3.Row]:
        """Rows of a read-only query, as ``sqlite3.Row`` (index by column name)."""

        def run() -> list[sqlite3.Row]:
            cur = self.conn.execute(sql, params)
            cur.row_factory = sqlite3.Row
            return cur.fetchall()

        try:
            return self._retry(run)
        except sqlite3.Error as e:
            raise StoreError(self._describe(e)) from e

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
