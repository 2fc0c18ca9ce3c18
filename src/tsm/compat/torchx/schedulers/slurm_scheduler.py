"""TorchX's ``schedulers.slurm_scheduler`` at TorchX's path: tsm's Slurm scheduler under TorchX's names.

``SlurmScheduler`` *is* tsm's (:class:`tsm.schedulers.slurm.scheduler.SlurmScheduler`), so a tool's subclass
(NeMo-Run's ``SlurmTunnelScheduler``) runs on tsm's backend. :data:`SLURM_STATES` maps every Slurm job
state name tsm knows (a superset of TorchX's table) to an :class:`~tsm.specs.AppState`, from tsm's one
state table, so the two never disagree; :func:`appstate_from_slurm_state` reads it with UNKNOWN for the rest.
"""

from __future__ import annotations

from collections.abc import Mapping

from tsm.schedulers.slurm import create_scheduler as create_scheduler
from tsm.schedulers.slurm.parse import STATES as _STATES
from tsm.schedulers.slurm.scheduler import SlurmScheduler as SlurmScheduler
from tsm.schedulers.slurm.script import SlurmBatchRequest as SlurmBatchRequest, SlurmOptions as SlurmOpts
from tsm.specs.api import AppState

__all__ = ["SLURM_STATES", "SlurmBatchRequest", "SlurmOpts", "SlurmScheduler", "appstate_from_slurm_state",
           "create_scheduler"]

#: Slurm job state name -> AppState (``"COMPLETED"`` -> SUCCEEDED, ``"TIMEOUT"`` -> FAILED, ...).
SLURM_STATES: Mapping[str, AppState] = {
    name: state
    for state in (AppState.PENDING, AppState.RUNNING, AppState.SUCCEEDED, AppState.FAILED, AppState.CANCELLED)
    for name in sorted(_STATES.names(state))
}


def appstate_from_slurm_state(slurm_state: str) -> AppState:
    """The AppState of a Slurm state name; UNKNOWN for a name Slurm may add later."""
    return SLURM_STATES.get(slurm_state, AppState.UNKNOWN)
