"""The state store: creation, permissions, migration, clear errors, concurrency, and faults (full and read-only
disks, locks left by killed or stopped processes, crashes mid-write, torn WAL, damaged files)."""

from __future__ import annotations

import contextlib
import errno
import multiprocessing
import os
import random
import re
import select
import signal
import sqlite3
import stat
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

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


@pytest.mark.reliability(
    "a TSM_HOME another user made first, or may write to, is refused",
    expect="a home owned by another uid, or writable by group or others (a guessed name under /tmp), raises one "
    "StoreError saying what to do; nothing is written in it",
    group="Security",
)
def test_a_home_that_is_not_the_users_alone_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    monkeypatch.setenv("TSM_HOME", str(shared))
    for mode in (0o777, 0o775, 0o1777, 0o757):
        shared.chmod(mode)
        with pytest.raises(StoreError, match="writable by other users.*chmod go-w"):
            tsm_home_fn()
        r = subprocess.run([sys.executable, "-m", "tsm.cli.main", "list"], capture_output=True, text=True,
                           timeout=60, env={**os.environ, **CHILD_ENV})
        assert r.returncode == 1 and r.stderr.count("\n") == 1 and "writable by other users" in r.stderr, r
    assert list(shared.iterdir()) == []
    shared.chmod(0o755)  # readable by others is the owner's choice; the files in it stay private
    assert tsm_home_fn() == shared
    if os.geteuid() == 0:
        theirs = tmp_path / "theirs"
        theirs.mkdir(mode=0o700)
        os.chown(theirs, 65534, 65534)
        monkeypatch.setenv("TSM_HOME", str(theirs))
        with pytest.raises(StoreError, match="belongs to uid 65534"):
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


def test_write_says_how_many_rows_its_statements_changed(tsm_home: Path) -> None:
    """A conditional UPDATE's effect is known from the write itself (the supervisor's registration uses it)."""
    row = ("h", "local", "s", "a", "n", 0, 0.0, 0.0, None, None)
    with Store() as store:
        assert store.write([(APP_SQL, row), (APP_SQL, ("h2", *row[1:]))]) == 2
        assert store.write([("UPDATE apps SET state=1 WHERE handle=? AND state=0", ("h",))]) == 1
        assert store.write([("UPDATE apps SET state=1 WHERE handle=? AND state=0", ("h",))]) == 0  # taken already
        assert store.write([("UPDATE apps SET state=2 WHERE handle IN ('h', 'h2', 'nope')", ())]) == 2
        assert store.write([("SELECT 1", ())]) == 0  # no change, not -1


# -- faults: full and read-only disks, locks held by dead or stuck processes, crashes mid-write ----------
# These use real tmpfs mounts (root), real SQLite files and real processes killed with real signals.

APP_SQL = "INSERT INTO apps VALUES (?,?,?,?,?,?,?,?,?,?)"
CHILD_ENV = {"PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}


def _app(handle: str, spec: str | None = None) -> tuple[str, tuple[object, ...]]:
    """The statement that records a (finished) app called ``handle``."""
    return (APP_SQL, (handle, "local", "default", handle, "n", 4, 0.0, 0.0, spec, None))


def _handles(path: Path) -> list[str]:
    """The app handles committed in the store at ``path``, read with plain sqlite3 (not through Store)."""
    conn = sqlite3.connect(path)
    try:
        return sorted(r[0] for r in conn.execute("SELECT handle FROM apps"))
    finally:
        conn.close()


def _integrity(path: Path) -> str:
    conn = sqlite3.connect(path)
    try:
        return str(conn.execute("PRAGMA integrity_check").fetchone()[0])
    finally:
        conn.close()


def _one_line(e: BaseException) -> str:
    text = str(e)
    assert "\n" not in text and text, text
    return text


@pytest.fixture
def tmpfs(tmp_path: Path, in_ci: bool) -> Iterator[Callable[[str], Path]]:
    """``tmpfs("512k")`` mounts a tiny tmpfs and returns its mount point; all are unmounted after the test."""
    mounted: list[Path] = []

    def mount(size: str) -> Path:
        why = "" if os.geteuid() == 0 else "needs root to mount a tmpfs"
        point = tmp_path / f"fs{len(mounted)}"
        point.mkdir()
        if not why:
            r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(point)],
                               capture_output=True, text=True)
            why = f"cannot mount a tmpfs: {r.stderr.strip()}" if r.returncode else ""
        if why:
            if in_ci:
                pytest.fail(f"{why}, and CI must run the store fault tests")
            pytest.skip(why)
        mounted.append(point)
        return point

    try:
        yield mount
    finally:
        for point in reversed(mounted):
            if subprocess.run(["umount", str(point)], capture_output=True).returncode:
                subprocess.run(["umount", "-l", str(point)], capture_output=True)


