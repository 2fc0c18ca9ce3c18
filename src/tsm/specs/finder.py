"""TorchX's ``torchx.specs.finder`` at tsm's path: re-exports :mod:`tsm.compat.torchx.specs.finder` (the TorchX wing)."""

from tsm.compat.torchx.specs.finder import *  # noqa: F403
from tsm.compat.torchx.specs.finder import __all__ as __all__
