"""TorchX's ``torchx.specs.builders`` at tsm's path: re-exports :mod:`tsm.compat.torchx.specs.builders` (the TorchX wing)."""

from tsm.compat.torchx.specs.builders import *  # noqa: F403
from tsm.compat.torchx.specs.builders import __all__ as __all__
