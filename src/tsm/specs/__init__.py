"""Plain data and pure functions: apps, roles, resources, states, macros, run options, handles.

``tsm.specs`` knows nothing of schedulers; everything else in tsm is built on it.
"""

from tsm.specs.api import (
    NULL_IMAGE,
    AppDef,
    AppDryRunInfo,
    AppState,
    AppStatus,
    ReplicaStatus,
    Resource,
    RetryPolicy,
    Role,
    RoleStatus,
    is_terminal,
    iter_replicas,
    macros,
)
from tsm.specs.handles import ParsedAppHandle, make_app_handle, parse_app_handle
from tsm.specs.named_resources import get_named_resource, named_resources
from tsm.specs.runopts import CfgVal, is_type, parse_cfg_value, runopt, runopts
from tsm.specs.validate import check_name, validate_app, validate_role

__all__ = [
    "NULL_IMAGE",
    "AppDef",
    "AppDryRunInfo",
    "AppState",
    "AppStatus",
    "CfgVal",
    "ParsedAppHandle",
    "ReplicaStatus",
    "Resource",
    "RetryPolicy",
    "Role",
    "RoleStatus",
    "check_name",
    "get_named_resource",
    "is_terminal",
    "is_type",
    "iter_replicas",
    "macros",
    "make_app_handle",
    "named_resources",
    "parse_app_handle",
    "parse_cfg_value",
    "runopt",
    "runopts",
    "validate_app",
    "validate_role",
]
