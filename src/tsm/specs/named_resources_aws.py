"""TorchX's ``specs.named_resources_aws``: the AWS instance types as named resources, at TorchX's path.

``NAMED_RESOURCES`` maps ``"aws_p3.2xlarge"`` to a zero-argument factory, and each factory is also a
module attribute under TorchX's spelling, ``aws_p3_2xlarge()`` (dots become underscores). The sizes are
tsm's table (:data:`tsm.specs.named_resources.AWS`), so ``-h aws_p3.2xlarge`` and these factories always
agree. :func:`instance_type_from_resource` reads the instance type back from a resource.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from tsm.specs.api import Resource
from tsm.specs.named_resources import AWS, AWS_MEM_TAX, EFA_DEVICE, K8S_ITYPE, _builtins

__all__ = ["AWS_MEM_TAX", "EFA_DEVICE", "K8S_ITYPE", "NAMED_RESOURCES", "instance_type_from_resource"]

#: ``"aws_<instance type>"`` -> factory of its :class:`Resource`.
NAMED_RESOURCES: Mapping[str, Callable[[], Resource]] = {
    name: factory for name, factory in _builtins().items() if name.startswith("aws_")
}

# TorchX's function names: aws_p3_2xlarge, aws_g5_48xlarge, ...
_FUNCTIONS: dict[str, Callable[[], Resource]] = {
    "aws_" + itype.replace(".", "_"): NAMED_RESOURCES["aws_" + itype] for itype in AWS
}


def instance_type_from_resource(resource: Resource) -> str:
    """The AWS instance type a resource was made from (its Kubernetes instance-type capability), or ``""``."""
    return str(resource.capabilities.get(K8S_ITYPE, ""))


def __getattr__(name: str) -> Callable[[], Resource]:
    try:
        return _FUNCTIONS[name]
    except KeyError:
        raise AttributeError(f"module 'tsm.specs.named_resources_aws' has no attribute {name!r}") from None


def __dir__() -> list[str]:
    return sorted([*__all__, *_FUNCTIONS])
