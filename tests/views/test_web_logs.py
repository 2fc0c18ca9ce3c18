"""The bounded logs of ``tsm serve`` on their own (:mod:`tsm.views.web.logs`): the query, the tail's window, and a
followed log's stream (its lines, its end, a follower's error, a client too slow), without a server."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator

import pytest

pytest.importorskip("starlette", reason="the web extra is installed by `pip install -e .[test]`")

from tsm.views.web import logs  # noqa: E402
from tsm.views.web.logs import FollowStream, LogQuery, last_lines, tail_of  # noqa: E402


def test_a_query_names_its_replica_and_refuses_what_it_cannot_match() -> None:
    q = LogQuery.parse({"k": "2"}, default_role="trainer")
    assert (q.role, q.k, q.keep) == ("trainer", 2, None)
    q = LogQuery.parse({"role": "w", "regex": "loss [0-9]+$"}, default_role="trainer")
    assert q.role == "w" and q.keep is not None and q.keep("loss 12") and not q.keep("loss x")
    with pytest.raises(ValueError, match="k must be a replica number"):
        LogQuery.parse({"k": "x"}, "w")
    with pytest.raises(ValueError, match="bad regex"):
        LogQuery.parse({"regex": "(a"}, "w")
    with pytest.raises(ValueError, match="longer than"):
        LogQuery.parse({"regex": "a" * (logs.MAX_REGEX + 1)}, "w")
    assert [tail_of({}), tail_of({"tail": "5"}), tail_of({"tail": "0"}), tail_of({"tail": "10000000"})] == [
        1000, 5, logs.MAX_TAIL, logs.MAX_TAIL]


def test_a_tail_keeps_only_its_window_and_closes_the_lines() -> None:
    closed = []

    def lines() -> Iterator[str]:
        try:
            for i in range(10_000):
                yield f"line {i}\n"
        finally:
            closed.append(True)

    assert last_lines(lines(), 3, None) == ["line 9997", "line 9998", "line 9999"]
    assert last_lines(lines(), 2, lambda s: s.endswith("5")) == ["line 9985", "line 9995"]
    assert closed == [True, True]


def follow(source: Iterator[str], keep=None) -> list[str]:  # type: ignore[no-untyped-def]
    """Run a stream over ``source`` to its end; the SSE messages it sent."""
    async def main() -> list[str]:
        stream = FollowStream(lambda stop: source, keep, asyncio.get_running_loop())
        stream.start("test follow")
        return [m async for m in stream.events()]
    return asyncio.run(asyncio.wait_for(main(), 60))


def test_a_followed_log_sends_each_kept_line_then_its_end() -> None:
    got = follow(iter(["a\n", "<b>\n", "c\n"]), keep=lambda s: s != "c")
    assert got == [f"data: {json.dumps('a')}\n\n", f"data: {json.dumps('<b>')}\n\n", 'event: end\ndata: ""\n\n']


def test_a_follower_that_fails_ends_the_stream_saying_why() -> None:
    def broken() -> Iterator[str]:
        yield "first\n"
        raise OSError("the log file went away")

    got = follow(broken())
    assert got[0] == 'data: "first"\n\n' and got[-1].startswith("event: end") and "the log file went away" in got[-1]


def test_a_client_that_does_not_read_is_told_and_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logs, "FOLLOW_QUEUE", 5)
    done = threading.Event()

    def endless() -> Iterator[str]:
        i = 0
        while not done.is_set():
            i += 1
            yield f"{i}\n"

    async def main() -> list[str]:
        stream = FollowStream(lambda stop: endless(), None, asyncio.get_running_loop())
        stream.start("test follow")
        while not stream.stop.is_set():  # the reader thread fills the queue while nobody reads
            await asyncio.sleep(0.01)
        return [m async for m in stream.events()]

    try:
        got = asyncio.run(asyncio.wait_for(main(), 60))
    finally:
        done.set()
    assert len(got) == 6 and got[-1].startswith("event: end") and "too slowly" in got[-1]
