"""Durations and signal names as run options write them: ``90``, ``120s``, ``15m``, ``2h``, ``1h30m``; ``USR1``.

Read by :mod:`.lifecycle_opts` at dry run and by the local supervisor for its messages; imports only the
standard library, :mod:`tsm.errors` and the lifecycle policy (whose messages write durations), so the
supervisor (started with ``python -S``) stays light.
"""

from __future__ import annotations

import re
import signal

from tsm.errors import InvalidRunOptionError
from tsm.lifecycle.policy import format_duration

__all__ = ["MAX_DURATION", "format_duration", "parse_duration", "parse_signal"]

#: The longest duration accepted (seconds): a year. Far beyond any job, far below float trouble.
MAX_DURATION = 366 * 86400.0

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)([smhd])")

def parse_duration(text: str, name: str = "duration") -> float:
    """Seconds in ``text``: ``90``, ``120s``, ``15m``, ``2h``, ``1d`` or a sum such as ``1h30m``.

    Raises :class:`InvalidRunOptionError` naming ``name`` for anything else, a negative or a zero duration, or
    one over :data:`MAX_DURATION`.
    """
    raw = text.strip().lower()
    total: float | None = None
    if re.fullmatch(r"\d+(?:\.\d+)?", raw):
        total = float(raw)
    elif raw and _PART.sub("", raw) == "":
        total = sum(float(n) * _UNITS[u] for n, u in _PART.findall(raw))
    if total is None or not 0 < total <= MAX_DURATION:
        raise InvalidRunOptionError(
            f"run option {name}={text!r} is not a duration: write seconds (90) or a number with a unit, "
            "s, m, h or d (120s, 15m, 2h, 1h30m), above zero and at most a year"
        )
    return total


def parse_signal(text: str, name: str = "warn_signal") -> signal.Signals:
    """The signal named by ``text`` (``USR1``, ``SIGUSR1`` or its number); refuses KILL and STOP, which cannot be handled."""
    raw = text.strip().upper()
    try:
        sig = signal.Signals(int(raw)) if raw.isdigit() else signal.Signals[raw if raw.startswith("SIG") else "SIG" + raw]
    except (KeyError, ValueError):
        raise InvalidRunOptionError(
            f"run option {name}={text!r} is not a signal: give a name such as USR1, USR2, TERM or INT"
        ) from None
    if sig in (signal.SIGKILL, signal.SIGSTOP):
        raise InvalidRunOptionError(f"run option {name}={text!r}: {sig.name} cannot be caught, so it cannot warn")
    return sig
