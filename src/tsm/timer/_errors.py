"""The errors tsm.timer raises, each also an instance of what torch raises in the same situation.

Kept apart from :mod:`tsm.timer.api` (the torch contract) and importable by every client and server module.
"""

from __future__ import annotations

from tsm.errors import TimerError

__all__ = ["InvalidTimerRequestError", "NotConfiguredError", "TimerServerUnavailableError"]


class TimerServerUnavailableError(TimerError, BrokenPipeError):
    """No timer server reads the client's FIFO or socket (not started yet, stopped, or dead).

    A ``BrokenPipeError`` too, because that is what torch's ``FileTimerClient`` raises when its server is
    not there: code written for torch keeps catching it.
    """


class InvalidTimerRequestError(TimerError, ValueError):
    """A timer request that can never be valid: a deadline that is NaN, infinite or absurdly far away, a
    scope that is too long, a worker id of the wrong type.  Raised by clients before anything is sent."""


class NotConfiguredError(TimerError, RuntimeError):
    """``expires()`` found no client: neither ``configure()`` nor ``$TSM_TIMER_SOCKET`` (a RuntimeError, as
    torch raises)."""
