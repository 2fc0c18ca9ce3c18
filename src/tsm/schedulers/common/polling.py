"""Wait for an app to end by polling, for backends that have no event to wait on.

Back-off: the first poll is immediate; then ``initial`` seconds (0.1 by default), each pause 1.5 times the
last, capped at ``cap`` (5 s). So an app that ends quickly is seen within ~0.1 s, one that runs for hours
costs one poll every 5 s, and the pause before the deadline is shortened so ``timeout`` is kept::

    poll:   0   0.1   0.25   0.48   0.81   1.32   2.08   3.22   4.93   7.49   11.33   16.33   21.33 ...  (s)

The poll gets the current pause, so a backend with a shared status cache can ask for an answer no older
than that (see :class:`tsm.schedulers.common.watcher.StatusWatcher`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol, TypeVar


class _Terminal(Protocol):
    """What a description is asked here (``DescribeAppResponse`` has it): a state that knows it is terminal."""

    @property
    def is_terminal(self) -> bool: ...


class _Described(Protocol):
    @property
    def state(self) -> _Terminal: ...

BACKOFF_FACTOR = 1.5
T = TypeVar("T")
D = TypeVar("D", bound=_Described)


def poll_until_terminal(
    describe: Callable[[float], D | None],
    timeout: float | None = None,
    *,
    initial: float = 0.1,
    cap: float = 5.0,
) -> D | None:
    """Call ``describe(pause)`` until it gives None or a terminal state, or ``timeout`` seconds pass.

    Returns the last description (None when the app is unknown). ``timeout=None`` waits for ever.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    delay = initial
    while True:
        desc = describe(delay)
        if desc is None or desc.state.is_terminal:
            return desc
        if deadline is not None and time.monotonic() >= deadline:
            return desc
        pause = delay if deadline is None else min(delay, max(0.0, deadline - time.monotonic()))
        time.sleep(pause)
        delay = min(delay * BACKOFF_FACTOR, cap)


def poll_until(
    check: Callable[[], T | None],
    timeout: float | None,
    *,
    initial: float = 0.1,
    cap: float = 1.0,
) -> T | None:
    """Call ``check()`` until it gives something other than None, or ``timeout`` seconds pass (then None).

    The same back-off as :func:`poll_until_terminal` (``initial``, x1.5, capped at ``cap``), the last pause
    shortened to keep ``timeout``; ``timeout=None`` polls for ever. For waits with no event to block on (a
    pod to get its IP, a container to start).
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    delay = initial
    while True:
        got = check()
        if got is not None:
            return got
        if deadline is not None and time.monotonic() >= deadline:
            return None
        pause = delay if deadline is None else min(delay, max(0.0, deadline - time.monotonic()))
        time.sleep(pause)
        delay = min(delay * BACKOFF_FACTOR, cap)
