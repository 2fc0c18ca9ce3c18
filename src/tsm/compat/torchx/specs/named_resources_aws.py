"""TorchX's ``specs.named_resources_aws``: the AWS instance types as named resources, at TorchX's path.

``NAMED_RESOURCES`` maps ``"aws_p3.2xlarge"`` to a zero-argument factory, and each factory is also a
module attribute under TorchX's spelling, ``aws_p3_2xlarge()`` (dots become underscores). The sizes are
tsm's table (:data:`tsm.specs.named_resources.AWS`), so ``-h aws_p3.2xlarge`` and these factories always
agree. ``GiB`` is TorchX's taxed gibibyte (1024 MB less AWS's 4%), the unit of those sizes.
:func:`instance_type_from_resource` reads the instance type back from a resource.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping

from tsm.specs.api import Resource
from tsm.specs.named_resources import AWS, AWS_MEM_TAX, EFA_DEVICE, K8S_ITYPE, NEURON_DEVICE, factories

#: TorchX's ``MEM_TAX``: the share of an instance's memory a replica may ask for.
MEM_TAX = AWS_MEM_TAX

#: One GiB as these sizes count it (``int(1024 * MEM_TAX)`` MB).
GiB: int = int(1024 * MEM_TAX)

#: ``"aws_<instance type>"`` -> factory of its :class:`Resource`.
NAMED_RESOURCES: Mapping[str, Callable[[], Resource]] = {f"aws_{itype}": factories()[f"aws_{itype}"] for itype in AWS}

# TorchX's function names: aws_p3_2xlarge, aws_g5_48xlarge, ... (set here so `from ... import aws_x` works)
_FUNCTIONS = {"aws_" + itype.replace(".", "_"): NAMED_RESOURCES["aws_" + itype] for itype in AWS}
globals().update(_FUNCTIONS)

__all__ = ["AWS_MEM_TAX", "EFA_DEVICE", "GiB", "K8S_ITYPE", "MEM_TAX", "NAMED_RESOURCES", "NEURON_DEVICE",
           "instance_type_from_resource", *sorted(_FUNCTIONS)]


def instance_type_from_resource(resource: Resource) -> str | None:
    """The AWS instance type a resource was made from (its Kubernetes instance-type capability), or None.

    A resource without one warns, as in TorchX: schedulers that place by instance type cannot tell.
    """
    itype = resource.capabilities.get(K8S_ITYPE)
    if itype is None:
        warnings.warn(f"the resource has no {K8S_ITYPE} capability, so its AWS instance type is unknown",
                      stacklevel=2)
        return None
    return str(itype)
