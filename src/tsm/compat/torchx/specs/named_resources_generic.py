"""TorchX's ``specs.named_resources_generic``: the cloud-neutral t-shirt sizes, at TorchX's path.

``NAMED_RESOURCES`` maps ``"gpu.small"``, ``"cpu.large"``, ... to zero-argument factories of the same
:class:`Resource` that ``-h gpu.small`` gives (tsm's table, :data:`tsm.specs.named_resources.GENERIC`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from tsm.specs.api import Resource
from tsm.specs.named_resources import GENERIC, GiB, factories

__all__ = ["GiB", "NAMED_RESOURCES"]

#: ``"gpu.small"`` ... ``"cpu.xlarge"`` -> factory of its :class:`Resource`.
NAMED_RESOURCES: Mapping[str, Callable[[], Resource]] = {name: factories()[name] for name in GENERIC}
