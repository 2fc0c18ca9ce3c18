"""The plain data of an app: what to run (AppDef, Role, Resource), and what became of it (AppStatus).

Nothing here does I/O or knows a scheduler. Records are mutable dataclasses so the seed builder API
(``Role("x").runs(...).replicas(2)``) can fill them in, but nothing in tsm mutates an app after dry run.
"""

from __future__ import annotations

import contextlib
import copy
import enum
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from typing import Any, Generic, TypeVar

from tsm.errors import AppStatusError, InvalidAppError
from tsm.specs.environment import Environment
from tsm.specs.mounts import Mount, mount_from_dict

#: Image value meaning "no image": replicas run in the caller's working directory.
NULL_IMAGE = ""

#: The image tsm's builtin components run in by default (TorchX's top-level ``torchx.IMAGE``): tsm's builtins
#: run in the caller's directory unless given an image, so this is :data:`NULL_IMAGE`; container
#: schedulers ask for an image where one is needed.
IMAGE = NULL_IMAGE

#: Sentinel for a string attribute that was never set (TorchX's ``MISSING``): a role's default entrypoint.
MISSING = "<MISSING>"

#: Sentinel for an optional string attribute that is unset (TorchX's ``NONE``).
NONE = "<NONE>"

#: The scheduler name that means "every scheduler" (TorchX's ``ALL``).
ALL = "all"

#: An app handle, ``scheduler://session/app_id`` (a plain string; see :mod:`tsm.specs.handles`).
AppHandle = str

#: A scheduler's name.
SchedulerBackend = str


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
    #: free-form notes about the resource that no scheduler reads (e.g. that it is an alias of another)
    tags: dict[str, object] = field(default_factory=dict)

    @staticmethod
    def copy(original: Resource, **capabilities: Any) -> Resource:
        """Return a deep copy of ``original`` with ``capabilities`` added to (or replacing) its own."""
        res = copy.deepcopy(original)
        res.capabilities.update(capabilities)
        return res


#: The resource of a role that did not say what it needs (TorchX's sentinel: every field -1). Schedulers
#: that place replicas by size (Slurm, Kubernetes) refuse it at dry run; the local scheduler ignores it.
NULL_RESOURCE = Resource(cpu=-1, gpu=-1, memMB=-1)


def _null_resource() -> Resource:
    return copy.deepcopy(NULL_RESOURCE)


