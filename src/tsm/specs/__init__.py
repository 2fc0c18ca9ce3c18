"""Plain data and pure functions: apps, roles, resources, states, macros, run options, handles, mounts.

``tsm.specs`` knows nothing of schedulers or components; everything else in tsm is built on it. It has
TorchX 0.7's ``torchx.specs`` names but ``materialize_appdef``, which reads a component's command line
(tsm's is :func:`tsm.components.materialize`; TorchX's is ``tsm.specs.builders``'s, and under the alias
``torchx.specs`` is the TorchX wing's face of this package: see ``docs/torchx-compat.md``). TorchX's
exception names are aliases of tsm's classes, so ``except UnknownAppException`` catches
:class:`~tsm.errors.UnknownAppError`. ``builders``, ``file_linter``, ``finder`` and the named-resource tables
``named_resources_aws``/``_generic`` are TorchX's modules at TorchX's paths (the wing's, re-exported).
"""

from tsm.errors import (
    AppStatusError,
    ComponentError as ComponentValidationException,
    ComponentNotFoundError as ComponentNotFoundException,
    InvalidRunOptionError as InvalidRunConfigException,
    MalformedAppHandleError as MalformedAppHandleException,
    UnknownAppError as UnknownAppException,
    UnknownSchedulerError as UnknownSchedulerException,
)
from tsm.specs.api import (
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
    ReplicaState,
    ReplicaStatus,
    Resource,
    RetryPolicy,
    Role,
    RoleStatus,
    SchedulerBackend,
    is_null_resource,
    is_terminal,
    iter_replicas,
    macros,
)
from tsm.specs.environment import Environment
from tsm.specs.handles import ParsedAppHandle, make_app_handle, parse_app_handle
from tsm.specs.mounts import BindMount, DeviceMount, Mount, MountType, VolumeMount, parse_mounts
from tsm.specs.named_resources import (
    GiB,
    get_named_resource,
    get_named_resources,
    named_resources,
    resource,
)
from tsm.specs.runopts import CfgVal, get_type_name, is_type, parse_cfg_value, runopt, runopts
from tsm.specs.validate import check_name, check_resources, validate_app, validate_role

__all__ = [
    "ALL",
    "MISSING",
    "NONE",
    "NULL_IMAGE",
    "NULL_RESOURCE",
    "AppDef",
    "AppDryRunInfo",
    "AppHandle",
    "AppState",
    "AppStatus",
    "AppStatusError",
    "BindMount",
    "CfgVal",
    "ComponentNotFoundException",
    "ComponentValidationException",
    "DeviceMount",
    "Environment",
    "GiB",
    "InvalidRunConfigException",
    "MalformedAppHandleException",
    "Mount",
    "MountType",
    "ParsedAppHandle",
    "ReplicaState",
    "ReplicaStatus",
    "Resource",
    "RetryPolicy",
    "Role",
    "RoleStatus",
    "SchedulerBackend",
    "UnknownAppException",
    "UnknownSchedulerException",
    "VolumeMount",
    "check_name",
    "check_resources",
    "get_named_resource",
    "get_named_resources",
    "get_type_name",
    "is_null_resource",
    "is_terminal",
    "is_type",
    "iter_replicas",
    "macros",
    "make_app_handle",
    "named_resources",
    "parse_app_handle",
    "parse_cfg_value",
    "parse_mounts",
    "resource",
    "runopt",
    "runopts",
    "validate_app",
    "validate_role",
]
