"""The run options of long runs, shared by every backend that supports them, and their parsing.

``-c time_limit=2h -c warn_signal=USR1 -c warn_before=120s -c max_preemptions=3 -c stall_timeout=15m
-c on_stall=restart -c requeue_on_time_limit=true -c exclude_nodes=node3,node4``

A backend's options dataclass inherits :class:`LifecycleOptions` to take them (declared once, typed, checked
once). Durations are written ``90`` (seconds), ``120s``, ``15m``, ``2h``, ``1d`` or a sum such as ``1h30m``;
:func:`parse_duration` reads them and :func:`format_duration` writes seconds back the same way for messages.
What each backend maps them to is the table in ``docs/long-runs.md``. Pure: no I/O, no client library.
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass

from tsm.errors import InvalidRunOptionError
from tsm.schedulers.common.durations import MAX_DURATION, format_duration, parse_duration, parse_signal
from tsm.schedulers.common.options import RunOptions, option

__all__ = [
    "DEFAULT_MAX_PREEMPTIONS", "MAX_DURATION", "ON_STALL", "LifecycleOptions", "format_duration", "parse_duration",
    "parse_signal",
]

#: What ``max_preemptions`` is when not given: restarts the cluster decides (preemption, a lost node, a
#: time limit with ``requeue_on_time_limit``) that an app may take before it fails.
DEFAULT_MAX_PREEMPTIONS = 3

#: The values of ``on_stall``.
ON_STALL = ("restart", "fail")


@dataclass(frozen=True)
class LifecycleOptions(RunOptions):
    """The long-run options (inherit to take them); the ``*_s`` properties give their values in seconds."""

    time_limit: str | None = option(
        "how long the app may run (90, 120s, 15m, 2h, 1d); at the limit it is stopped (warned first) and "
        "fails, or restarts with requeue_on_time_limit"
    )
    warn_signal: str | None = option(
        "signal every replica gets once before a time limit, a cancel or a stall stops it (e.g. USR1; "
        "tsm.lifecycle.on_warning handles it); default: no warning"
    )
    warn_before: str = option("how long before the time limit the warning comes, and how long a warned "
                              "replica has before SIGTERM on a cancel or a stall", "120s")
    max_preemptions: int = option(
        "restarts the cluster's decisions may cause (preemption, a lost node, a time limit with "
        "requeue_on_time_limit) before the app fails; they never spend max_retries",
        DEFAULT_MAX_PREEMPTIONS,
    )
    stall_timeout: str | None = option(
        "treat a replica that wrote no log line and used no CPU for this long (e.g. 15m) as stalled; "
        "default: never"
    )
    on_stall: str = option("what a stall does: restart (counts as a failure, spends max_retries) or fail", "restart")
    requeue_on_time_limit: bool = option(
        "restart the app when it reaches time_limit, as a preemption (budget max_preemptions)", False
    )
    exclude_nodes: list[str] | None = option("nodes the app's replicas must not run on, e.g. node3,node4")

    def check(self) -> None:
        """Parse every duration and the signal once, so a bad value fails the dry run with one line."""
        _ = self.time_limit_s, self.stall_timeout_s, self.warn_before_s, self.warn_signum
        if self.max_preemptions < 0:
            raise InvalidRunOptionError(f"run option max_preemptions={self.max_preemptions} must be >= 0")
        if self.on_stall not in ON_STALL:
            raise InvalidRunOptionError(
                f"run option on_stall={self.on_stall!r} must be one of {', '.join(ON_STALL)}"
            )
        if self.requeue_on_time_limit and self.time_limit is None:
            raise InvalidRunOptionError("run option requeue_on_time_limit=true needs a time_limit")
        for node in self.exclude_nodes or []:
            if not node or not re.fullmatch(r"[A-Za-z0-9_.\-\[\],]+", node):
                raise InvalidRunOptionError(f"run option exclude_nodes: {node!r} is not a node name")

    @property
    def time_limit_s(self) -> float | None:
        """``time_limit`` in seconds, None when not given."""
        return None if self.time_limit is None else parse_duration(self.time_limit, "time_limit")

    @property
    def warn_before_s(self) -> float:
        """``warn_before`` in seconds."""
        return parse_duration(self.warn_before, "warn_before")

    @property
    def stall_timeout_s(self) -> float | None:
        """``stall_timeout`` in seconds, None when not given."""
        return None if self.stall_timeout is None else parse_duration(self.stall_timeout, "stall_timeout")

    @property
    def warn_signum(self) -> signal.Signals | None:
        """The warning signal, None when no warning was asked for."""
        return None if not self.warn_signal else parse_signal(self.warn_signal)
