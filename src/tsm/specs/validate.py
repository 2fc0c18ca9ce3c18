"""Checks an AppDef must pass before any scheduler sees it; each failure names the role and the field.

Besides types and ranges, every string a replica receives (entrypoint, args, env) must be deliverable to a
real process: no NUL byte, encodable as bytes (:func:`os.fsencode`; a lone surrogate that does not stand
for a byte is not), at most :data:`MAX_ARG_BYTES` bytes each, and all of a role's together within this
system's ``ARG_MAX`` (:func:`check_exec_size`). Failing those at dry run beats an obscure
``Argument list too long`` or a crashed launcher later.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
from collections.abc import Callable, Iterable, Mapping
from functools import partial

from tsm.errors import InvalidAppError, brief
from tsm.specs.api import MISSING, AppDef, Resource, RetryPolicy, Role, is_null_resource
from tsm.specs.mounts import validate_mount

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


#: Linux's limit on one argument or environment entry (``KEY=value``) of a new program: MAX_ARG_STRLEN,
#: 32 pages of 4 KiB including the terminating NUL, so a value may hold one byte less.
MAX_ARG_BYTES = 32 * 4096 - 1

#: ``ARG_MAX`` when the system does not say (Linux's, with the default 8 MiB stack).
DEFAULT_ARG_MAX = 2 * 1024 * 1024
# The most replicas one role may ask for: a dry run builds one request per replica, so an absurd count (a typo
# such as 99999999) would otherwise spend minutes and gigabytes before any scheduler could refuse it.
MAX_REPLICAS = 100_000

#: Linux never allows more than 3/4 of its 8 MiB stack default, whatever the stack limit (``ulimit -s unlimited``
#: makes ``sysconf`` report far more).
_KERNEL_ARG_MAX = 6 * 1024 * 1024


def exec_limit() -> int:
    """Bytes this system lets a program's argv and environment take together (``ARG_MAX``)."""
    try:
        limit = os.sysconf("SC_ARG_MAX")
    except (ValueError, OSError, AttributeError):  # no sysconf (Windows) or no such name
        limit = -1
    return min(limit, _KERNEL_ARG_MAX) if limit > 0 else DEFAULT_ARG_MAX



def exec_bytes(value: str, what: str | Callable[[], str]) -> int:
    """The size ``value`` takes in a new program's memory (its bytes and a NUL); refuses what no process can receive.

    ``what`` names the field in the error, e.g. ``"role 'r': args[2]"``; a callable builds that name only when
    there is an error (a caller's whole environment is checked per dry run: most entries need none).
    """
    def name() -> str:
        return what if isinstance(what, str) else what()

    if "\x00" in value:
        raise InvalidAppError(f"{name()} contains a NUL byte, which no process can receive: {brief(value)}")
    try:
        size = len(os.fsencode(value))
    except UnicodeEncodeError as e:
        raise InvalidAppError(
            f"{name()} holds {value[e.start]!r} at index {e.start}, which is no byte sequence (a lone surrogate), "
            "so no process can receive it"
        ) from None
    if size > MAX_ARG_BYTES:
        raise InvalidAppError(
            f"{name()} is {size} bytes long; a program's argument or environment entry may hold at most "
            f"{MAX_ARG_BYTES} bytes (Linux MAX_ARG_STRLEN): pass large data in a file"
        )
    return size + 1


def _env_entry(where: str, key: str) -> str:
    """How an error names the environment entry ``key``."""
    return f"{where}: env[{brief(key)}]"


def _inherited_bytes(where: str, overrides: Mapping[str, str]) -> tuple[int, int]:
    """Bytes and count of the caller's environment entries a new program inherits, those in ``overrides`` left out.

    Read from ``os.environb``: the entries are bytes already and hold no NUL (``os.putenv`` refuses one), so
    only each entry's length is checked, not its encoding (merging and encoding each ``os.environ`` entry
    again cost a dry run several times as much: docs/perf.md). Without a bytes environment (not POSIX), the
    strings are checked one by one.
    """
    if not os.supports_bytes_environ:
        inherited = {k: v for k, v in os.environ.items() if k not in overrides}
        return sum(exec_bytes(f"{k}={v}", partial(_env_entry, where, k)) for k, v in inherited.items()), len(inherited)
    skip: set[bytes] = set()
    for key in overrides:
        with contextlib.suppress(UnicodeEncodeError):  # no entry of a bytes environment can have such a name
            skip.add(os.fsencode(key))
    # os.environb's own dict of bytes where CPython has one (its mapping methods decode and check each key in
    # Python: 20 µs for 35 entries, against 3 here), else the mapping itself
    data = getattr(os.environb, "_data", None)
    items = data.items() if isinstance(data, dict) else os.environb.items()
    total = count = 0
    for k, v in items:
        if k in skip:
            continue
        size = len(k) + len(v) + 2  # "K=V" and its NUL
        if size > MAX_ARG_BYTES + 1:  # let exec_bytes word the refusal
            key = os.fsdecode(k)
            exec_bytes(f"{key}={os.fsdecode(v)}", partial(_env_entry, where, key))
        total += size
        count += 1
    return total, count


