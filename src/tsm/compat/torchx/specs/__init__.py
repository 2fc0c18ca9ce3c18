"""TorchX's ``torchx.specs`` package: every name of :mod:`tsm.specs`, plus what TorchX's package adds.

The records, states, macros and run options are tsm's own objects (``torchx.specs.AppDef is
tsm.specs.AppDef``). What differs is TorchX's: :func:`materialize_appdef` and :func:`parse_mounts` are
TorchX's builders (:mod:`tsm.compat.torchx.specs.builders`), and :data:`named_resources` is TorchX's
library over the module's ``_named_resource_factories`` (every name tsm knows, builtins and plugins), whose
unknown name is a ``KeyError`` reading ``No named resource found for `x`. Did you mean `y`?``.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator

from tsm.compat.torchx.specs.builders import make_app_handle, materialize_appdef, parse_mounts

# every name of tsm.specs (the builders' three, the named resources' and resource() are TorchX's own here)
from tsm.specs import (
    ALL,
    MISSING,
    NONE,
    NULL_IMAGE,
    NULL_RESOURCE,
    AppDef,
    AppDryRunInfo,
    AppHandle,
    AppState,
    AppStatus,
    AppStatusError,
    BindMount,
    CfgVal,
    ComponentNotFoundException,
    ComponentValidationException,
    DeviceMount,
    GiB,
    InvalidRunConfigException,
    MalformedAppHandleException,
    Mount,
    MountType,
    ParsedAppHandle,
    ReplicaState,
    ReplicaStatus,
    Resource,
    RetryPolicy,
    Role,
    RoleStatus,
    SchedulerBackend,
    UnknownAppException,
    UnknownSchedulerException,
    VolumeMount,
    check_name,
    check_resources,
    get_named_resource,
    get_type_name,
    is_null_resource,
    is_terminal,
    is_type,
    iter_replicas,
    macros,
    parse_app_handle,
    parse_cfg_value,
    runopt,
    runopts,
    validate_app,
    validate_role,
)
from tsm.specs.named_resources import factories as _factories

__all__ = [
    "ALL", "MISSING", "NONE", "NULL_IMAGE", "NULL_RESOURCE", "AppDef", "AppDryRunInfo", "AppHandle",
    "AppState", "AppStatus", "AppStatusError", "BindMount", "CfgVal", "ComponentNotFoundException",
    "ComponentValidationException", "DeviceMount", "GiB", "InvalidRunConfigException",
    "MalformedAppHandleException", "Mount", "MountType", "ParsedAppHandle", "ReplicaState", "ReplicaStatus",
    "Resource", "RetryPolicy", "Role", "RoleStatus", "SchedulerBackend", "UnknownAppException",
    "UnknownSchedulerException", "VolumeMount", "check_name", "check_resources", "get_named_resource",
    "get_type_name", "is_null_resource", "is_terminal", "is_type", "iter_replicas", "macros",
    "parse_app_handle", "parse_cfg_value", "runopt", "runopts", "validate_app", "validate_role",
    "make_app_handle", "materialize_appdef", "parse_mounts",
]

#: name -> factory of every named resource (TorchX's module global; tests patch it).
_named_resource_factories: dict[str, Callable[[], Resource]] = _factories()


class _NamedResourcesLibrary:
    """TorchX's ``named_resources``: ``lib[name]`` is a fresh Resource, ``name in lib``; names are not listed."""

    def __getitem__(self, key: str) -> Resource:
        factories = _named_resource_factories
        if key in factories:
            return factories[key]()
        close = difflib.get_close_matches(key, factories.keys(), n=1)
        hint = f"Did you mean `{close[0]}`?" if close else f"Registered named resources: {list(factories.keys())}"
        raise KeyError(f"No named resource found for `{key}`. {hint}")

    def __contains__(self, key: str) -> bool:
        return key in _named_resource_factories

    def __iter__(self) -> Iterator[str]:
        raise NotImplementedError("named resources doesn't support iterating")


#: TorchX's ``specs.named_resources``.
named_resources = _NamedResourcesLibrary()


def get_named_resources(res: str) -> Resource:
    """The named resource ``res`` (TorchX's function): ``named_resources[res]``."""
    return named_resources[res]


def resource(cpu: int | None = None, gpu: int | None = None, memMB: int | None = None,  # noqa: N803
             h: str | None = None) -> Resource:
    """TorchX's ``specs.resource``: the named resource ``h`` if given, else the sizes (2 CPUs, 0 GPUs, 1024 MB)."""
    if h:
        return get_named_resources(h)
    return Resource(cpu=cpu or 2, gpu=gpu or 0, memMB=memMB or 1024)


__all__ += ["_NamedResourcesLibrary", "get_named_resources", "named_resources", "resource"]


def __getattr__(name: str) -> object:
    """``Workspace`` (TorchX nightly keeps it in ``specs``), loaded on first use: the workspace code stays out of
    ``import torchx.specs``."""
    if name == "Workspace":
        from tsm.workspace.mixin import Workspace

        return Workspace
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