def _remount(point: Path, mode: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{mode}", str(point)], check=True, capture_output=True)


def _fill(fs: Path) -> Path:
    """Write a filler file until the file system says ENOSPC; delete the returned file to free the space."""
    filler = fs / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for chunk in (1 << 16, 1 << 12, 1):
            try:
                while True:
                    os.write(fd, b"\0" * chunk)
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
    finally:
        os.close(fd)
    assert os.statvfs(fs).f_bfree == 0
    return filler


def _child(code: str, *args: str) -> subprocess.Popen[bytes]:
    """A Python child process running ``code`` with tsm importable and the test's TSM_HOME."""
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        bufsize=0, env={**os.environ, **CHILD_ENV},
    )


def _read_line(proc: subprocess.Popen[bytes], timeout: float = 30.0) -> str:
    """The child's next output line; fails (rather than hangs) when it does not come."""
    assert proc.stdout is not None
    fd, line, deadline = proc.stdout.fileno(), b"", time.monotonic() + timeout
    while not line.endswith(b"\n"):  # byte by byte, so nothing is left in a buffer select() cannot see
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        assert ready, "the child process said nothing"
        byte = os.read(fd, 1)
        assert byte, f"the child process ended (exit code {proc.wait()})"
        line += byte
    return line.decode().strip()


