"""What a replica asks about its own life: which attempt this is, why the last one ended, and the warning.

In the replica's code, one line registers a checkpoint function for the warning tsm sends before a time
limit, a cancel or a stall stops it (``-c warn_signal=USR1 -c warn_before=120s``)::

    import tsm.lifecycle

    tsm.lifecycle.on_warning(lambda: save_checkpoint(step))   # runs once, in the main thread
    if tsm.lifecycle.restart_count():                         # a restart: resume from the checkpoint
        step = load_checkpoint()

Every attempt of a replica sees three variables (read here, or straight from the environment):

``TSM_ATTEMPT``        this replica's attempt, 0 for its first run (as ``tsm log --attempt``)
``TSM_RESTART_COUNT``  how many times the app was restarted before this attempt (failures and preemptions)
``TSM_LAST_EXIT``      why the attempt before ended: ``preempted``, ``failed:<code>``, ``stalled`` or
                       ``time_limit``; empty on the first attempt (:func:`last_exit` returns None then)

``TSM_WARN_SIGNAL`` names the warning signal (e.g. ``USR1``) when the app asked for one. Without PyTorch,
without tsm's schedulers: this module imports only ``os`` and ``signal``.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

__all__ = ["LAST_EXITS", "PREEMPTED_PREFIX", "attempt", "last_exit", "on_warning", "restart_count", "warn_signal", "warned"]

#: What ``TSM_LAST_EXIT`` may say (``failed:<code>`` carries the exit code, e.g. ``failed:3``).
LAST_EXITS = ("preempted", "failed:<code>", "stalled", "time_limit")

#: How a replica's error starts when the cluster's decision ended it (preemption, a lost node, a time limit
#: with ``requeue_on_time_limit``): backends set ``ReplicaStatus.preempted`` with it.
PREEMPTED_PREFIX = "preempted: "

_warned = False


def _int_env(name: str) -> int:
    try:
        return max(0, int(os.environ.get(name, "0")))
    except ValueError:
        return 0


def attempt() -> int:
    """This replica's attempt (``TSM_ATTEMPT``): 0 for its first run."""
    return _int_env("TSM_ATTEMPT")


def restart_count() -> int:
    """How many times the app was restarted before this attempt (``TSM_RESTART_COUNT``); 0 on the first."""
    return _int_env("TSM_RESTART_COUNT")


def last_exit() -> str | None:
    """Why the previous attempt ended (``TSM_LAST_EXIT``): ``preempted``, ``failed:<code>``, ``stalled``,
    ``time_limit``; None on the first attempt."""
    return os.environ.get("TSM_LAST_EXIT") or None


def warn_signal() -> signal.Signals | None:
    """The signal tsm warns this replica with (``TSM_WARN_SIGNAL``), None when the app asked for none."""
    name = os.environ.get("TSM_WARN_SIGNAL", "").strip().upper()
    if not name:
        return None
    try:
        return signal.Signals[name if name.startswith("SIG") else "SIG" + name]
    except KeyError:
        return None


def warned() -> bool:
    """True once the warning came (the callback of :func:`on_warning` has run or is running)."""
    return _warned


def on_warning(callback: Callable[[], object], sig: signal.Signals | int | None = None) -> signal.Signals:
    """Run ``callback()`` once when the warning signal arrives; returns the signal it listens for.

    The signal is ``sig``, else ``TSM_WARN_SIGNAL``, else SIGUSR1 (also what Slurm's ``--signal`` sends by
    convention). The handler replaces the signal's default action, which for USR1 would end the process,
    so a warned replica keeps running: checkpoint in the callback, then keep going (SIGTERM follows after
    ``warn_before`` on a cancel or a stall, at the limit for a time limit) or exit. A second warning does
    nothing. Call it from the main thread (Python runs signal handlers there, between bytecodes).
    """
    chosen = signal.Signals(sig) if sig is not None else (warn_signal() or signal.SIGUSR1)

    def _handler(signum: int, frame: object) -> None:
        global _warned
        if _warned:
            return
        _warned = True
        callback()

    signal.signal(chosen, _handler)
    return chosen
