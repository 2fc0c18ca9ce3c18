"""Many replicas' logs as one stream of events, whatever the scheduler can do (what ``Runner.log_events`` gives).

A scheduler that follows many replicas in one reader (``MultiReplicaLogs``) serves every replica from it: no
thread, connection or open file per replica. Any other gets one thread per replica, each reading
:meth:`Runner.log_lines <tsm.runner.api.Runner.log_lines>` through a runner of its own (a runner and its
schedulers belong to one thread) and handing its lines over one queue. The caller sees the same
:class:`LogEvent` values either way, on whatever thread it reads them.
"""

from __future__ import annotations

import queue
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from tsm._logging import warn as _warn
from tsm.errors import NotSupportedError

if TYPE_CHECKING:
    from datetime import datetime

    from tsm.schedulers.api import Scheduler, Stream
    from tsm.specs.api import AppStatus


class Runner(Protocol):
    """What the readers here ask of a runner (:class:`tsm.runner.api.Runner` is one)."""

    def scheduler(self, name: str) -> Scheduler: ...

    def status(self, app_handle: str) -> AppStatus | None: ...

    def log_lines(self, app_handle: str, role_name: str, k: int = 0, regex: str | None = None,
                  since: datetime | None = None, until: datetime | None = None, should_tail: bool = False,
                  streams: Stream | None = None) -> Iterator[str]: ...

    def close(self) -> None: ...


class LogEvent:
    """A line of replica ``role``/``k`` (``text``, with its ``\\n``, ``\\r`` when followed, or neither for an
    unfinished last line), or, with ``marker``, the start of its attempt ``attempt`` (``text`` empty).

    The shape of what a ``MultiReplicaLogs`` scheduler yields, so readers need not tell the two apart.
    """

    __slots__ = ("role", "k", "text", "attempt", "marker")

    def __init__(self, role: str, k: int, text: str, attempt: int = 0, marker: bool = False) -> None:
        self.role, self.k, self.text, self.attempt, self.marker = role, k, text, attempt, marker

    def __repr__(self) -> str:
        return f"LogEvent({self.role}/{self.k}: {'attempt ' + str(self.attempt) if self.marker else repr(self.text)})"


def start_thread(target: Callable[..., None], *args: Any) -> threading.Thread:
    """Start a daemon thread that never takes Ctrl-C, so SIGINT always wakes the main thread.

    A process-wide SIGINT goes to any thread that does not block it; landing on a worker, it would
    leave the main thread asleep in ``select``/``join`` and Ctrl-C would do nothing. The new thread
    inherits a mask blocking SIGINT; the caller's own mask is restored at once.
    """
    can_mask = hasattr(signal, "pthread_sigmask")
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT}) if can_mask else None
    try:
        t = threading.Thread(target=target, args=args, daemon=True)
        t.start()
    finally:
        if old is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
    return t


def replica_events(
    make_runner: Callable[[], Runner],
    handle: str,
    targets: Sequence[tuple[str, int]] | None,
    *,
    regex: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    should_tail: bool = False,
    streams: Stream | None = None,
    attempt: int | None = None,
    idle: Callable[[], object] | None = None,
) -> Iterator[Any]:
    """The events of replicas ``targets`` (None: every replica) of app ``handle``, read by runners ``make_runner`` makes.

    ``idle()`` is called whenever the reader is about to wait for more. A replica's reader that fails is
    raised once every replica's stream ended (the first; any other is logged as a warning).
    ``attempt`` needs a scheduler that keeps a replica's attempts apart, else :class:`NotSupportedError`.
    """
    from tsm.schedulers.api import MultiReplicaLogs
    from tsm.specs.handles import parse_app_handle

    parsed = parse_app_handle(handle)
    own = make_runner()
    try:
        sched = own.scheduler(parsed.scheduler)
        if isinstance(sched, MultiReplicaLogs):
            yield from sched.log_iter_many(parsed.app_id, targets, regex, since, until, should_tail, streams,
                                           attempt, idle)
            return
        if attempt is not None:
            raise NotSupportedError(f"the scheduler of {handle} does not keep a replica's attempts apart")
        if targets is None:
            status = own.status(handle)
            targets = [(rs.role, r.id) for rs in (status.roles if status else []) for r in rs.replicas]
    finally:
        own.close()
    yield from _threaded(make_runner, handle, list(targets), idle,
                         dict(regex=regex, since=since, until=until, should_tail=should_tail, streams=streams))


def _threaded(make_runner: Callable[[], Runner], handle: str, targets: list[tuple[str, int]],
              idle: Callable[[], object] | None, kwargs: dict[str, Any]) -> Iterator[LogEvent]:
    """One thread per replica, each with a runner of its own, their lines merged through one queue."""
    lines: queue.SimpleQueue[LogEvent | None] = queue.SimpleQueue()
    errors: list[tuple[tuple[str, int], BaseException]] = []

    def pump(role: str, k: int) -> None:
        runner = make_runner()
        try:
            for line in runner.log_lines(handle, role, k, **kwargs):
                lines.put(LogEvent(role, k, line))
        except BaseException as e:  # noqa: BLE001 - raised by the reader once every stream ended
            errors.append(((role, k), e))
        finally:
            runner.close()
            lines.put(None)

    for role, k in targets:
        start_thread(pump, role, k)
    running = len(targets)
    while running:
        if idle is not None and lines.empty():
            idle()
        event = lines.get()
        if event is None:
            running -= 1
        else:
            yield event
    if errors:
        for (role, k), other in errors[1:]:  # the first is raised; the others are not lost either
            _warn("reading the log of %s %s/%d failed too: %s", handle, role, k, other)
        raise errors[0][1]
