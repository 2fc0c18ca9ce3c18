"""TorchX's ``torchx.cli.cmd_base`` at tsm's path: re-exports :mod:`tsm.compat.torchx.cli.cmd_base` (the TorchX wing)."""

from tsm.compat.torchx.cli.cmd_base import *  # noqa: F403
from tsm.compat.torchx.cli.cmd_base import __all__ as __all__
