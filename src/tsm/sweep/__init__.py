"""Sweeps: one component run over a grid or a random space, ``parallel`` trials at a time, on any scheduler.

::

    from tsm import get_runner

    with get_runner() as runner:
        sweep = runner.run_sweep("utils.echo", {"msg": ["hello", "world"]}, scheduler="local", parallel=2)
        print(runner.sweep_wait(sweep).summary())
        for trial in runner.sweep_list(sweep):
            print(trial.idx, trial.params, trial.state, trial.handle)

The modules: :mod:`tsm.sweep.space` (axes, grid/random expansion), :mod:`tsm.sweep.state` (the durable
state and ``sweep://`` handles), :mod:`tsm.sweep.controller` (the detached process that feeds trials to the
Runner and survives the terminal), :mod:`tsm.sweep.api` (what the Runner and ``tsm sweep`` call),
:mod:`tsm.sweep.results` (the results table). ``docs/sweeps.md`` is the user's guide.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any


def fold_list(apps: Sequence[Any]) -> list[Any]:
    """``tsm list``'s rows with each sweep folded into one line (:func:`tsm.sweep.status.fold_list`).

    Without any sweep under ``$TSM_HOME`` this imports nothing more, so ``tsm list`` pays for sweeps only
    once there are some.
    """
    from tsm.store import tsm_home

    if not (tsm_home() / "sweeps").is_dir():
        return list(apps)
    from tsm.sweep.status import fold_list as fold

    return fold(apps)
