"""Log reading and following of the local scheduler against what an attack found (issue 11).

Real apps, real supervisors, real files: followers across retried attempts, a follower of a replica that
ended while its app runs, lines far longer than any buffer, ``\\r`` progress bars. Time limits are hang
guards only, never performance claims (figures are in ``benchmarks/log_reading.py``).
"""

from __future__ import annotations

import os
import queue
import threading
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from testutil import py, wait_until
from tsm.errors import InvalidRunOptionError
from tsm.schedulers.api import Stream
from tsm.schedulers.local import logs
from tsm.schedulers.local.logs import MAX_LINE, LineSplitter, LogEvent
from tsm.schedulers.local.scheduler import LocalScheduler
from tsm.specs import AppDef, AppState, RetryPolicy

HANG = 60.0  # seconds: a guard against a hang, never a performance claim

# Replica a/0 fails on its first attempt (leaving an unfinished line) and succeeds on its second. The
# others, in their first attempt, wait for a/0's second attempt (when the policy does not restart them)
# or stop slowly on SIGTERM (when it does), so the group's restart takes a moment during which a/0 is
# FAILED in the store while its app goes on.
FLAKY = """
    import os, signal, sys, time
    me = os.environ["TSM_ROLE_NAME"] + os.environ["TSM_REPLICA_ID"]
    seen = os.path.join(sys.argv[1], me)
    again = os.path.join(sys.argv[1], "a0-again")
    second = os.path.exists(seen)
    open(seen, "a").close()
    if second:
        if me == "a0":
            open(again, "a").close()
        print(me, "attempt 1 first", flush=True)
        print(me, "attempt 1 last", flush=True)
        sys.exit(0)
    print(me, "attempt 0 first", flush=True)
    if me == "a0":
        sys.stdout.write("a0 unfinished")
        sys.stdout.flush()
        time.sleep(0.3)
        sys.exit(3)
    signal.signal(signal.SIGTERM, lambda *_: (time.sleep(0.5), sys.exit(0)))
    while not os.path.exists(again):
        time.sleep(0.02)
    print(me, "attempt 0 last", flush=True)
"""
REPLICAS = (("a", 0), ("a", 1), ("b", 0))


def flaky_app(policy: RetryPolicy, tmp: Path) -> AppDef:
    a = py(FLAKY, "a", num_replicas=2, max_retries=1, retry_policy=policy)
    b = py(FLAKY, "b", max_retries=1, retry_policy=policy)
    a.args.append(str(tmp))
    b.args.append(str(tmp))
    return AppDef("flaky", [a, b])


def restarted(policy: RetryPolicy) -> set[str]:
    return {"REPLICA": {"a0"}, "ROLE": {"a0", "a1"}, "APPLICATION": {"a0", "a1", "b0"}}[policy.value]


def expected(me: str, again: bool) -> list[tuple[int, str]]:
    """``(attempt, line)`` replica ``me`` prints; a0's unfinished line is a line of its own."""
    if me == "a0":
        return [(0, "a0 attempt 0 first\n"), (0, "a0 unfinished"), (1, "a0 attempt 1 first\n"), (1, "a0 attempt 1 last\n")]
    if again:
        return [(0, f"{me} attempt 0 first\n"), (1, f"{me} attempt 1 first\n"), (1, f"{me} attempt 1 last\n")]
    return [(0, f"{me} attempt 0 first\n"), (0, f"{me} attempt 0 last\n")]


def follow_in_thread(app_id: str, role: str, k: int, **kw: Any) -> tuple[threading.Thread, list[str]]:
    """Follow one replica from another thread (a scheduler of its own: one store connection per thread)."""
    got: list[str] = []

    def run() -> None:
        s = LocalScheduler("test")
        try:
            got.extend(s.log_iter(app_id, role, k, should_tail=True, **kw))
        finally:
            s.close()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, got