def _kill(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the child (waking it first if stopped) and reap it."""
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGKILL)
        proc.send_signal(signal.SIGCONT)
    proc.wait(10)
    for f in (proc.stdin, proc.stdout):
        if f is not None:
            f.close()


def _tsm(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run the ``tsm`` command line in a fresh process."""
    return subprocess.run(
        [sys.executable, "-m", "tsm.cli.main", *args], capture_output=True, text=True, timeout=60,
        env={**os.environ, **CHILD_ENV, **env},
    )


def _assert_one_line_error(r: subprocess.CompletedProcess[str], pattern: str) -> None:
    assert r.returncode != 0, r
    assert "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert re.search(pattern, lines[0], re.I), lines[0]


@pytest.mark.reliability(
    "store on a full disk",
    expect="writes raise one clear StoreError; committed records intact, integrity ok; reads keep working; "
    "writes work again once space is freed",
    group="Faults",
)
def test_full_disk(tmpfs: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch, figure: Any) -> None:
    home = tmpfs("1m")
    monkeypatch.setenv("TSM_HOME", str(home))
    db = home / "tsm.db"
    with Store() as store:
        store.write([_app("before")])
    writer = Store()  # a long-lived writer (like a supervisor) that has the store open when the disk fills
    writer.write([_app("also-before")])
    filler = _fill(home)
    big = "x" * 200_000
    with pytest.raises(StoreError) as info:
        writer.write([_app("big", big)])
    message = _one_line(info.value)
    assert f"no space left on device under {home}" in message and "TSM_HOME" in message
    assert writer.query("SELECT COUNT(*) FROM apps")[0][0] == 2  # the same connection still reads
    with Store() as other, pytest.raises(StoreError, match="no space left on device"):
        other.write([_app("small")])
    assert _integrity(db) == "ok" and _handles(db) == ["also-before", "before"]
    filler.unlink()
    writer.write([_app("big", big)])  # the same connection writes again once space is freed
    writer.close()
    assert sorted(os.listdir(home)) == ["tsm.db"]  # closed cleanly
    # A new user of the store while the disk is full and nobody has it open: SQLite cannot size its
    # -shm file, so the store is opened read-only: it can read, not write, until space is freed.
    filler = _fill(home)
    with Store() as reader:
        assert sorted(r["handle"] for r in reader.query("SELECT handle FROM apps")) == ["also-before", "before", "big"]
        assert reader.read_only.startswith(f"no space left on device under {home}")
        with pytest.raises(StoreError, match="no space left on device"):
            reader.write([_app("big2", big)])
        filler.unlink()
        assert _integrity(db) == "ok" and _handles(db) == ["also-before", "before", "big"]
        start = time.perf_counter()
        reader.write([_app("big2", big)])  # the same Store recovers by itself once space is freed
        figure("first write after freeing space took", time.perf_counter() - start, "s")
        assert reader.read_only == ""
    assert _integrity(db) == "ok"
    assert _handles(db) == ["also-before", "before", "big", "big2"]


@pytest.mark.reliability(
    "new store on a full disk",
    expect="opening raises one clear StoreError (no traceback, no half-made schema); works once space is freed",
    group="Faults",
)
def test_new_store_on_full_disk(tmpfs: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch) -> None:
    fs = tmpfs("256k")
    filler = _fill(fs)
    home = fs / "home"
    monkeypatch.setenv("TSM_HOME", str(home))
    for _ in range(2):  # a second try sees the first one's leftovers (an empty tsm.db, -wal, -shm)
        with pytest.raises(StoreError) as info:
            Store()
        assert _one_line(info.value).startswith(f"no space left on device under {home}")
    r = _tsm("list")
    _assert_one_line_error(r, f"no space left on device under {re.escape(str(home))}.*TSM_HOME")
    filler.unlink()
    with Store() as store:
        store.write([_app("after")])
        assert store.query("PRAGMA user_version")[0][0] == SCHEMA_VERSION
    assert _integrity(home / "tsm.db") == "ok" and _handles(home / "tsm.db") == ["after"]


@pytest.mark.reliability(
    "tsm commands on a full disk",
    expect="tsm list still lists; tsm run fails with one line on stderr, exit 1, no traceback",
    group="Faults",
)
def test_cli_on_full_disk(tmpfs: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmpfs("1m")
    monkeypatch.setenv("TSM_HOME", str(home))
    with Store() as store:
        store.write([_app("local://default/before-1")])
    filler = _fill(home)
    r = _tsm("list")
    assert r.returncode == 0 and "local://default/before-1" in r.stdout and not r.stderr, r
    r = _tsm("run", "utils.echo", "--msg", "hi")
    _assert_one_line_error(r, "no space left on device")
    filler.unlink()
    assert _integrity(home / "tsm.db") == "ok" and _handles(home / "tsm.db") == ["local://default/before-1"]


@pytest.mark.reliability(
    "store on a read-only file system",
    expect="existing state stays readable (also with an unmerged WAL); writes and a new store raise one "
    "StoreError naming the path and saying read-only; nothing corrupted",
    group="Faults",
)
def test_read_only_file_system(tmpfs: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmpfs("1m")
    monkeypatch.setenv("TSM_HOME", str(home))
    db = home / "tsm.db"
    with Store() as store:
        store.write([_app("local://default/clean-1")])
    # Closed cleanly: only tsm.db is left, and SQLite alone cannot open it on a read-only file system.
    _remount(home, "ro")
    with Store() as store:
        assert [r["handle"] for r in store.query("SELECT handle FROM apps")] == ["local://default/clean-1"]
        with pytest.raises(StoreError) as info:
            store.write([_app("nope")])
        message = _one_line(info.value)
        assert str(db) in message and "read-only file system" in message
    r = _tsm("list")
    assert r.returncode == 0 and "local://default/clean-1" in r.stdout, r
    r = _tsm("run", "utils.echo", "--msg", "hi")
    _assert_one_line_error(r, "read-only file system")
    # A writer crashed after committing: its commit is only in the WAL, which must not be ignored.
    _remount(home, "rw")
    child = _child("""
        from tsm.store import Store
        Store().write([("INSERT INTO apps (handle, scheduler, session, app_id, name, state, created, updated) "
                        "VALUES ('in-wal', 'local', 'default', 'in-wal', 'n', 4, 0, 0)", ())])
        print("committed", flush=True)
        input()
    """)
    try:
        assert _read_line(child) == "committed"
    finally:
        _kill(child)
    assert Path(f"{db}-wal").stat().st_size > 0
    _remount(home, "ro")
    with Store() as store:
        assert sorted(r["handle"] for r in store.query("SELECT handle FROM apps")) == ["in-wal", "local://default/clean-1"]
    # Without its -shm the WAL cannot be read on a read-only file system: a clear error, never stale data.
    _remount(home, "rw")
    shm = Path(f"{db}-shm").read_bytes()
    Path(f"{db}-shm").unlink()
    _remount(home, "ro")
    with pytest.raises(StoreError, match=f"{re.escape(str(db))} is on a read-only file system"):
        Store()
    # A new store on a read-only file system.
    monkeypatch.setenv("TSM_HOME", str(home / "empty"))
    _remount(home, "rw")
    (home / "empty").mkdir()
    _remount(home, "ro")
    with pytest.raises(StoreError, match="read-only file system"):
        Store()
    _assert_one_line_error(_tsm("list"), f"{re.escape(str(home))}/empty/tsm.db is on a read-only file system")
    _remount(home, "rw")
    Path(f"{db}-shm").write_bytes(shm)
    assert _integrity(db) == "ok"
    monkeypatch.setenv("TSM_HOME", str(home))
    with Store() as store:
        store.write([_app("after")])
    assert _handles(db) == ["after", "in-wal", "local://default/clean-1"]


_HOLD_TSM = """
    import sys
    from tsm.store import Store

    def statements():
        yield ("INSERT INTO apps (handle, scheduler, session, app_id, name, state, created, updated) "
               "VALUES ('uncommitted', 'local', 'default', 'u', 'n', 1, 0, 0)", ())
        print("holding", flush=True)
        input()  # mid-transaction until killed

    Store().write(statements())
"""
_HOLD_FOREIGN = """
    import os, sqlite3
    conn = sqlite3.connect(os.environ["TSM_HOME"] + "/tsm.db", isolation_level=None)
    conn.execute("BEGIN EXCLUSIVE")
    conn.execute("INSERT INTO apps (handle, scheduler, session, app_id, name, state, created, updated) "
                 "VALUES ('uncommitted', 'local', 'default', 'u', 'n', 1, 0, 0)")
    print("holding", flush=True)
    input()
"""


@pytest.mark.reliability(
    "store lock left by a killed process",
    expect="the next writer goes ahead at once; committed data intact, the dead writer's uncommitted rows absent",
    group="Faults",
)
@pytest.mark.parametrize("holder", [_HOLD_TSM, _HOLD_FOREIGN], ids=["tsm-write", "sqlite3-begin-exclusive"])
def test_lock_of_killed_process(tsm_home: Path, holder: str, figure: Any) -> None:
    with Store() as store:
        store.write([_app("committed")])
    child = _child(holder)
    try:
        assert _read_line(child) == "holding"
        with Store(timeout=0) as store, pytest.raises(StoreError, match=f"locked: process {child.pid}"):
            store.write([_app("while-held")])
    finally:
        _kill(child)
    start = time.perf_counter()
    with Store(timeout=5) as store:
        store.write([_app("after")])
        figure("next write after the holder was killed took", time.perf_counter() - start, "s", limit=0.5)
    assert _handles(tsm_home / "tsm.db") == ["after", "committed"]
    assert _integrity(tsm_home / "tsm.db") == "ok"


@pytest.mark.reliability(
    "store lock held forever by a stopped process",
    expect="readers go on; a writer gives up after its bounded wait with a StoreError naming the holder's pid; "
    "tsm run says so in one line",
    group="Faults",
)
def test_lock_held_by_stopped_process(tsm_home: Path, figure: Any) -> None:
    with Store() as store:
        store.write([_app("committed")])
    child = _child(_HOLD_TSM)
    try:
        assert _read_line(child) == "holding"
        child.send_signal(signal.SIGSTOP)
        with Store(timeout=1.0) as store:
            assert [r["handle"] for r in store.query("SELECT handle FROM apps")] == ["committed"]
            start = time.perf_counter()
            with pytest.raises(StoreError) as info:
                store.write([_app("blocked")])
            figure("writer gave up after", time.perf_counter() - start, "s", limit=1.5)
        message = _one_line(info.value)
        assert f"locked: process {child.pid} (" in message and "stopped)" in message, message
        assert "TSM_STORE_TIMEOUT" in message
        r = _tsm("run", "utils.echo", "--msg", "hi", TSM_STORE_TIMEOUT="0.5")
        _assert_one_line_error(r, f"state store .* is locked: process {child.pid} ")
        assert _tsm("list").returncode == 0
    finally:
        _kill(child)
    with Store(timeout=5) as store:
        store.write([_app("after")])
    assert _handles(tsm_home / "tsm.db") == ["after", "committed"]


def test_store_timeout_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TSM_STORE_TIMEOUT", "2.5")
    assert Store().timeout == 2.5
    monkeypatch.setenv("TSM_STORE_TIMEOUT", "soon")
    with pytest.raises(StoreError, match="TSM_STORE_TIMEOUT must be a number of seconds"):
        Store()


_BIG_WRITER = """
    import sys
    from tsm.store import Store

    store = Store()
    store.conn.execute("PRAGMA cache_size=8")  # spill pages to the WAL before commit, like a big write does
    rows_per_tx, first, stop_midway = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "stop-midway"

    def rows(tx):
        for i in range(rows_per_tx):
            if stop_midway and i == rows_per_tx // 2:
                print("midway", flush=True)
                input()  # until killed
            yield ("INSERT INTO apps VALUES (?,?,?,?,?,?,?,?,?,?)",
                   (f"tx{tx}-{i}", "local", "default", str(tx), "n", 4, 0, 0, "x" * 1000, None))

    for tx in range(first, 10**6):
        store.write(rows(tx))
        print(f"committed {tx}", flush=True)
"""


@pytest.mark.reliability(
    "writer SIGKILLed in a large multi-row transaction",
    expect="each transaction is all or nothing: no partial rows; every transaction reported committed is whole",
    group="Faults",
)
def test_writer_killed_mid_transaction(tsm_home: Path, figure: Any) -> None:
    db, wal = tsm_home / "tsm.db", tsm_home / "tsm.db-wal"
    with Store() as store:
        store.write([_app("committed")])
    # Killed half-way through a transaction whose pages are already in the WAL file.
    child = _child(_BIG_WRITER, "400", "0", "stop-midway")
    try:
        assert _read_line(child) == "midway"
        assert wal.stat().st_size > 100 * 1024  # uncommitted frames really are on disk
    finally:
        _kill(child)
    start = time.perf_counter()
    with Store() as store:
        assert store.query("SELECT COUNT(*) FROM apps")[0][0] == 1
        figure("store usable after the crash in", time.perf_counter() - start, "s")
    # Killed at random moments while committing one 300-row transaction after another.
    rng = random.Random(6)
    survived = 0
    for round_ in range(1, 6):
        first = round_ * 1000
        child = _child(_BIG_WRITER, "300", str(first), "no")
        try:
            assert _read_line(child) == f"committed {first}"
            time.sleep(rng.uniform(0.0, 0.15))
        finally:
            _kill(child)
        conn = sqlite3.connect(db)
        counts = dict(conn.execute("SELECT app_id, COUNT(*) FROM apps WHERE app_id != 'committed' GROUP BY app_id"))
        conn.close()
        assert set(counts.values()) == {300}, counts  # whole transactions only
        assert str(first) in counts  # reported committed, so there
        survived = len(counts)
    assert _integrity(db) == "ok" and "committed" in _handles(db)
    figure("whole transactions committed between the kills", survived, "transactions")


_COMMIT_TWO = """
    import os
    from tsm.store import Store

    store = Store()
    wal = os.environ["TSM_HOME"] + "/tsm.db-wal"
    for tx in ("A", "B"):
        store.write([("INSERT INTO apps VALUES (?,?,?,?,?,?,?,?,?,?)",
                      (f"{tx}{i}", "local", "default", tx, "n", 4, 0, 0, "y" * 500, None)) for i in range(20)])
        print(os.path.getsize(wal), flush=True)
    input()
"""


@pytest.mark.reliability(
    "torn or garbage WAL after a crash",
    expect="the store opens; committed transactions intact, a torn last one dropped whole; integrity ok",
    group="Faults",
)
@pytest.mark.parametrize("damage", ["garbage appended", "last transaction cut short", "last frame overwritten"])
def test_torn_wal(tsm_home: Path, damage: str) -> None:
    db, wal = tsm_home / "tsm.db", tsm_home / "tsm.db-wal"
    Store().close()
    child = _child(_COMMIT_TWO)
    try:
        after_a, after_b = int(_read_line(child)), int(_read_line(child))
    finally:
        _kill(child)  # a crash: the WAL is never checkpointed, its -shm is stale
    assert wal.stat().st_size == after_b > after_a
    garbage = random.Random(damage).randbytes(20_000)
    with wal.open("r+b") as f:
        if damage == "garbage appended":
            f.seek(0, os.SEEK_END)
            f.write(garbage)
        elif damage == "last transaction cut short":
            f.truncate(after_a + (after_b - after_a) // 2)
        else:
            f.seek(after_b - 2000)
            f.write(garbage[:1000])
    expected = {"A"} if damage != "garbage appended" else {"A", "B"}
    with Store() as store:
        counts = {r[0]: r[1] for r in store.query("SELECT app_id, COUNT(*) FROM apps GROUP BY app_id")}
        assert counts == dict.fromkeys(expected, 20)
        assert store.query("PRAGMA integrity_check")[0][0] == "ok"
        store.write([_app("after")])
    assert "after" in _handles(db)


@pytest.mark.reliability(
    "damaged main store file",
    expect="one StoreError that says the store is damaged and what to do; never a raw sqlite3 error",
    group="Faults",
)
@pytest.mark.parametrize("damage", ["truncated", "garbage header", "garbage pages"])
def test_damaged_main_file(tsm_home: Path, damage: str) -> None:
    db = tsm_home / "tsm.db"
    with Store() as store:
        store.executemany(APP_SQL, [(f"h{i}", "local", "default", "a", "n", 4, 0.0, 0.0, "z" * 1000, None)
                                    for i in range(300)])
    size = db.stat().st_size
    assert size > 300 * 1000 and not Path(f"{db}-wal").exists()  # all in the main file
    with db.open("r+b") as f:
        if damage == "truncated":
            f.truncate(size // 2)
        elif damage == "garbage header":
            f.write(b"\xff" * 100)
        else:
            f.seek(4096)
            f.write(random.Random(1).randbytes(size - 8192))
    with pytest.raises(StoreError) as info, Store() as store:
        store.query("SELECT COUNT(*), SUM(LENGTH(spec)) FROM apps")
        store.write([_app("more")])
    message = _one_line(info.value)
    assert f"state store {db} is damaged" in message and "move it aside" in message
    _assert_one_line_error(_tsm("list"), f"state store {re.escape(str(db))} is damaged")


@pytest.mark.reliability(
    "a full $TSM_HOME leaves the controls in the user's hands",
    expect="with an app running and no space left: tsm list and tsm status show it, tsm cancel stops it "
    "(exit 0, every process gone); an error that must happen says the disk is full",
    group="Faults",
)
def test_reads_and_cancel_work_on_a_full_disk(tmpfs: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch,
                                              tmp_path: Path) -> None:
    home = tmpfs("8m")
    monkeypatch.setenv("TSM_HOME", str(home))
    started = tmp_path / "pid"
    code = f"import os, time\nopen({str(started)!r}, 'w').write(str(os.getpid()))\ntime.sleep(600)"
    r = _tsm("run", "--detach", "utils.python", "-c", code)
    assert r.returncode == 0, r
    handle = r.stdout.split()[-1]
    from testutil import wait_until

    wait_until(lambda: started.exists() and started.read_text() != "", "the replica's start", timeout=60)
    pid = int(started.read_text())
    filler = _fill(home)  # nothing read the app since its launch: its history row still says SUBMITTED
    try:
        r = _tsm("list")
        assert r.returncode == 0 and handle in r.stdout and "RUNNING" in r.stdout and not r.stderr, r
        r = _tsm("status", handle)
        assert r.returncode == 0 and "RUNNING" in r.stdout and not r.stderr, r
        r = _tsm("cancel", handle)
        assert r.returncode == 0 and "Traceback" not in r.stderr and "full" in r.stderr, r
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 0)
            raise AssertionError(f"the replica {pid} still runs after tsm cancel")
        r = _tsm("run", "utils.echo")  # what cannot work on a full disk says so
        _assert_one_line_error(r, "no space left|disk is full")
    finally:
        filler.unlink()
    r = _tsm("wait", handle)  # once there is room, the outcome is recorded
    assert "CANCELLED" in r.stdout, r


def test_a_dead_supervisor_is_reported_on_a_full_disk(tmpfs: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch,
                                                      tmp_path: Path) -> None:
    """A reader that finds an app's supervisor and watchdog gone records it FAILED; on a full disk it still says so."""
    home = tmpfs("8m")
    monkeypatch.setenv("TSM_HOME", str(home))
    r = _tsm("run", "--detach", "utils.sh", "--", "sleep", "600")
    assert r.returncode == 0, r
    handle = r.stdout.split()[-1]
    app_id = handle.rsplit("/", 1)[1]
    with Store() as store:
        row = store.query("SELECT sup_pid, watchdog_pid FROM local_apps WHERE app_id=?", (app_id,))[0]
    for pid in (row["watchdog_pid"], row["sup_pid"]):  # the watchdog first: nobody records how they died
        os.kill(pid, signal.SIGKILL)
    from testutil import wait_all_gone

    wait_all_gone([row["watchdog_pid"], row["sup_pid"]])
    filler = _fill(home)
    try:
        r = _tsm("status", handle)
        assert r.returncode == 0 and "FAILED" in r.stdout and "supervisor died" in r.stdout, r
    finally:
        filler.unlink()
    r = _tsm("status", handle)  # with room again, the reader records it
    assert "FAILED" in r.stdout, r
