"""Checks an AppDef must pass before any scheduler sees it; each failure names the role and the field."""

from __future__ import annotations

import math
import re

from tsm.errors import InvalidAppError
from tsm.specs.api import AppDef, Resource, RetryPolicy, Role

#: Names become path components, process titles and (on cluster schedulers) parts of host names, so
#: they are kept to letters, digits, '-' and '_', start with a letter or digit, and are at most 63 long.
#: ``\Z`` rather than ``$``, which would also accept a trailing newline.
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,62}\Z")


def check_name(name: object, what: str) -> None:
    """Raise unless ``name`` is safe as a path component and a host label (see :data:`NAME_RE`)."""
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise InvalidAppError(
            f"{what} {name!r} is not allowed: use 1-63 letters, digits, '-' or '_', starting with a letter or digit"
        )


def _check_str_list(values: object, where: str) -> None:
    if not isinstance(values, list) or not all(isinstance(a, str) for a in values):
        raise InvalidAppError(f"{where} must be a list of strings, got {values!r}")
    for a in values:
        if "\x00" in a:
            raise InvalidAppError(f"{where} contains a NUL byte, which no process can receive: {a!r}")


def _check_resource(res: object, where: str) -> None:
    if not isinstance(res, Resource):
        raise InvalidAppError(f"{where} must be a tsm.Resource, got {type(res).__name__}")
    for field_name in ("cpu", "gpu", "memMB"):
        v = getattr(res, field_name)
        not_finite = isinstance(v, float) and not math.isfinite(v)  # NaN compares as not < 0
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not_finite or v < 0:
            raise InvalidAppError(f"{where}.{field_name} must be a number >= 0, got {v!r}")
    if not isinstance(res.devices, dict):
        raise InvalidAppError(f"{where}.devices must be a dict of device name to count, got {res.devices!r}")
    for dev, n in res.devices.items():
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise InvalidAppError(f"{where}.devices[{dev!r}] must be an integer >= 0, got {n!r}")


def validate_role(role: Role) -> None:
    """Check one role; raises :class:`InvalidAppError` naming the role and the field."""
    check_name(role.name, "role name")
    where = f"role '{role.name}'"
    if not isinstance(role.entrypoint, str) or not role.entrypoint.strip():
        raise InvalidAppError(f"{where}: entrypoint is empty; set the command to run")
    if "\x00" in role.entrypoint:
        raise InvalidAppError(f"{where}: entrypoint contains a NUL byte")
    _check_str_list(role.args, f"{where}: args")
    if not isinstance(role.env, dict):
        raise InvalidAppError(f"{where}: env must be a dict of str to str")
    for k, v in role.env.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise InvalidAppError(f"{where}: env entry {k!r}={v!r} must map str to str")
        if not k or "=" in k or "\x00" in k:
            raise InvalidAppError(f"{where}: env name {k!r} is not allowed: it must be non-empty, without '=' or NUL")
        if "\x00" in v:
            raise InvalidAppError(f"{where}: env[{k!r}] contains a NUL byte, which no process can receive: {v!r}")
    if isinstance(role.num_replicas, bool) or not isinstance(role.num_replicas, int) or role.num_replicas <= 0:
        raise InvalidAppError(f"{where}: num_replicas must be an integer > 0, got {role.num_replicas!r}")
    if role.min_replicas is not None:
        if isinstance(role.min_replicas, bool) or not isinstance(role.min_replicas, int) or role.min_replicas <= 0:
            raise InvalidAppError(f"{where}: min_replicas must be an integer > 0, got {role.min_replicas!r}")
        if role.min_replicas > role.num_replicas:
            raise InvalidAppError(
                f"{where}: min_replicas ({role.min_replicas}) is greater than num_replicas ({role.num_replicas})"
            )
    if isinstance(role.max_retries, bool) or not isinstance(role.max_retries, int) or role.max_retries < 0:
        raise InvalidAppError(f"{where}: max_retries must be an integer >= 0, got {role.max_retries!r}")
    if not isinstance(role.retry_policy, RetryPolicy):
        raise InvalidAppError(f"{where}: retry_policy must be a tsm.RetryPolicy, got {role.retry_policy!r}")
    _check_resource(role.resource, f"{where}: resource")
    if not isinstance(role.port_map, dict):
        raise InvalidAppError(f"{where}: port_map must be a dict of port name to port number, got {role.port_map!r}")
    for pname, port in role.port_map.items():
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*\Z", str(pname)):
            raise InvalidAppError(f"{where}: port_map name {pname!r} must be a valid identifier")
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise InvalidAppError(f"{where}: port_map[{pname!r}] must be a port number 0-65535, got {port!r}")


def validate_app(app: AppDef) -> None:
    """Check the whole app before submission: name, at least one role, each role, unique role names."""
    if not isinstance(app, AppDef):
        raise InvalidAppError(f"expected a tsm.AppDef, got {type(app).__name__}")
    check_name(app.name, "app name")
    if not app.roles:
        raise InvalidAppError(f"app '{app.name}' has no roles; add at least one Role")
    seen: set[str] = set()
    for role in app.roles:
        if not isinstance(role, Role):
            raise InvalidAppError(f"app '{app.name}': roles must be tsm.Role, got {type(role).__name__}")
        validate_role(role)
        if role.name in seen:
            raise InvalidAppError(f"app '{app.name}': role name '{role.name}' is used twice; role names must be unique")
        seen.add(role.name)
