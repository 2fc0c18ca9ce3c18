"""Named resources: ``-h gpu.small`` instead of ``--cpu 8 --gpu 1 --memMB 30000``.

A few generic shapes are built in; packages add more through the entry-point group
``tsm.named_resources`` whose entries are zero-argument callables returning a :class:`Resource`
(or the Resource itself).
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from typing import Any

from tsm.errors import UnknownResourceError, did_you_mean
from tsm.specs.api import Resource

GiB = 1024

_BUILTIN: dict[str, Callable[[], Resource]] = {
    "cpu.small": lambda: Resource(cpu=1, gpu=0, memMB=2 * GiB),
    "cpu.medium": lambda: Resource(cpu=4, gpu=0, memMB=8 * GiB),
    "cpu.large": lambda: Resource(cpu=16, gpu=0, memMB=64 * GiB),
    "gpu.small": lambda: Resource(cpu=8, gpu=1, memMB=32 * GiB),
    "gpu.medium": lambda: Resource(cpu=32, gpu=4, memMB=128 * GiB),
    "gpu.large": lambda: Resource(cpu=64, gpu=8, memMB=512 * GiB),
}

_cache: dict[str, Callable[[], Resource]] | None = None


def _load() -> dict[str, Callable[[], Resource]]:
    global _cache
    if _cache is None:
        from importlib.metadata import entry_points

        found = dict(_BUILTIN)
        for ep in entry_points(group="tsm.named_resources"):
            obj: Any = ep.load()
            # a Resource given as such: hand out copies, so a caller changing one changes no other
            found[ep.name] = obj if callable(obj) else functools.partial(copy.deepcopy, obj)
        _cache = found
    return _cache


def named_resources() -> list[str]:
    """Every known named resource, builtins and plugins."""
    return sorted(_load())


def get_named_resource(name: str) -> Resource:
    """The Resource registered as ``name``; an unknown name errors with a did-you-mean."""
    table = _load()
    if name not in table:
        raise UnknownResourceError(
            f"unknown named resource '{name}'{did_you_mean(name, table)}; known: {', '.join(sorted(table))}"
        )
    res = table[name]()
    if not isinstance(res, Resource):
        raise UnknownResourceError(f"named resource '{name}' did not produce a Resource (got {type(res).__name__})")
    return res