def check_exec_size(where: str, argv: Iterable[str], env: Mapping[str, str], *, inherit: bool = False) -> int:
    """Check that ``argv`` and ``env`` fit one ``exec`` on this system; returns the bytes they take.

    Schedulers call it with exactly what they will execute; each string is checked as :func:`exec_bytes`
    does, and the total, pointers included, against :func:`exec_limit`. ``inherit=True``: the program also
    gets the caller's environment (``os.environ``), ``env`` set over it, which is what ``{**os.environ,
    **env}`` would give, counted from the bytes the process already holds (:func:`_inherited_bytes`).
    """
    total = 0
    count = 0
    for i, a in enumerate(argv):
        total += exec_bytes(a, f"{where}: argument {i}")
        count += 1
    for k, v in env.items():
        total += exec_bytes(f"{k}={v}", partial(_env_entry, where, k))  # named only on an error
        count += 1
    if inherit:
        size, n = _inherited_bytes(where, env)
        total += size
        count += n
    total += (count + 2) * 8  # the argv and envp pointer arrays, each ending in NULL
    limit = exec_limit()
    if total > limit:
        raise InvalidAppError(
            f"{where}: the command line and environment take {total} bytes, more than this system's limit "
            f"of {limit} bytes for one program (ARG_MAX): pass large data in a file"
        )
    return total


def _check_str_list(values: object, where: str) -> int:
    if not isinstance(values, list) or not all(isinstance(a, str) for a in values):
        raise InvalidAppError(f"{where} must be a list of strings, got {values!r}")
    return sum(exec_bytes(a, f"{where}[{i}]") for i, a in enumerate(values))


def _check_resource(res: object, where: str) -> None:
    if not isinstance(res, Resource):
        raise InvalidAppError(f"{where} must be a tsm.Resource, got {type(res).__name__}")
    if is_null_resource(res):  # "not given": schedulers that need a size refuse it (check_resources)
        return
    for field_name in ("cpu", "gpu", "memMB"):
        v = getattr(res, field_name)
        not_finite = isinstance(v, float) and not math.isfinite(v)  # NaN compares as not < 0
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not_finite or v < 0:
            raise InvalidAppError(f"{where}.{field_name} must be a number >= 0, got {v!r}")
    if not isinstance(res.gpu, int):  # devices are handed out whole (schedulers slice device lists by it)
        raise InvalidAppError(f"{where}.gpu must be a whole number of GPUs (an int), got {res.gpu!r}")
    if not isinstance(res.devices, dict):
        raise InvalidAppError(f"{where}.devices must be a dict of device name to count, got {res.devices!r}")
    for dev, n in res.devices.items():
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise InvalidAppError(f"{where}.devices[{dev!r}] must be an integer >= 0, got {n!r}")


def _role_env_name(where: str, pattern: str, key: str) -> str:
    """How an error names a part of a role's env entry ``key`` (``pattern`` holds ``{}`` for the key)."""
    return f"{where}: {pattern.format(brief(key))}"


def validate_role(role: Role) -> None:
    """Check one role; raises :class:`InvalidAppError` naming the role and the field."""
    check_name(role.name, "role name")
    where = f"role '{role.name}'"
    if not isinstance(role.entrypoint, str) or not role.entrypoint.strip() or role.entrypoint == MISSING:
        raise InvalidAppError(f"{where}: entrypoint is empty; set the command to run")
    size = exec_bytes(role.entrypoint, f"{where}: entrypoint")
    if not isinstance(role.image, str) or "\x00" in role.image:
        raise InvalidAppError(f"{where}: image must be a string without NUL bytes, got {role.image!r}")
    size += _check_str_list(role.args, f"{where}: args")
    if not isinstance(role.env, dict):
        raise InvalidAppError(f"{where}: env must be a dict of str to str")
    for k, v in role.env.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise InvalidAppError(f"{where}: env entry {k!r}={v!r} must map str to str")
        if not k or "=" in k or "\x00" in k:
            raise InvalidAppError(
                f"{where}: env name {brief(k)} is not allowed: it must be non-empty, without '=' or NUL"
            )
        # each part named in its own error, the names built only for one; the limit holds for "K=V" too
        key_size = exec_bytes(k, partial(_role_env_name, where, "env name {}", k))
        value_size = exec_bytes(v, partial(_env_entry, where, k))
        if key_size + value_size - 1 > MAX_ARG_BYTES:
            exec_bytes(f"{k}={v}", partial(_role_env_name, where, "env entry {}=...", k))  # raises
        size += key_size + value_size  # "K=V" and its NUL
    if size > exec_limit():
        raise InvalidAppError(
            f"{where}: entrypoint, args and env take {size} bytes, more than this system's limit of "
            f"{exec_limit()} bytes for one program (ARG_MAX): pass large data in a file"
        )
    if isinstance(role.num_replicas, bool) or not isinstance(role.num_replicas, int) or role.num_replicas <= 0:
        raise InvalidAppError(f"{where}: num_replicas must be an integer > 0, got {role.num_replicas!r}")
    if role.num_replicas > MAX_REPLICAS:
        raise InvalidAppError(f"{where}: num_replicas {role.num_replicas} is more than tsm's limit of {MAX_REPLICAS}")
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
    if not isinstance(role.mounts, list):
        raise InvalidAppError(f"{where}: mounts must be a list of BindMount, VolumeMount or DeviceMount")
    for i, mount in enumerate(role.mounts):
        validate_mount(mount, f"{where}: mounts[{i}]")


def check_resources(app: AppDef, scheduler: str) -> None:
    """Refuse a role whose resource is :data:`~tsm.specs.NULL_RESOURCE` (not given) on ``scheduler``.

    Called at dry run for schedulers that place replicas by size; the local scheduler does not need it.
    """
    for role in app.roles:
        if isinstance(role.resource, Resource) and is_null_resource(role.resource):
            raise InvalidAppError(
                f"role '{role.name}': no resource given, and the {scheduler} scheduler needs one: set "
                "resource=tsm.Resource(cpu=..., gpu=..., memMB=...) or a named one (tsm.specs.resource(h='gpu.small'))"
            )


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
