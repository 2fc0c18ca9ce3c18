"""What every backend's stall check (``-c stall_timeout=15m``) shares: how often it looks, and
what a stall's message says.

A replica is stalled when it wrote no log line and used no CPU for ``stall_timeout``. Each backend measures
that where its replicas run (the local supervisor and the Slurm batch shell read ``/proc``, the Ray driver
asks its actors, tsm asks Docker when it looks at an app); they look once per :func:`tick` and report a
stall with :func:`stall_message`, so ``tsm status`` reads the same on every scheduler. Pure: no I/O.
"""

from __future__ import annotations

from tsm.schedulers.common.durations import format_duration

__all__ = ["QUOTE_MAX", "TICK_MAX", "TICK_MIN", "stall_message", "tick"]

#: bounds of the tick between two checks (seconds): a tenth of ``stall_timeout``, within these
TICK_MIN, TICK_MAX = 0.2, 30.0

#: most characters of the last log line a stall message quotes
QUOTE_MAX = 200


def tick(timeout: float) -> float:
    """Seconds between two checks for ``stall_timeout`` = ``timeout``: a tenth of it, within
    [:data:`TICK_MIN`, :data:`TICK_MAX`], so a stall is seen within 10 % of the timeout (at most 30 s late)."""
    return float(min(max(timeout / 10, TICK_MIN), TICK_MAX))


def stall_message(timeout: float, line: str) -> str:
    """``stalled for 15m, last line: '...'`` (the last line cut to :data:`QUOTE_MAX` characters, shown as a
    Python literal so control characters stay visible), or ``stalled for 15m, no output at all``."""
    if not line:
        return f"stalled for {format_duration(timeout)}, no output at all"
    return f"stalled for {format_duration(timeout)}, last line: {line[:QUOTE_MAX]!r}"
