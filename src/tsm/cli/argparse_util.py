"""TorchX's ``torchx.cli.argparse_util`` at tsm's path: re-exports :mod:`tsm.compat.torchx.cli.argparse_util` (the TorchX wing)."""

from tsm.compat.torchx.cli.argparse_util import *  # noqa: F403
from tsm.compat.torchx.cli.argparse_util import __all__ as __all__
