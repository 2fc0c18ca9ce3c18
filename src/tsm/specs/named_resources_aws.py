"""TorchX's ``torchx.specs.named_resources_aws`` at tsm's path: re-exports :mod:`tsm.compat.torchx.specs.named_resources_aws` (the TorchX wing)."""

from tsm.compat.torchx.specs.named_resources_aws import *  # noqa: F403
from tsm.compat.torchx.specs.named_resources_aws import __all__ as __all__
