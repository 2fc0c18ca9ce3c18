"""Sweeps: one component run over a grid or a random space, ``parallel`` trials at a time, on any scheduler.

::

    from tsm import get_runner
    from tsm.sweep import run_sweep, sweep_trials, sweep_wait

    with get_runner() as runner:
        sweep = run_sweep(runner, "utils.echo", {"msg": ["hello", "world"]}, scheduler="local", parallel=2)
    print(sweep_wait(sweep).summary())
    for trial in sweep_trials(sweep):
        print(trial.idx, trial.params, trial.state, trial.handle)

The modules: :mod:`tsm.sweep.space` (axes, grid/random expansion), :mod:`tsm.sweep.state` (the durable
state and ``sweep://`` handles), :mod:`tsm.sweep.controller` (the detached process that feeds trials to the
Runner and survives the terminal), :mod:`tsm.sweep.api` (what the Runner and ``tsm sweep`` call),
:mod:`tsm.sweep.results` (the results table). ``docs/sweeps.md`` is the user's guide. A sweep asks the runner
for everything it launches, watches and records; the runner knows nothing of sweeps.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

    from tsm.sweep.api import (
        SweepPlan as SweepPlan,
        plan_sweep as plan_sweep,
        resume as resume,
        run_sweep as run_sweep,
        sweep_cancel as sweep_cancel,
        sweep_status as sweep_status,
        sweep_trials as sweep_trials,
        sweep_wait as sweep_wait,
        sweeps as sweeps,
    )
    from tsm.sweep.status import SweepStatus as SweepStatus


#: What ``from tsm.sweep import NAME`` finds in :mod:`tsm.sweep.api` (imported on first use: ``tsm list`` needs none).
_API = frozenset(("run_sweep", "plan_sweep", "sweep_status", "sweep_wait", "sweep_cancel", "sweep_trials", "sweeps",
                  "resume", "SweepPlan", "SweepStatus"))

__all__ = sorted(_API | {"fold_list"})


def __getattr__(name: str) -> Any:
    if name in _API:
        from tsm.sweep import api, status

        return getattr(status if name == "SweepStatus" else api, name)
    raise AttributeError(f"module 'tsm.sweep' has no attribute {name!r}")


def fold_list(apps: Sequence[Any], complete: bool = True) -> list[Any]:
    """``tsm list``'s rows with each sweep folded into one line (:func:`tsm.sweep.status.fold_list`).

    Without any sweep under ``$TSM_HOME`` this imports nothing more, so ``tsm list`` pays for sweeps only
    once there are some.
    """
    from tsm.store import tsm_home

    if not (tsm_home() / "sweeps").is_dir():
        return list(apps)
    from tsm.sweep.status import fold_list as fold

    return fold(apps, complete=complete)