# -- item 2: followers continue across attempts ------------------------------------------------------------
@pytest.mark.parametrize("policy", [RetryPolicy.REPLICA, RetryPolicy.ROLE, RetryPolicy.APPLICATION])
def test_followers_continue_across_attempts(sched: LocalScheduler, tmp_path: Path, policy: RetryPolicy) -> None:
    app_id = sched.submit(flaky_app(policy, tmp_path), {"grace_period": 10.0})
    # Followers started at once, while attempt 0 runs: one per replica, and one for the whole app.
    singles = {(role, k): follow_in_thread(app_id, role, k) for role, k in REPLICAS}
    events = list(sched.log_iter_many(app_id, None, should_tail=True))
    desc = sched.wait(app_id, timeout=HANG)
    assert desc is not None and desc.state == AppState.SUCCEEDED, desc
    again = restarted(policy)
    for role, k in REPLICAS:
        me = f"{role}{k}"
        want = expected(me, me in again)
        t, got = singles[(role, k)]
        t.join(HANG)
        assert not t.is_alive(), f"follower of {me} hung"
        assert got == [line for _, line in want], (me, got)
        # The multiplexed follower: every line in order, and a marker where attempt 1 begins.
        mine = [e for e in events if (e.role, e.k) == (role, k)]
        assert [(e.attempt, e.text) for e in mine if not e.marker] == want, (me, mine)
        markers = [i for i, e in enumerate(mine) if e.marker]
        if me in again:
            assert len(markers) == 1 and mine[markers[0]].attempt == 1, mine
            assert mine[markers[0] - 1].text == want[-3][1]  # between the attempts
        else:
            assert markers == [], mine


def test_log_lines_offer_every_attempt_in_order_and_each_alone(sched: LocalScheduler, tmp_path: Path) -> None:
    app_id = sched.submit(flaky_app(RetryPolicy.ROLE, tmp_path), {"grace_period": 10.0})
    desc = sched.wait(app_id, timeout=HANG)
    assert desc is not None and desc.state == AppState.SUCCEEDED, desc
    lines = [line for _, line in expected("a0", True)]
    for streams in (None, Stream.STDOUT):  # combined (index) and single-stream (fast) readers alike
        # The unfinished last line of attempt 0 is its own line, never glued to attempt 1's first line.
        assert list(sched.log_iter(app_id, "a", 0, streams=streams)) == lines
        assert list(sched.log_iter(app_id, "a", 0, streams=streams, attempt=0)) == lines[:2]
        assert list(sched.log_iter(app_id, "a", 0, streams=streams, attempt=1)) == lines[2:]
        assert list(sched.log_iter(app_id, "a", 0, streams=streams, attempt=2)) == []
    # The marker is for readers only: the log file holds exactly what the replica wrote.
    rdir = logs.replica_dir(desc_log_dir(sched, app_id), "a", 0)
    assert Path(rdir, "stdout").read_text() == "".join(lines)
    with pytest.raises(InvalidRunOptionError, match="attempt"):
        sched.log_iter(app_id, "a", 0, attempt=-1)


def desc_log_dir(sched: LocalScheduler, app_id: str) -> str:
    return str(sched.store.query("SELECT log_dir FROM local_apps WHERE app_id=?", (app_id,))[0]["log_dir"])


# -- item 3: a follower of an ended replica returns once its log is drained -------------------------------
def test_follow_of_an_ended_replica_returns_while_its_app_runs(sched: LocalScheduler) -> None:
    quick = py("print('done', flush=True)", "quick")
    slow = py("import time; time.sleep(300)", "slow")
    app_id = sched.submit(AppDef("mixed", [quick, slow]), {"grace_period": 0.0})
    try:
        def quick_ended() -> bool:
            desc = sched.describe(app_id)
            return desc is not None and desc.roles_statuses[0].replicas[0].state == AppState.SUCCEEDED

        wait_until(quick_ended, "the quick replica to end", HANG)
        # Nothing else in the app changes state from here on: the follower must not wait for that.
        t, got = follow_in_thread(app_id, "quick", 0)
        t.join(20.0)
        assert not t.is_alive(), "follower of an ended replica waits for an unrelated event"
        assert got == ["done\n"]
        desc = sched.describe(app_id)
        assert desc is not None and desc.state == AppState.RUNNING  # it returned while the app still runs
    finally:
        sched.cancel(app_id)


