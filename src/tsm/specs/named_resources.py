"""Named resources: ``-h gpu.small`` instead of ``--cpu 8 --gpu 1 --memMB 32768``.

The names and sizes are TorchX's, so a job ported from TorchX asks for the same machine: the generic
t-shirt sizes (``cpu.nano`` ... ``cpu.xlarge``, ``gpu.small`` ... ``gpu.xlarge``) and the AWS instance
types (``aws_p3.2xlarge``, ``aws_g5.12xlarge``, ...; memory less AWS's 4% overhead, the instance type
in ``capabilities["node.kubernetes.io/instance-type"]``, EFA and Neuron devices in ``devices``). ``NULL`` and
``MISSING`` name :data:`~tsm.specs.NULL_RESOURCE`.

Packages add more through the entry-point groups ``torchx.named_resources`` and then
``tsm.named_resources`` (a later entry wins); each entry is a zero-argument callable returning a
:class:`Resource` (or the Resource itself).

:data:`named_resources` is dict-like: ``named_resources["gpu.small"]``, ``"gpu.small" in
named_resources``, ``len()``, iteration over the names; calling it, ``named_resources()``, returns the
sorted names.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Iterator
from typing import Any

from tsm.errors import UnknownResourceError, did_you_mean
from tsm.specs.api import NULL_RESOURCE, Resource

GiB = 1024

#: AWS keeps about 4% of an instance's memory for itself; asking for all of it would never schedule.
AWS_MEM_TAX = 0.96
_AWS_GiB = int(GiB * AWS_MEM_TAX)

#: The capability naming an AWS instance type (a Kubernetes node label).
K8S_ITYPE = "node.kubernetes.io/instance-type"

#: The device name of AWS's Elastic Fabric Adapter.
EFA_DEVICE = "vpc.amazonaws.com/efa"

#: The device name of AWS's Neuron accelerators (Trainium instances).
NEURON_DEVICE = "aws.amazon.com/neurondevice"

GENERIC: dict[str, tuple[int, int, int]] = {  # name: (cpu, gpu, memMB)
    "gpu.small": (8, 1, 32 * GiB),
    "gpu.medium": (16, 2, 64 * GiB),
    "gpu.large": (32, 4, 128 * GiB),
    "gpu.xlarge": (64, 8, 256 * GiB),
    "cpu.nano": (1, 0, 512),
    "cpu.micro": (1, 0, 1 * GiB),
    "cpu.small": (1, 0, 2 * GiB),
    "cpu.medium": (2, 0, 4 * GiB),
    "cpu.large": (2, 0, 8 * GiB),
    "cpu.xlarge": (8, 0, 32 * GiB),
}

AWS: dict[str, tuple[int, int, int, int, int]] = {  # instance type: (cpu, gpu, GiB of memory, EFA, Neuron devices)
    "t3.medium": (2, 0, 4, 0, 0),
    "m5.2xlarge": (8, 0, 32, 0, 0),
    "p3.2xlarge": (8, 1, 61, 0, 0),
    "p3.8xlarge": (32, 4, 244, 0, 0),
    "p3.16xlarge": (64, 8, 488, 0, 0),
    "p3dn.24xlarge": (96, 8, 768, 1, 0),
    "p4d.24xlarge": (96, 8, 1152, 4, 0),
    "p4de.24xlarge": (96, 8, 1152, 4, 0),
    "p5.48xlarge": (192, 8, 2048, 32, 0),
    "g4dn.xlarge": (4, 1, 16, 0, 0),
    "g4dn.2xlarge": (8, 1, 32, 0, 0),
    "g4dn.4xlarge": (16, 1, 64, 0, 0),
    "g4dn.8xlarge": (32, 1, 128, 1, 0),
    "g4dn.12xlarge": (48, 4, 192, 1, 0),
    "g4dn.16xlarge": (64, 1, 256, 1, 0),
    "g4dn.metal": (96, 8, 384, 1, 0),
    "g5.xlarge": (4, 1, 16, 0, 0),
    "g5.2xlarge": (8, 1, 32, 0, 0),
    "g5.4xlarge": (16, 1, 64, 0, 0),
    "g5.8xlarge": (32, 1, 128, 1, 0),
    "g5.12xlarge": (48, 4, 192, 1, 0),
    "g5.16xlarge": (64, 1, 256, 1, 0),
    "g5.24xlarge": (96, 4, 384, 1, 0),
    "g5.48xlarge": (192, 8, 768, 1, 0),
    "trn1.2xlarge": (8, 0, 32, 0, 1),
    "trn1.32xlarge": (128, 0, 512, 8, 16),
}


def _generic(cpu: int, gpu: int, mem: int) -> Resource:
    return Resource(cpu=cpu, gpu=gpu, memMB=mem)


def _aws(itype: str, cpu: int, gpu: int, gib: int, efa: int, neuron: int) -> Resource:
    devices = {name: n for name, n in ((EFA_DEVICE, efa), (NEURON_DEVICE, neuron)) if n}
    return Resource(cpu=cpu, gpu=gpu, memMB=gib * _AWS_GiB, capabilities={K8S_ITYPE: itype}, devices=devices)


def _builtins() -> dict[str, Callable[[], Resource]]:
    table: dict[str, Callable[[], Resource]] = {
        name: functools.partial(_generic, *size) for name, size in GENERIC.items()
    }
    for itype, size in AWS.items():
        table[f"aws_{itype}"] = functools.partial(_aws, itype, *size)
    table["NULL"] = table["MISSING"] = functools.partial(copy.deepcopy, NULL_RESOURCE)
    return table


#: Entry-point groups read for more named resources, in order (a later one wins on a name clash).
GROUPS = ("torchx.named_resources", "tsm.named_resources")

_cache: dict[str, Callable[[], Resource]] | None = None


def _load() -> dict[str, Callable[[], Resource]]:
    global _cache
    if _cache is None:
        from tsm.runner.plugins import entry_points

        found = _builtins()
        for ep in entry_points(GROUPS):
            obj: Any = ep.load()
            # a Resource given as such: hand out copies, so a caller changing one changes no other
            found[ep.name] = obj if callable(obj) else functools.partial(copy.deepcopy, obj)
        _cache = found
    return _cache


def factories() -> dict[str, Callable[[], Resource]]:
    """Every named resource, builtins and plugins, as ``{name: zero-argument factory}`` (read once, shared)."""
    return _load()


def get_named_resource(name: str) -> Resource:
    """The Resource registered as ``name`` (a fresh copy); an unknown name errors with a did-you-mean.

    The error is an :class:`~tsm.errors.UnknownResourceError`, which is also a ``KeyError`` as in TorchX.
    """
    table = _load()
    if name not in table:
        raise UnknownResourceError(
            f"unknown named resource '{name}'{did_you_mean(name, table)}; known: {', '.join(sorted(table))}"
        )
    res = table[name]()
    if not isinstance(res, Resource):
        raise UnknownResourceError(f"named resource '{name}' did not produce a Resource (got {type(res).__name__})")
    return res


#: TorchX's name for :func:`get_named_resource`.
get_named_resources = get_named_resource


class NamedResources:
    """The registry as a read-only mapping of name to a fresh :class:`Resource`; call it for the sorted names."""

    def __getitem__(self, name: str) -> Resource:
        return get_named_resource(name)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in _load()

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(_load()))

    def __len__(self) -> int:
        return len(_load())

    def keys(self) -> list[str]:
        """The sorted names."""
        return sorted(_load())

    def get(self, name: str, default: Resource | None = None) -> Resource | None:
        """``named_resources[name]``, or ``default`` when there is no such name."""
        return get_named_resource(name) if name in self else default

    def __call__(self) -> list[str]:
        return self.keys()

    def __repr__(self) -> str:
        return f"named_resources({len(self)} names)"


#: Every known named resource, builtins and plugins (dict-like; see the module docstring).
named_resources = NamedResources()


def resource(
    cpu: int | None = None,
    gpu: int | None = None,
    memMB: int | None = None,  # noqa: N803 (TorchX's name)
    h: str | None = None,
) -> Resource:
    """A Resource from a named one (``h``, which wins) or from sizes, as TorchX's ``specs.resource``.

    Sizes not given (or 0) take TorchX's defaults: 2 CPUs, 0 GPUs, 1024 MB.
    """
    if h:
        return get_named_resource(h)
    return Resource(cpu=cpu or 2, gpu=gpu or 0, memMB=memMB or 1024)
