"""``log_debug_info_for_expired_timers``: one log line naming every timer that expired in a round.

torch has this function in a module of this name and calls it from its ``FileTimerServer``; tsm's
``FileTimerServer`` calls it the same way (``run_id``, ``{pid: [request as JSON, ...]}``) whenever timers
expire, and ``tsm.timer.file_based_local_timer`` re-exports it.
"""

from __future__ import annotations

import logging

__all__ = ["log_debug_info_for_expired_timers"]

logger = logging.getLogger("tsm.timer")


def log_debug_info_for_expired_timers(run_id: str, expired_timers: dict[int, list[str]]) -> None:
    """Log (INFO) the expired timers of run ``run_id``, by pid; nothing when there are none."""
    if expired_timers:
        logger.info("timers expired in run %s: %s", run_id, expired_timers)