def is_null_resource(resource: Resource) -> bool:
    """True when ``resource`` is :data:`NULL_RESOURCE` (no size given)."""
    return (resource.cpu, resource.gpu, resource.memMB) == (-1, -1, -1)


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
    for container schedulers. ``port_map`` names ports the replica listens on; ``mounts`` are typed
    :class:`~tsm.specs.BindMount` / ``VolumeMount`` / ``DeviceMount`` records each backend maps (or
    refuses at dry run). ``min_replicas`` (elastic roles) lets a scheduler start the role with fewer
    replicas. As in TorchX, ``entrypoint`` defaults to :data:`MISSING` and ``resource`` to
    :data:`NULL_RESOURCE`: a role that does not say what it needs is refused by schedulers that place
    replicas by size, never silently given one CPU. The builder methods ``runs``/``on``/``replicas`` keep
    the seed TSM style working.
    """

    name: str
    image: str = NULL_IMAGE
    entrypoint: str = MISSING
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    num_replicas: int = 1
    min_replicas: int | None = None
    max_retries: int = 0
    retry_policy: RetryPolicy = RetryPolicy.APPLICATION
    resource: Resource = field(default_factory=_null_resource)
    port_map: dict[str, int] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    mounts: list[Mount] = field(default_factory=list)
    #: this role's own workspace (a :class:`tsm.workspace.mixin.Workspace` or a path), shipped at dry run
    workspace: Any = None
    #: attribute name -> zero-argument callable (or awaitable) giving its value, applied at dry run
    overrides: dict[str, Any] = field(default_factory=dict)
    #: the lockfile environment its replicas run in (:mod:`tsm.env`); None: the rule of tsm.schedulers.common.interpreter
    environment: Environment | None = None
    #: names of the secrets its replicas get as environment variables (:mod:`tsm.specs.secrets`: ``NAME`` or
    #: ``NAME:file:PATH``, ...); their values are read at submit and never stored or shown
    secrets: list[str] = field(default_factory=list)

    def pre_proc(self, scheduler: str, dryrun_info: AppDryRunInfo[Any]) -> AppDryRunInfo[Any]:
        """TorchX's per-role hook on a scheduler's request; returns it unchanged (kept for ported subclasses)."""
        return dryrun_info

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
        return json.loads(json.dumps(self, default=json_default))  # type: ignore[no-any-return]

    @staticmethod
    def from_dict(data: dict[str, Any]) -> AppDef:
        """Rebuild an app from :meth:`to_dict` output (as kept in the state store)."""
        roles = []
        for r in data.get("roles", []):
            r = dict(r)
            r["resource"] = Resource(**r.get("resource", {}))
            r["retry_policy"] = RetryPolicy(r.get("retry_policy", "APPLICATION"))
            r["mounts"] = [mount_from_dict(m) for m in r.get("mounts", [])]
            r["environment"] = Environment.from_dict(r.get("environment"))
            roles.append(Role(**r))
        return AppDef(name=data["name"], roles=roles, metadata=dict(data.get("metadata", {})))


def _enum_value(o: Any) -> Any:
    if isinstance(o, enum.Enum):
        return o.value
    raise TypeError(f"not JSON serialisable: {o!r}")


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def json_default(o: Any) -> Any:
    """``json.dumps``'s ``default`` for specs data: a dataclass as the dict of its fields, an enum as its value.

    The same JSON as ``json.dumps(asdict(o))`` without ``asdict``'s deep copy of every value (a request
    carries the whole environment): the encoder reads the objects as they are, once, on each submission.
    """
    cls = type(o)
    names = _FIELD_NAMES.get(cls)
    if names is None:
        if not is_dataclass(cls):
            return _enum_value(o)
        names = _FIELD_NAMES[cls] = tuple(f.name for f in fields(cls))
    return {n: getattr(o, n) for n in names}


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

    def __repr__(self) -> str:
        return f"{self.name} ({self.value})"  # TorchX's form

    def __format__(self, spec: str) -> str:
        # IntEnum formats as its number when given a spec (f"{state:<10}"); always use the name.
        return format(self.name, spec)


_TERMINAL = _TERMINAL_STATES = frozenset({AppState.SUCCEEDED, AppState.FAILED, AppState.CANCELLED})  # TorchX: _TERMINAL_STATES


def is_terminal(state: AppState) -> bool:
    """Function form of :attr:`AppState.is_terminal`."""
    return state in _TERMINAL


_STARTED = _TERMINAL | {AppState.RUNNING}


def is_started(state: AppState) -> bool:
    """True once the app has run: RUNNING or a terminal state (TorchX's ``specs.api.is_started``)."""
    return state in _STARTED


#: Replicas and apps share their states (TorchX's name).
ReplicaState = AppState


@dataclass
class ReplicaStatus:
    """One replica: where it runs, its state, and why it failed if it did.

    The first four fields are TorchX's, in its order; ``structured_error_msg`` is a JSON error report
    when the backend has one (:data:`NONE` otherwise). ``preempted``: the last attempt was ended by the
    cluster's decision (preemption, a lost node, a time limit with ``requeue_on_time_limit``), not by the
    program; ``error_msg`` says which.
    """

    id: int
    state: AppState
    role: str
    hostname: str = ""
    structured_error_msg: str = NONE
    exit_code: int | None = None
    error_msg: str = ""
    restarts: int = 0
    pid: int | None = None
    preempted: bool = False


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

    def is_terminal(self) -> bool:
        """True once the app can no longer change (a method, as in TorchX)."""
        return self.state.is_terminal

    def raise_for_status(self) -> None:
        """Raise :class:`~tsm.errors.AppStatusError` (carrying this status) unless the app SUCCEEDED."""
        if self.state != AppState.SUCCEEDED:
            raise AppStatusError(self, f"job did not succeed: {self.state.name}{': ' + self.msg if self.msg else ''}")

    def __repr__(self) -> str:
        """TorchX's readable dump: a YAML document ``AppStatus: {...}`` with keys sorted, states as ``NAME (n)``."""
        data = asdict(self)
        data["state"] = f"{self.state.name} ({int(self.state)})"
        err = self.structured_error_msg
        if err and err != NONE:
            with contextlib.suppress(ValueError):  # not JSON: shown as the text it is
                data["structured_error_msg"] = json.loads(err)
        else:
            data["structured_error_msg"] = NONE
        for role in data["roles"]:
            for rep in role["replicas"]:
                rep["state"] = f"{AppState(rep['state']).name} ({int(rep['state'])})"
        from tsm.specs.yaml_dump import to_yaml

        return to_yaml({"AppStatus": data})

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (states as names), as printed by ``tsm status --json``."""
        # AppState is an IntEnum, which json.dumps writes as its number without asking ``default``;
        # turn enums into their names while asdict builds each (nested) dataclass's dict.
        data = asdict(self, dict_factory=lambda kv: {k: v.name if isinstance(v, enum.Enum) else v for k, v in kv})
        return json.loads(json.dumps(data))  # type: ignore[no-any-return]

    def format(self, filter_roles: list[str] | None = None) -> str:
        """TorchX's layout (``AppStatus:`` then indented State, Num Restarts, Roles, Msg, Structured Error Msg, UI URL).

        Each replica is a line ``*role[0]:STATE`` (``*`` marks a role's first replica); a failed or cancelled
        replica without an error report reads ``FAILED (no reply file)``. Tools that parse TorchX's output
        read this; tsm's own commands print :meth:`summary`.
        """
        roles = [rs for rs in self.roles if not filter_roles or rs.role in filter_roles]
        replicas = "".join(_torchx_replica_line(r) for rs in roles for r in sorted(rs.replicas, key=lambda r: r.id))
        return (
            f"AppStatus:\n    State: {self.state.name}\n    Num Restarts: {self.num_restarts}\n"
            f"    Roles: {replicas}\n    Msg: {self.msg}\n"
            f"    Structured Error Msg: {self.structured_error_msg or NONE}\n    UI URL: {self.ui_url}\n    "
        )

    def summary(self, filter_roles: list[str] | None = None) -> str:
        """A readable multi-line summary: app state, then one line per replica (of ``filter_roles`` only, if given).

        Messages are what replicas and engines chose (a timer's scope, a pod's termination message): printed
        with their control characters as escapes (:func:`tsm.util.text.printable`).
        """
        from tsm.util.text import printable

        lines = [f"State: {self.state.name}", f"Num Restarts: {self.num_restarts}"]
        if self.msg:
            lines.append(f"Msg: {printable(self.msg)}")
        if self.ui_url:
            lines.append(f"UI: {self.ui_url}")
        roles = [rs for rs in self.roles if filter_roles is None or rs.role in filter_roles]
        if roles:
            lines.append("Roles:")
        for rs in roles:
            for r in rs.replicas:
                detail = [r.state.name]
                if r.hostname:
                    detail.append(f"host={printable(r.hostname)}")
                if r.exit_code is not None:
                    detail.append(f"exit={r.exit_code}")
                if r.restarts:
                    detail.append(f"restarts={r.restarts}")
                line = f"  {rs.role}/{r.id}: " + " ".join(detail)
                if r.error_msg:
                    line += f"  ({printable(r.error_msg)})"
                lines.append(line)
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()


def _torchx_replica_line(r: ReplicaStatus) -> str:
    """One replica in TorchX's ``AppStatus.format()``: its state, and its error report when it has one."""
    data = r.state.name
    report: Any = None
    if r.structured_error_msg and r.structured_error_msg != NONE:
        with contextlib.suppress(ValueError):
            report = json.loads(r.structured_error_msg)
    if isinstance(report, dict) and isinstance(report.get("message"), dict):
        import datetime

        msg = report["message"]
        ts = (msg.get("extraInfo") or {}).get("timestamp")
        when = datetime.datetime.fromtimestamp(int(str(ts))) if str(ts or "").isdigit() else "<N/A>"
        data = (
            f"{r.state.name} (exitcode: {msg.get('errorCode') or '<N/A>'})\n        timestamp: {when}\n"
            f"        hostname: {r.hostname}\n        error_msg: {msg.get('message', '')}"
        )
    elif r.structured_error_msg and r.structured_error_msg != NONE:
        data = r.structured_error_msg
    elif r.state in (AppState.FAILED, AppState.CANCELLED):
        data += " (no reply file)"
    return f"\n {'*' if r.id == 0 else ' '}{r.role}[{r.id}]:{data}"


TYPE_CHECKING = False
if TYPE_CHECKING:  # a default (PEP 696) lets a plain ``AppDryRunInfo`` mean "any request" to type checkers
    from typing_extensions import TypeVar as _TypeVarWithDefault

    #: The type of a scheduler's request (a command list, an sbatch script, a manifest).
    RequestT = _TypeVarWithDefault("RequestT", default=Any)
else:
    RequestT = TypeVar("RequestT")


@dataclass(repr=False)
class AppDryRunInfo(Generic[RequestT]):
    """A scheduler's request as a value: print it, test it, then submit it unchanged.

    Generic over the request type (``AppDryRunInfo[SlurmBatchRequest]``): ``request`` is the
    scheduler-specific payload (a command list, an sbatch script, a manifest); ``fmt`` renders it for
    people, and both ``str()`` and ``repr()`` show that rendering, as in TorchX. TorchX's private
    ``_app``, ``_cfg`` and ``_scheduler`` are the same as ``app``, ``cfg`` and ``scheduler``.
    """

    request: RequestT
    fmt: Callable[[RequestT], str] = repr
    app: AppDef | None = None
    cfg: dict[str, Any] = field(default_factory=dict)
    scheduler: str = ""
    #: the apps it waits for that tsm's helper watches (``HANDLE:ok|any|fail``, :mod:`tsm.runner.after`);
    #: empty when it waits for none, or its scheduler waits itself (then the request says so)
    after: list[str] = field(default_factory=list)
    #: told of each state change of the app (``-c on_state``, :mod:`tsm.runner.hooks`); kept out of ``cfg``
    on_state: str = ""

    def __str__(self) -> str:
        return self.fmt(self.request)

    def __repr__(self) -> str:
        return self.fmt(self.request)

    @property
    def _app(self) -> AppDef | None:
        return self.app

    @_app.setter
    def _app(self, value: AppDef | None) -> None:
        self.app = value

    @property
    def _cfg(self) -> dict[str, Any]:
        return self.cfg

    @_cfg.setter
    def _cfg(self, value: dict[str, Any]) -> None:
        self.cfg = dict(value)

    @property
    def _scheduler(self) -> str:
        return self.scheduler

    @_scheduler.setter
    def _scheduler(self, value: str) -> None:
        self.scheduler = value


# -- macros ---------------------------------------------------------------------------------------
class macros:  # noqa: N801 (a namespace, spelled as users write it)
    """Placeholders substituted per replica in entrypoint, args, env and metadata.

    ``${img_root}`` the image's root directory, ``${app_id}`` the app id, ``${replica_id}`` the
    replica's index within its role, ``${rank0_env}`` the *name* of the env var that holds the
    hostname of the role's first replica (use it in a shell as ``$${rank0_env}``).
    ``${base_img_root}`` is TorchX's deprecated macro; it is replaced by ``DEPRECATED`` as there.
    """

    img_root = "${img_root}"
    base_img_root = "${base_img_root}"
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
        base_img_root: str = "DEPRECATED"

        def substitute(self, arg: str) -> str:
            """Replace the macros in ``arg``; any other ``$`` text is left exactly as it was."""
            if "${" not in arg:
                return arg
            values = vars(self)  # the fields, read as they are (asdict would copy them for each string)
            return _MACRO_RE.sub(lambda m: str(values[m.group(1)]), arg)

        def command(self, role: Role) -> tuple[str, list[str], dict[str, str]]:
            """``role``'s entrypoint, args and env with the macros substituted, the role left as it was.

            What :meth:`apply` gives for those three, without the deep copy of the whole role: a
            scheduler that builds its replicas' commands from them needs no more (the local one's dry run).
            """
            return (self.substitute(role.entrypoint), [self.substitute(a) for a in role.args],
                    {k: self.substitute(v) for k, v in role.env.items()})

        def apply(self, role: Role) -> Role:
            """Return a copy of ``role`` with macros substituted in entrypoint, args, env and metadata."""
            role = copy.deepcopy(role)
            role.entrypoint, role.args, role.env = self.command(role)
            role.metadata = _substitute_tree(role.metadata, self.substitute)
            return role


# Only the macro names are placeholders and nothing else is touched: "$${rank0_env}" becomes
# "$TSM_RANK0_HOST" for a shell to expand, and any other "$..." reaches the replica as written.
_MACRO_RE = re.compile(r"\$\{(img_root|base_img_root|app_id|replica_id|rank0_env)\}")


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


# -- TorchX's names at TorchX's module path ``torchx.specs.api`` ---------------------------------------
# Imported on first use (PEP 562) so this module keeps importing nothing but errors and mounts:
# ``from tsm.specs.api import UnknownAppException, runopts, CfgVal, BindMount, parse_app_handle, to_dict``.
_TORCHX_NAMES: dict[str, tuple[str, str]] = {
    "AppStatusError": ("tsm.errors", "AppStatusError"),
    "ComponentValidationException": ("tsm.errors", "ComponentError"),
    "ComponentNotFoundException": ("tsm.errors", "ComponentNotFoundError"),
    "InvalidRunConfigException": ("tsm.errors", "InvalidRunOptionError"),
    "MalformedAppHandleException": ("tsm.errors", "MalformedAppHandleError"),
    "UnknownAppException": ("tsm.errors", "UnknownAppError"),
    "UnknownSchedulerException": ("tsm.errors", "UnknownSchedulerError"),
    "CfgVal": ("tsm.specs.runopts", "CfgVal"),
    "runopt": ("tsm.specs.runopts", "runopt"),
    "runopts": ("tsm.specs.runopts", "runopts"),
    "get_type_name": ("tsm.specs.runopts", "get_type_name"),
    "ParsedAppHandle": ("tsm.specs.handles", "ParsedAppHandle"),
    "parse_app_handle": ("tsm.specs.handles", "parse_app_handle"),
    "make_app_handle": ("tsm.specs.handles", "make_app_handle"),
    "to_dict": ("tsm.util.types", "to_dict"),
    "to_list": ("tsm.util.types", "to_list"),
}
# the mount records are imported above already: TorchX's ``specs.api`` defines them there
_MOUNT_NAMES = ("BindMount", "DeviceMount", "Mount", "MountType", "VolumeMount")


def __getattr__(name: str) -> Any:
    if name in _MOUNT_NAMES:
        from tsm.specs import mounts

        return getattr(mounts, name)
    target = _TORCHX_NAMES.get(name)
    if target is None:
        raise AttributeError(f"module 'tsm.specs.api' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(target[0]), target[1])
    globals()[name] = value
    return value
