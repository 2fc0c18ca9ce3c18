"""The plain data of an app: what to run (AppDef, Role, Resource), and what became of it (AppStatus).

Nothing here does I/O or knows a scheduler. Records are mutable dataclasses so the seed builder API
(``Role("x").runs(...).replicas(2)``) can fill them in, but nothing in tsm mutates an app after dry run.
"""

from __future__ import annotations

import copy
import enum
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from tsm.errors import InvalidAppError

#: Image value meaning "no image": replicas run in the caller's working directory.
NULL_IMAGE = ""


@dataclass
class Resource:
    """What one replica needs: CPUs, GPUs, memory in MB, plus scheduler-specific capabilities and devices.

    ``capabilities`` are free-form hints a scheduler may map (e.g. a Slurm constraint); ``devices``
    maps a device name (``"vpc.amazonaws.com/efa"``) to a count.
    """

    cpu: int = 1
    gpu: int = 0
    memMB: int = 1024  # noqa: N815 (established field name)
    capabilities: dict[str, Any] = field(default_factory=dict)
    devices: dict[str, int] = field(default_factory=dict)

    @staticmethod
    def copy(original: Resource, **capabilities: Any) -> Resource:
        """Return a deep copy of ``original`` with ``capabilities`` added to (or replacing) its own."""
        res = copy.deepcopy(original)
        res.capabilities.update(capabilities)
        return res


class RetryPolicy(str, enum.Enum):
    """What restarts when a replica fails and its role still has retries left.

    REPLICA restarts only that replica (same replica id); ROLE restarts every replica of its role;
    APPLICATION restarts every replica of every role.
    """

    REPLICA = "REPLICA"
    ROLE = "ROLE"
    APPLICATION = "APPLICATION"


@dataclass
class Role:
    """A set of identical replicas: one command run ``num_replicas`` times with the same resources.

    ``image`` is what the scheduler runs in: a directory for the local scheduler, a container image
    for container schedulers. ``port_map`` names ports the replica listens on; ``mounts`` are
    scheduler-specific mount specs. ``min_replicas`` (elastic roles) lets a scheduler start the role
    with fewer replicas. The builder methods ``runs``/``on``/``replicas`` keep the seed TSM style working.
    """

    name: str
    image: str = NULL_IMAGE
    entrypoint: str = ""
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    num_replicas: int = 1
    min_replicas: int | None = None
    max_retries: int = 0
    retry_policy: RetryPolicy = RetryPolicy.APPLICATION
    resource: Resource = field(default_factory=Resource)
    port_map: dict[str, int] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    mounts: list[Any] = field(default_factory=list)

    # -- seed TSM builder style -------------------------------------------------------------
    def runs(self, entrypoint: str, *args: str, **env: str) -> Role:
        """Set the command (``entrypoint`` and ``args``) and add ``env``; returns the role for chaining."""
        self.entrypoint = entrypoint
        self.args = [str(a) for a in args]
        self.env.update({k: str(v) for k, v in env.items()})
        return self

    def on(self, container: Any) -> Role:
        """Take image, resources and ports from a :class:`tsm.seed.Container`."""
        self.image = container.image
        self.resource = copy.deepcopy(container.resources)
        self.port_map.update(container.port_map)
        return self

    def replicas(self, num_replicas: int) -> Role:
        """Set the number of replicas; returns the role for chaining."""
        self.num_replicas = num_replicas
        return self


@dataclass
class AppDef:
    """A named application: one or more roles launched together and watched as one."""

    name: str
    roles: list[Role] = field(default_factory=list)
    metadata: dict[str, str] = field(default_factory=dict)

    def of(self, *roles: Role) -> AppDef:
        """Add roles (seed TSM style); returns the app for chaining."""
        self.roles.extend(roles)
        return self

    def to_dict(self) -> dict[str, Any]:
        """Return the app as JSON-ready plain data (enums as their names)."""
        return json.loads(json.dumps(asdict(self), default=_enum_value))  # type: ignore[no-any-return]

    @staticmethod
    def from_dict(data: dict[str, Any]) -> AppDef:
        """Rebuild an app from :meth:`to_dict` output (as kept in the state store)."""
        roles = []
        for r in data.get("roles", []):
            r = dict(r)
            r["resource"] = Resource(**r.get("resource", {}))
            r["retry_policy"] = RetryPolicy(r.get("retry_policy", "APPLICATION"))
            roles.append(Role(**r))
        return AppDef(name=data["name"], roles=roles, metadata=dict(data.get("metadata", {})))


def _enum_value(o: Any) -> Any:
    if isinstance(o, enum.Enum):
        return o.value
    raise TypeError(f"not JSON serialisable: {o!r}")


class AppState(enum.IntEnum):
    """Lifecycle of an app or a replica. SUCCEEDED, FAILED and CANCELLED are terminal."""

    UNSUBMITTED = 0
    SUBMITTED = 1
    PENDING = 2
    RUNNING = 3
    SUCCEEDED = 4
    FAILED = 5
    CANCELLED = 6
    UNKNOWN = 7

    @property
    def is_terminal(self) -> bool:
        """True once the app can no longer change: SUCCEEDED, FAILED or CANCELLED."""
        return self in _TERMINAL

    def __str__(self) -> str:
        return self.name

    def __format__(self, spec: str) -> str:
        # IntEnum formats as its number when given a spec (f"{state:<10}"); always use the name.
        return format(self.name, spec)