# -- `\r` progress bars are visible while following ----------------------------------------------------------
def test_follow_shows_carriage_return_progress_before_the_newline(sched: LocalScheduler, tmp_path: Path) -> None:
    release = tmp_path / "release"
    code = f"""
        import os, sys, time
        for p in (10, 20):
            sys.stdout.write(f"{{p}}%\\r"); sys.stdout.flush()
        while not os.path.exists({str(release)!r}):
            time.sleep(0.01)
        sys.stdout.write("100%\\n")
    """
    app_id = sched.submit(AppDef("bar", [py(code)]), {})
    got: queue.Queue[str] = queue.Queue()

    def run() -> None:
        s = LocalScheduler("test")
        try:
            for line in s.log_iter(app_id, "r", 0, should_tail=True):
                got.put(line)
        finally:
            s.close()
            got.put("<end>")

    threading.Thread(target=run, daemon=True).start()
    try:
        # Both redraws arrive while the replica still waits: before any newline was written.
        assert got.get(timeout=HANG) == "10%\r"
        assert got.get(timeout=HANG) == "20%\r"
    finally:
        release.touch()
    assert got.get(timeout=HANG) == "100%\n"
    assert got.get(timeout=HANG) == "<end>"
    # Reading an ended log splits at newlines only; both readers give the same bytes.
    assert list(sched.log_iter(app_id, "r", 0)) == ["10%\r20%\r100%\n"]


# -- item 11: long lines in linear time and bounded memory ---------------------------------------------------
def long_line_app(sched: LocalScheduler, size: int, newline: bool) -> str:
    end = "w(bytes([10]))" if newline else "pass"
    code = f"""
        import sys
        w = sys.stdout.buffer.write
        w(b"head" + bytes([10]))
        block = bytes(range(97, 123)) * (1 << 14)
        left = {size}
        while left > 0:
            w(block[:left]); left -= len(block)
        {end}
        w(b"tail")
    """
    app_id = sched.submit(AppDef("long", [py(code)]), {})
    desc = sched.wait(app_id, timeout=HANG)
    assert desc is not None and desc.state == AppState.SUCCEEDED, desc
    return app_id


@pytest.mark.parametrize("streams", [None, Stream.STDOUT])
def test_long_line_comes_in_pieces_of_at_most_max_line(sched: LocalScheduler, streams: Stream | None) -> None:
    size = 5 * MAX_LINE + 12345
    app_id = long_line_app(sched, size, newline=True)
    lines = list(sched.log_iter(app_id, "r", 0, streams=streams))
    assert lines[0] == "head\n" and lines[-1] == "tail"
    pieces = lines[1:-1]
    assert len(pieces) == 6  # ceil(size / MAX_LINE): the line is cut, never held whole
    assert all(len(p) <= MAX_LINE for p in pieces)
    assert pieces[-1].endswith("\n") and not any(p.endswith("\n") for p in pieces[:-1])
    assert sum(len(p) for p in pieces) == size + 1
    # following reads the same pieces
    followed = list(sched.log_iter(app_id, "r", 0, streams=streams, should_tail=True))
    assert followed == lines


def test_reading_a_long_line_keeps_memory_bounded(sched: LocalScheduler) -> None:
    size = 24 * MAX_LINE  # 24 MiB without a newline: a reader that holds it whole needs >= 24 MiB
    app_id = long_line_app(sched, size, newline=False)
    for streams in (None, Stream.STDOUT):
        tracemalloc.start()
        try:
            total = count = 0
            for piece in sched.log_iter(app_id, "r", 0, streams=streams):
                total += len(piece)
                count += 1
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert total == len("head\n") + size + len("tail")
        assert count >= 1 + size // MAX_LINE  # "head", then the line in pieces (the last one ends in "tail")
        assert peak < 8 * MAX_LINE, f"peak {peak} bytes while reading a {size}-byte line"


