"""TorchX's ``torchx.schedulers.slurm_scheduler`` at tsm's path: re-exports :mod:`tsm.compat.torchx.schedulers.slurm_scheduler` (the TorchX wing)."""

from tsm.compat.torchx.schedulers.slurm_scheduler import *  # noqa: F403
from tsm.compat.torchx.schedulers.slurm_scheduler import __all__ as __all__
