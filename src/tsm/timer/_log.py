"""Rate-limited logging for messages a client can trigger at will (refusals, protocol errors).

A misbehaving or hostile worker can send millions of bad requests a second; logging each would fill the
supervisor's log and slow the server down.  :class:`LimitedLog` lets a burst through,
then one line per ``interval`` seconds, and says how many similar lines it held back.  Every refusal is still
counted in the server's ``stats``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

__all__ = ["Lazy", "LimitedLog"]


class Lazy:
    """A log argument computed only if the line is written: ``Lazy(fn, *args)`` formats as ``fn(*args)``.

    Refusals are counted at full speed and most are never logged, so their text is not built either.
    """

    __slots__ = ("fn", "args")

    def __init__(self, fn: Callable[..., object], *args: object) -> None:
        self.fn = fn
        self.args = args

    def __str__(self) -> str:
        return str(self.fn(*self.args))


class LimitedLog:
    """A token bucket in front of ``logger``: ``burst`` lines at once, then one per ``interval`` seconds."""

    def __init__(self, logger: logging.Logger, burst: int = 20, interval: float = 10.0) -> None:
        self.logger = logger
        self._burst = float(burst)
        self._interval = interval
        self._tokens = float(burst)
        self._last = time.monotonic()
        self._suppressed = 0
        self._lock = threading.Lock()

    def log(self, level: int, msg: str, *args: object, exc_info: bool = False) -> bool:
        """Log ``msg % args`` unless over the rate; return whether it was written."""
        if not self.logger.isEnabledFor(level):
            return False
        with self._lock:
            now = time.monotonic()
            self._tokens = min(self._burst, self._tokens + (now - self._last) / self._interval)
            self._last = now
            if self._tokens < 1.0:
                self._suppressed += 1
                return False
            self._tokens -= 1.0
            held, self._suppressed = self._suppressed, 0
        if held:
            msg += " (%d similar messages suppressed)"
            args = (*args, held)
        self.logger.log(level, msg, *args, exc_info=exc_info)
        return True

    @property
    def suppressed(self) -> int:
        """Lines held back since the last one written."""
        return self._suppressed
