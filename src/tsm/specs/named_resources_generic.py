"""TorchX's ``torchx.specs.named_resources_generic`` at tsm's path: re-exports :mod:`tsm.compat.torchx.specs.named_resources_generic` (the TorchX wing)."""

from tsm.compat.torchx.specs.named_resources_generic import *  # noqa: F403
from tsm.compat.torchx.specs.named_resources_generic import __all__ as __all__
