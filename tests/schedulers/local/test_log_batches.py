"""Reading local logs in batches (issue 19's ``log_lines`` row): the same lines as before, only faster.

The splitter cuts a block's complete lines into batches of about ``SPLIT_CHUNK`` bytes and uses
``str.splitlines`` when the text holds no other line break; these tests hold it to a plain reference cut
(``\\n`` only) on text full of the characters ``splitlines`` would also break at, across batch boundaries,
and read a real app's log through :class:`~tsm.schedulers.local.logs.Lines`.
"""

from __future__ import annotations

import os
import random

import pytest

from testutil import py
from tsm.schedulers.api import Stream
from tsm.schedulers.local import logs
from tsm.schedulers.local.logs import MAX_LINE, SPLIT_CHUNK, Lines, LineSplitter
from tsm.schedulers.local.scheduler import LocalScheduler
from tsm.specs import AppDef, AppState

HANG = 60.0  # seconds: a guard against a hang, never a performance claim

#: everything ``str.splitlines`` breaks at besides ``\n``, and bytes that are not UTF-8
ODD = ["\r", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029", "é", "€"]


def reference(data: bytes) -> list[str]:
    """Lines cut after each ``\\n`` only, decoded as the readers decode (MAX_LINE pieces aside)."""
    parts = data.split(b"\n")
    out = [logs._decode(p + b"\n") for p in parts[:-1]]
    if parts[-1]:
        out.append(logs._decode(parts[-1]))
    return out


def feed_all(data: bytes, step: int) -> list[str]:
    split = LineSplitter()
    out: list[str] = []
    for i in range(0, len(data), step):
        batches = split.feed_batches(data[i : i + step])
        assert all(batches), "a batch is never empty"
        for batch in batches:
            out += batch
    last = split.flush()
    return out + ([last] if last is not None else [])


@pytest.mark.parametrize("odd", ODD)
def test_only_newlines_end_lines_whatever_else_the_text_holds(odd: str) -> None:
    rnd = random.Random(odd)
    lines = [f"{i} {'x' * rnd.randint(0, 300)}{odd if rnd.random() < 0.3 else ''}\n" for i in range(3000)]
    data = "".join(lines).encode("utf-8") + b"\xff\xfe not utf-8\n" + b"unfinished" + odd.encode()
    assert len(data) > 4 * SPLIT_CHUNK  # several batches per block
    for step in (logs.BLOCK, SPLIT_CHUNK, 4099):
        assert feed_all(data, step) == reference(data)


def test_a_line_longer_than_a_batch_stays_whole_and_a_huge_one_in_pieces() -> None:
    data = b"a\n" + b"b" * (3 * SPLIT_CHUNK) + "\u2028\n".encode() + b"c" * (MAX_LINE + 5) + b"\n"
    got = feed_all(data, logs.BLOCK)
    assert "".join(got).encode("utf-8", "surrogateescape") == data
    assert got[:2] == reference(data)[:2]
    assert all(len(g.encode("utf-8", "surrogateescape")) <= MAX_LINE for g in got)


def test_lines_iterates_next_and_close_like_a_generator() -> None:
    closed = []

    def batches():  # type: ignore[no-untyped-def]
        try:
            yield ["a\n", "b\n"]
            yield ["c\n"]
            yield ["d\n"]
        finally:
            closed.append(True)

    lines = Lines(batches())
    assert next(lines) == "a\n"
    assert [next(it) for it in (iter(lines),)] == ["b\n"]  # iter() and next() share one position
    assert next(lines) == "c\n"
    lines.close()
    assert closed == [True]
    assert list(lines) == []


def test_a_real_log_reads_back_byte_for_byte(sched: LocalScheduler) -> None:
    code = r"""
        import os, sys
        out = sys.stdout.buffer
        for i in range(40000):
            out.write(f"line {i} \u2028 \x85 \x0c é\n".encode() if i % 7 == 0 else f"line {i}\n".encode())
        out.write(b"\xff tail without newline")
        out.flush()
    """
    app_id = sched.submit(AppDef("batches", [py(code, "w")]), {})
    desc = sched.wait(app_id, timeout=HANG)
    assert desc is not None and desc.state == AppState.SUCCEEDED
    rows = sched.store.query("SELECT log_dir FROM local_apps WHERE app_id=?", (app_id,))
    with open(os.path.join(logs.replica_dir(rows[0]["log_dir"], "w", 0), "stdout"), "rb") as f:
        data = f.read()
    for streams in (Stream.STDOUT, None):  # the whole-file path and the indexed (combined) path
        got = sched.log_iter(app_id, "w", 0, streams=streams)
        assert isinstance(got, Lines)
        lines = list(got)
        assert lines == reference(data)
        assert "".join(lines).encode("utf-8", "surrogateescape") == data
    assert list(sched.log_iter(app_id, "w", 0, regex="é", streams=Stream.STDOUT)) == [
        ln for ln in reference(data) if "é" in ln
    ]