def test_line_splitter_cuts_between_utf8_characters_and_keeps_every_byte() -> None:
    text = "é" * MAX_LINE + "\n" + "x" * 10  # 2 bytes a character: a cut at MAX_LINE bytes may split one
    data = text.encode()
    split = LineSplitter()
    out: list[str] = []
    for i in range(0, len(data), 100_003):
        out.extend(split.feed(data[i : i + 100_003]))
    last = split.flush()
    assert last == "x" * 10
    assert "".join(out) + last == text  # no surrogate escapes: every piece decodes whole
    assert all(len(p.encode()) <= MAX_LINE for p in out)
    assert out[-1].endswith("\n") and not any(p.endswith("\n") for p in out[:-1])
    # bytes that are not UTF-8 survive as surrogate escapes, byte for byte
    raw = b"\xff\xfe" * (MAX_LINE // 2 + 7) + b"\n"
    split = LineSplitter()
    pieces = split.feed(raw[:MAX_LINE]) + split.feed(raw[MAX_LINE:])
    assert b"".join(os.fsencode(p) for p in pieces) == raw


def test_index_reader_skips_unknown_records_and_reads_attempts(tmp_path: Path) -> None:
    """Old and new records mixed: unknown codes are skipped, attempts cut lines even if never indexed."""
    rdir = str(tmp_path)
    Path(rdir, "stdout").write_bytes(b"one\ntwo-unfinished")
    Path(rdir, "stderr").write_bytes(b"")
    logs.append_records(rdir, [(logs.STDOUT, 4, 1.0), (77, 123, 1.5)])
    assert logs.mark_restart(rdir, 1) and logs.mark_attempt(rdir, 1)
    with open(Path(rdir, "stdout"), "ab") as f:
        f.write(b"three\n")
    reader = logs.ReplicaLogReader(rdir, frozenset({logs.STDOUT}))
    items = list(reader.poll(drain=True))
    assert [i[1] for i in items] == [["one\n"], ["two-unfinished"], 1, ["three\n"]]
    assert reader.attempt == 1 and not reader.restart_pending


# -- the multiplexed follower: events, one connection, no open file per replica ---------------------------
def test_log_iter_many_follows_every_replica_with_few_descriptors(sched: LocalScheduler) -> None:
    n = 64
    code = "import os, time; r = os.environ['TSM_REPLICA_ID']; print('first', r, flush=True); time.sleep(0.5); print('last', r)"
    app_id = sched.submit(AppDef("many", [py(code, num_replicas=n)]), {})
    before = len(os.listdir("/proc/self/fd"))
    most = before
    seen: dict[int, list[str]] = {}
    for ev in sched.log_iter_many(app_id, None, should_tail=True):
        most = max(most, len(os.listdir("/proc/self/fd")))
        assert isinstance(ev, LogEvent) and not ev.marker
        seen.setdefault(ev.k, []).append(ev.text)
    assert seen == {k: [f"first {k}\n", f"last {k}\n"] for k in range(n)}
    assert most - before <= 4, f"{most - before} descriptors held while following {n} replicas"


def test_log_iter_many_checks_targets_before_reading(sched: LocalScheduler) -> None:
    from tsm.errors import UnknownAppError

    app_id = sched.submit(AppDef("t", [py("pass")]), {})
    with pytest.raises(UnknownAppError, match="no role 'x'"):
        sched.log_iter_many(app_id, [("r", 0), ("x", 0)])
    with pytest.raises(UnknownAppError, match="replicas 0..0"):
        sched.log_iter_many(app_id, [("r", 1)])
    with pytest.raises(UnknownAppError):
        sched.log_iter_many("nosuch-app", None)