_TERMINAL = frozenset({AppState.SUCCEEDED, AppState.FAILED, AppState.CANCELLED})


def is_terminal(state: AppState) -> bool:
    """Function form of :attr:`AppState.is_terminal`."""
    return state in _TERMINAL


@dataclass
class ReplicaStatus:
    """One replica: where it runs, its state, and why it failed if it did."""

    id: int
    role: str
    state: AppState
    hostname: str = ""
    exit_code: int | None = None
    error_msg: str = ""
    restarts: int = 0
    pid: int | None = None


@dataclass
class RoleStatus:
    """The replicas of one role."""

    role: str
    replicas: list[ReplicaStatus] = field(default_factory=list)


@dataclass
class AppStatus:
    """What became of an app: its state, restarts, a message, and per-role and per-replica detail."""

    state: AppState
    num_restarts: int = 0
    msg: str = ""
    structured_error_msg: str = ""
    ui_url: str | None = None
    roles: list[RoleStatus] = field(default_factory=list)

    @property
    def is_terminal(self) -> bool:
        """True once the app can no longer change."""
        return self.state.is_terminal

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (states as names), as printed by ``tsm status --json``."""
        # AppState is an IntEnum, which json.dumps writes as its number without asking ``default``;
        # turn enums into their names while asdict builds each (nested) dataclass's dict.
        data = asdict(self, dict_factory=lambda kv: {k: v.name if isinstance(v, enum.Enum) else v for k, v in kv})
        return json.loads(json.dumps(data))  # type: ignore[no-any-return]

    def format(self) -> str:
        """A readable multi-line summary: app state, then one line per replica."""
        lines = [f"State: {self.state.name}", f"Num Restarts: {self.num_restarts}"]
        if self.msg:
            lines.append(f"Msg: {self.msg}")
        if self.ui_url:
            lines.append(f"UI: {self.ui_url}")
        if self.roles:
            lines.append("Roles:")
        for rs in self.roles:
            for r in rs.replicas:
                detail = [r.state.name]
                if r.hostname:
                    detail.append(f"host={r.hostname}")
                if r.exit_code is not None:
                    detail.append(f"exit={r.exit_code}")
                if r.restarts:
                    detail.append(f"restarts={r.restarts}")
                line = f"  {rs.role}/{r.id}: " + " ".join(detail)
                if r.error_msg:
                    line += f"  ({r.error_msg})"
                lines.append(line)
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.format()


@dataclass
class AppDryRunInfo:
    """A scheduler's request as a value: print it, test it, then submit it unchanged.

    ``request`` is the scheduler-specific payload (a command list, an sbatch script, a manifest);
    ``fmt`` renders it for people.
    """

    request: Any
    fmt: Callable[[Any], str] = repr
    app: AppDef | None = None
    cfg: dict[str, Any] = field(default_factory=dict)
    scheduler: str = ""

    def __str__(self) -> str:
        return self.fmt(self.request)


# -- macros ---------------------------------------------------------------------------------------
class macros:  # noqa: N801 (a namespace, spelled as users write it)
    """Placeholders substituted per replica in entrypoint, args, env and metadata.

    ``${img_root}`` the image's root directory, ``${app_id}`` the app id, ``${replica_id}`` the
    replica's index within its role, ``${rank0_env}`` the *name* of the env var that holds the
    hostname of the role's first replica (use it in a shell as ``$${rank0_env}``).
    """

    img_root = "${img_root}"
    app_id = "${app_id}"
    replica_id = "${replica_id}"
    rank0_env = "${rank0_env}"

    @dataclass
    class Values:
        """Concrete values for the macros of one replica."""

        img_root: str
        app_id: str
        replica_id: str
        rank0_env: str = "TSM_RANK0_HOST"

        def substitute(self, arg: str) -> str:
            """Replace the four macros in ``arg``; any other ``$`` text is left exactly as it was."""
            if "${" not in arg:
                return arg
            values = asdict(self)
            return _MACRO_RE.sub(lambda m: str(values[m.group(1)]), arg)

        def apply(self, role: Role) -> Role:
            """Return a copy of ``role`` with macros substituted in entrypoint, args, env and metadata."""
            role = copy.deepcopy(role)
            role.entrypoint = self.substitute(role.entrypoint)
            role.args = [self.substitute(a) for a in role.args]
            role.env = {k: self.substitute(v) for k, v in role.env.items()}
            role.metadata = _substitute_tree(role.metadata, self.substitute)
            return role


# Only our four names are placeholders and nothing else is touched: "$${rank0_env}" becomes
# "$TSM_RANK0_HOST" for a shell to expand, and any other "$..." reaches the replica as written.
_MACRO_RE = re.compile(r"\$\{(img_root|app_id|replica_id|rank0_env)\}")


def _substitute_tree(obj: Any, fn: Callable[[str], str]) -> Any:
    if isinstance(obj, str):
        return fn(obj)
    if isinstance(obj, dict):
        return {k: _substitute_tree(v, fn) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_substitute_tree(v, fn) for v in obj]
    return obj


def iter_replicas(app: AppDef) -> Iterator[tuple[Role, int]]:
    """Yield ``(role, replica_index)`` for every replica of the app, in role order."""
    for role in app.roles:
        for i in range(role.num_replicas):
            yield role, i


def check_positive(value: int, what: str) -> None:
    """Raise :class:`InvalidAppError` unless ``value`` > 0 (used by components for counts)."""
    if value <= 0:
        raise InvalidAppError(f"{what} must be > 0, got {value}")
