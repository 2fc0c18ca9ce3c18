"""TorchX's ``torchx.schedulers.docker_scheduler`` at tsm's path: re-exports :mod:`tsm.compat.torchx.schedulers.docker_scheduler` (the TorchX wing)."""

from tsm.compat.torchx.schedulers.docker_scheduler import *  # noqa: F403
from tsm.compat.torchx.schedulers.docker_scheduler import __all__ as __all__
