"""Replica logs over HTTP, bounded: a filtered tail held in a window, and a followed log through a bounded queue.

A log ``regex`` is matched with RE2 (``google-re2``: linear time, no backtracking, so ``(.+)+X`` costs what
``X`` costs) and at most :data:`MAX_REGEX` characters. A tail keeps at most the last ``tail`` lines in memory
while the log streams past (never the whole log; at most :data:`MAX_TAIL`). A followed log
(:class:`FollowStream`) goes through a queue of at most :data:`FOLLOW_QUEUE` lines: a client that does not
read gets ``event: end`` saying it was too slow, and the stream closes. When a stream closes, its reader
thread stops and the scheduler's follower (with its supervisor connection) is closed, at the follower's next
wake-up.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

#: The longest log ``regex`` accepted, and the most lines ``tail`` keeps.
MAX_REGEX, MAX_TAIL = 512, 100_000
#: Lines a followed log may queue for a client before the client is told it is too slow and dropped.
FOLLOW_QUEUE = 10_000
#: Seconds between two comment lines on an idle event stream (keeps proxies from closing it).
KEEPALIVE = 15.0


class _Closed(Exception):
    """Raised inside a follower (through its ``idle`` hook) to stop it once its stream has closed."""


def compile_regex(regex: str) -> Callable[[str], bool]:
    """A search function for a client's ``regex``: RE2, linear in the line's length; ValueError if refused."""
    if len(regex) > MAX_REGEX:
        raise ValueError(f"regex is longer than {MAX_REGEX} characters")
    try:
        import re2  # type: ignore[import-untyped,unused-ignore]
    except ImportError as e:
        raise ValueError("log filtering needs google-re2: pip install 'tsm[web]'") from e
    options = re2.Options()
    options.log_errors = False
    try:
        pattern = re2.compile(regex, options)
    except re2.error as e:
        why = e.args[0].decode(errors="replace") if e.args and isinstance(e.args[0], bytes) else str(e)
        raise ValueError(f"bad regex: {why}") from None
    return lambda line: pattern.search(line) is not None


def _close(it: Any) -> None:
    close = getattr(it, "close", None)
    if close is not None:
        close()


def last_lines(lines: Iterator[str], tail: int, keep: Callable[[str], bool] | None) -> list[str]:
    """The last ``tail`` lines of ``lines`` that ``keep`` accepts (all when ``tail`` <= 0), holding only those."""
    window: collections.deque[str] = collections.deque(maxlen=tail if tail > 0 else None)
    try:
        for line in lines:
            line = line.rstrip("\n")
            if keep is None or keep(line):
                window.append(line)
    finally:
        _close(lines)
    return list(window)


@dataclass(frozen=True)
class LogQuery:
    """Which replica's log a request asks for (``role``, ``k``) and the lines it keeps (``keep``, its regex)."""

    role: str
    k: int
    keep: Callable[[str], bool] | None = None

    @classmethod
    def parse(cls, query: Mapping[str, str], default_role: str) -> LogQuery:
        """From ``?role=R&k=K&regex=RE`` (the role defaults to the app's first); ValueError saying what is wrong."""
        try:
            k = int(query.get("k", "0"))
        except ValueError as e:
            raise ValueError(f"k must be a replica number, not {query.get('k')!r}") from e
        regex = query.get("regex") or None
        return cls(query.get("role") or default_role, k, None if regex is None else compile_regex(regex))


def tail_of(query: Mapping[str, str]) -> int:
    """The ``tail`` a request asks for, within 1..MAX_TAIL (0 or less, or too many: MAX_TAIL)."""
    tail = int(query.get("tail", "1000"))
    return MAX_TAIL if tail <= 0 or tail > MAX_TAIL else tail


def open_follower(runner: Any, handle: str, role: str, k: int, stop: threading.Event) -> Iterator[str]:
    """The lines of a replica as written; stoppable from outside (``stop``) through the follower's ``idle`` hook."""
    from tsm.schedulers.api import MultiReplicaLogs
    from tsm.specs.handles import parse_app_handle

    parsed = parse_app_handle(handle)
    sched = runner.scheduler(parsed.scheduler_backend)
    if isinstance(sched, MultiReplicaLogs):
        def idle() -> None:
            if stop.is_set():
                raise _Closed
        return iter(sched.log_iter_many(parsed.app_id, [(role, k)], should_tail=True, idle=idle, text_only=True))
    return iter(runner.log_lines(handle, role, k, should_tail=True))


class FollowStream:
    """One followed log: a reader thread blocked in the scheduler's follower, a bounded queue, the SSE text.

    ``open_lines(stop)`` opens the follower (see :func:`open_follower`); :meth:`start` runs it in a daemon
    thread, and :meth:`events` is what the response streams: one ``data:`` per line, then ``event: end``
    (with why, when it was not the replica's end). Closing the response sets ``stop``.
    """

    def __init__(self, open_lines: Callable[[threading.Event], Iterator[str]], keep: Callable[[str], bool] | None,
                 loop: asyncio.AbstractEventLoop) -> None:
        self.open_lines, self.keep, self.loop = open_lines, keep, loop
        self.queue: asyncio.Queue[tuple[str, str]] = asyncio.Queue(maxsize=FOLLOW_QUEUE + 1)
        self.stop = threading.Event()

    def start(self, name: str) -> None:
        threading.Thread(target=self._pump, name=name, daemon=True).start()

    def _offer(self, item: tuple[str, str]) -> None:
        # on the event loop: a full queue means the client stopped reading; tell it and drop it
        if self.stop.is_set():
            return
        if item[0] == "line" and self.queue.qsize() >= FOLLOW_QUEUE:
            self.stop.set()  # the follower ends; the client gets this message once it reads again
            item = ("end", f"dropped: this client read too slowly ({FOLLOW_QUEUE} lines waited for it)")
        self.queue.put_nowait(item)  # room: at most FOLLOW_QUEUE lines and one end

    def _pump(self) -> None:
        # Blocks in the scheduler's own follower (event-driven for local logs). Once the stream closes,
        # ``stop`` ends it at its next line or wake-up, and closing the follower releases its connection.
        lines: Iterator[str] | None = None
        try:
            lines = self.open_lines(self.stop)
            for line in lines:
                if self.stop.is_set():
                    return
                line = line.rstrip("\n")
                if self.keep is None or self.keep(line):
                    self.loop.call_soon_threadsafe(self._offer, ("line", line))
            self.loop.call_soon_threadsafe(self._offer, ("end", ""))
        except _Closed:
            return
        except Exception as e:  # noqa: BLE001 - shown on the page as the stream's end
            if not self.stop.is_set():
                with contextlib.suppress(RuntimeError):  # the loop is gone: the server is stopping
                    self.loop.call_soon_threadsafe(self._offer, ("end", f"{type(e).__name__}: {e}"))
        finally:
            with contextlib.suppress(Exception):
                _close(lines)

    async def events(self) -> AsyncIterator[str]:
        try:
            while True:
                try:
                    kind, text = await asyncio.wait_for(self.queue.get(), KEEPALIVE)
                except asyncio.TimeoutError:
                    yield ": keep-alive\n\n"
                    continue
                if kind == "end":
                    yield f"event: end\ndata: {json.dumps(text)}\n\n"
                    return
                yield f"data: {json.dumps(text)}\n\n"
        finally:
            self.stop.set()
