"""TorchX's ``torchx.specs.file_linter`` at tsm's path: re-exports :mod:`tsm.compat.torchx.specs.file_linter` (the TorchX wing)."""

from tsm.compat.torchx.specs.file_linter import *  # noqa: F403
from tsm.compat.torchx.specs.file_linter import __all__ as __all__
