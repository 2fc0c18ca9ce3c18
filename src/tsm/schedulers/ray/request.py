"""Pure: an AppDef and :class:`RayOptions` -> :class:`RayRequest`, the exact Ray job to submit.

No Ray call happens here (a dry run needs no cluster). A request is two things:

* the **job submission** (``JobSubmissionClient.submit_job`` arguments): ``submission_id`` = the app id,
  the driver as entrypoint, a ``runtime_env`` and ``metadata`` naming the app;
* the **driver payload** (:class:`DriverPayload`): one :class:`ReplicaSpec` per replica -- the exact
  command and env its actor runs, its resources -- plus the gang and retry rules. It travels to the
  cluster as a tiny Python package in ``runtime_env.py_modules`` (content-hashed by Ray), because a
  payload with long arguments cannot ride in an environment variable or a command line. The long-run
  options (time limit, warning, ``max_preemptions``, ``requeue_on_time_limit``, ``exclude_nodes``,
  ``stall_timeout``) travel in it too: the driver carries them out.

Secrets (:mod:`.secrets`): the request holds their entries (``NAME``, ``NAME:file:PATH``) and each replica
the names it gets; their values are read at ``schedule`` and never enter the request, the job or the payload.

:func:`format_request` prints both, which is what ``tsm run --dryrun -s ray`` shows.
"""

from __future__ import annotations

import json
import math
import re
import secrets
import shlex
from dataclasses import asdict, dataclass, field
from typing import Any

from tsm.env.options import EnvOptions
from tsm.errors import InvalidAppError, InvalidRunOptionError
from tsm.schedulers.common.lifecycle_opts import DEFAULT_MAX_PREEMPTIONS, LifecycleOptions, format_duration
from tsm.schedulers.common.options import option
from tsm.schedulers.ray.envs import METADATA_KEY, dryrun_line
from tsm.schedulers.ray.secrets import new_uri
from tsm.specs.api import AppDef, is_null_resource, macros

#: Every tsm actor lives in this Ray namespace, named ``<app_id>/<role>/<replica_id>``.
NAMESPACE = "tsm"
#: ``metadata`` keys of a tsm job (``list`` selects on :data:`META_SCHEDULER`).
META_SCHEDULER = "tsm.scheduler"
META_APP = "tsm.app"
META_SESSION = "tsm.session"
META_ROLES = "tsm.roles"
META_CREATED = "tsm.created"
#: seconds ``ray job stop`` leaves the driver before SIGKILL (set with a ``warn_signal``: the warning's time)
META_STOP_WAIT = "tsm.stop_wait"
#: The payload's module name on the cluster: ``tsm_ray_payload_<app id, made an identifier>``.
PAYLOAD_PREFIX = "tsm_ray_payload_"
STRATEGIES = ("SPREAD", "PACK")

#: The node label every Ray node carries (its node id): the key of the placement groups' exclusion selector.
NODE_ID_LABEL = "ray.io/node-id"
#: Shortest node-id prefix ``exclude_nodes`` takes (status messages show :data:`SHORT_ID` characters).
MIN_ID_PREFIX, SHORT_ID = 8, 12
#: What each replica of a role without a resource holds: 1 CPU, no GPU, no memory reservation (TorchX's Ray
#: scheduler gave such a role one CPU too).
DEFAULT_BUNDLE: dict[str, float] = {"CPU": 1.0}
#: The largest working directory tsm ships (Ray refuses packages above its gRPC message size, 512 MiB).
MAX_WORKING_DIR_BYTES = 500 * 1024 * 1024
#: Left out when the launching directory is shipped implicitly (besides what its ``.gitignore`` lists).
IMPLICIT_EXCLUDES = [".git", ".venv", "venv", ".tox", ".mypy_cache", ".pytest_cache", "node_modules"]


@dataclass(frozen=True)
class RayOptions(LifecycleOptions, EnvOptions):
    """Run options of the ``ray`` scheduler, with the long-run ones its driver carries out: ``time_limit``,
    ``warn_signal`` and ``warn_before`` (before the time limit, a cancel or a stall), ``max_preemptions``
    (actors lost with their node; a time limit with ``requeue_on_time_limit``), ``exclude_nodes`` (node
    ids, node IPs or hostnames: see :func:`node_matches`) and ``stall_timeout``/``on_stall``; and the
    environment options (``environment``, ``find_links``, ...: :mod:`.envs`)."""

    address: str = option(
        "the Ray dashboard (job API) address, e.g. http://127.0.0.1:8265; default $RAY_ADDRESS, else that", ""
    )
    placement_strategy: str = option("how the replicas' placement group spreads them: SPREAD or PACK", "SPREAD")
    gang_timeout: float = option("seconds to wait for every replica's resources at once before the app FAILS", 120.0)
    grace_period: float = option("seconds cancel waits after SIGTERM before SIGKILL of a replica's processes", 5.0)
    ship_cwd: bool = option(
        "without --workspace, ship the launching directory as the job's working directory (as TorchX did), so "
        "relative paths such as --script train.py run; False: replicas start in the Ray worker's directory",
        True,
    )

    def check(self) -> None:
        super().check()
        if self.placement_strategy not in STRATEGIES:
            raise InvalidRunOptionError(
                f"placement_strategy must be one of {', '.join(STRATEGIES)}, not {self.placement_strategy!r}"
            )
        if self.gang_timeout <= 0:
            raise InvalidRunOptionError(f"gang_timeout must be > 0, not {self.gang_timeout}")
        if self.grace_period < 0:
            raise InvalidRunOptionError(f"grace_period must be >= 0, not {self.grace_period}")


@dataclass
class ReplicaSpec:
    """One replica: the actor that runs it and the exact process it starts (plain, JSON-able data)."""

    role: str
    replica_id: int
    #: the actor's name in :data:`NAMESPACE`
    actor: str
    command: list[str]
    #: added to the actor's environment; ``TSM_RANK0_HOST`` is added by the driver once rank 0 is placed
    env: dict[str, str]
    #: the placement-group bundle: ``{"CPU": .., "GPU": .., "memory": bytes}``
    bundle: dict[str, float]
    #: the names of the secrets its environment gets at each start (their values: never here, see :mod:`.secrets`)
    secrets: list[str] = field(default_factory=list)


@dataclass
class RoleSpec:
    """A role's shape and retry rule, as the driver applies it."""

    name: str
    num_replicas: int
    max_retries: int
    retry_policy: str
    #: its lockfile environment with its lock files' text (:func:`.envs.shipped`); None: it names none
    environment: dict[str, Any] | None = None


@dataclass
class DriverPayload:
    """What the driver inside the Ray job runs."""

    app_id: str
    roles: list[RoleSpec]
    replicas: list[ReplicaSpec]
    strategy: str
    gang_timeout: float
    grace_period: float
    #: seconds the app may run from the driver's start (None: no limit); the driver stops it there
    time_limit: float | None = None
    #: the warning signal's name (``USR1``), empty for none; sent to every replica's process group
    warn_signal: str = ""
    #: how long before the time limit the warning comes, and a warned replica has before SIGTERM on a cancel
    warn_before: float = 120.0
    #: restarts the cluster's decisions may cause (actors lost with their node, a requeued time limit)
    max_preemptions: int = DEFAULT_MAX_PREEMPTIONS
    #: at the time limit, restart the app as a preemption instead of failing it
    requeue_on_time_limit: bool = False
    #: ``exclude_nodes`` as given (node ids, IPs, hostnames), resolved to node ids at each placement
    exclude_nodes: list[str] = field(default_factory=list)
    #: seconds without output and CPU after which a replica is stalled (None: never)
    stall_timeout: float | None = None
    #: what a stall does: ``restart`` (the replica's own failure) or ``fail`` (the app)
    on_stall: str = "restart"
    #: the key of the cluster's store the driver takes the secrets' values from ("" when none; :mod:`.secrets`)
    secrets_uri: str = ""

    def to_json(self) -> str:
        """ASCII JSON (surrogate-escaped bytes that are not UTF-8 survive as ``\\udcXX``)."""
        return json.dumps(asdict(self), sort_keys=True, ensure_ascii=True)

    @classmethod
    def from_json(cls, text: str) -> DriverPayload:
        data = json.loads(text)
        data["roles"] = [RoleSpec(**r) for r in data["roles"]]
        data["replicas"] = [ReplicaSpec(**r) for r in data["replicas"]]
        return cls(**data)


@dataclass
class RayRequest:
    """What ``schedule`` submits: one Ray job (its arguments) carrying :attr:`payload`."""

    app_id: str
    app_name: str
    session: str
    address: str
    entrypoint: str
    metadata: dict[str, str]
    #: ``runtime_env`` without the two local directories ``schedule`` adds (tsm itself and the payload)
    runtime_env: dict[str, Any]
    payload: DriverPayload
    #: the dir workspace's snapshot made the job's ``working_dir`` ("" when none)
    working_dir: str = ""
    spec: dict[str, Any] = field(default_factory=dict)
    #: the directory the working_dir is a snapshot of (``--workspace``, or the launching directory)
    working_dir_source: str = ""
    #: roles that gave no resource and hold :data:`DEFAULT_BUNDLE`
    default_sized: list[str] = field(default_factory=list)
    #: the working_dir is the launching directory, shipped without --workspace (run option ``ship_cwd``)
    implicit_working_dir: bool = False
    #: every secret the roles declare (``str`` of each :class:`~tsm.specs.secrets.SecretRef`), read at schedule
    secrets: list[str] = field(default_factory=list)


def actor_name(app_id: str, role: str, replica_id: int) -> str:
    """The named actor of a replica: ``<app_id>/<role>/<replica_id>``."""
    return f"{app_id}/{role}/{replica_id}"


def payload_module(app_id: str) -> str:
    """The Python package name the payload is shipped as."""
    return PAYLOAD_PREFIX + re.sub(r"\W", "_", app_id)


def new_app_id(app_name: str) -> str:
    """``<name>-<8 hex>``, the name cut to letters, digits, ``_.-`` (Ray's submission ids are free text)."""
    base = re.sub(r"[^a-zA-Z0-9_.-]+", "-", app_name).strip("-._")[:40] or "app"
    return f"{base}-{secrets.token_hex(4)}"


def bundle_of(cpu: float, gpu: int, mem_mb: int) -> dict[str, float]:
    """A placement-group bundle for a role's resource (zero entries left out: Ray refuses empty bundles)."""
    b: dict[str, float] = {"CPU": float(cpu) if cpu > 0 else 0.01}
    if gpu > 0:
        b["GPU"] = float(gpu)
    if mem_mb > 0:
        b["memory"] = float(mem_mb * 1024 * 1024)
    return b


def node_matches(entry: str, node_id: str, node_ip: str, node_name: str) -> bool:
    """Whether an ``exclude_nodes`` entry names a node: its node id (or a prefix of it of at least
    :data:`MIN_ID_PREFIX` characters), its IP address, or its hostname (the short one too)."""
    if not entry:
        return False
    if entry == node_id or (len(entry) >= MIN_ID_PREFIX and node_id.startswith(entry)):
        return True
    return entry in (node_ip, node_name) or (bool(node_name) and entry == node_name.split(".")[0])


def exclusion_selector(node_ids: list[str] | set[str]) -> dict[str, str]:
    """The label selector that keeps a placement-group bundle off ``node_ids`` (``!in(a,b)``); {} for none."""
    return {NODE_ID_LABEL: "!in(" + ",".join(sorted(node_ids)) + ")"} if node_ids else {}


def validate(app: AppDef) -> None:
    """Refuse what the ray scheduler cannot run (:class:`InvalidAppError`)."""
    for role in app.roles:
        if role.max_retries < 0:
            raise InvalidAppError(f"role '{role.name}': max_retries must be >= 0, not {role.max_retries}")
        if role.mounts:
            raise InvalidAppError(
                f"role '{role.name}' has mounts: the ray scheduler runs replicas on the Ray nodes' own file "
                "systems; ship files with --workspace or use paths every node has"
            )


def build_request(app: AppDef, opts: RayOptions, session: str, address: str, created: float) -> RayRequest:
    """The Ray job for ``app``; pure but for a fresh random app id."""
    app_id = new_app_id(app.name)
    envs = _environments(app, opts)
    roles = [RoleSpec(r.name, r.num_replicas, r.max_retries, r.retry_policy.value, envs.get(r.name))
             for r in app.roles]
    replicas: list[ReplicaSpec] = []
    sig = opts.warn_signum
    warn = sig.name.removeprefix("SIG") if sig is not None else ""
    working_dir = source = ""
    default_sized: list[str] = []
    entries, names = _secrets(app)
    for role in app.roles:
        res = role.resource
        if is_null_resource(res):
            default_sized.append(role.name)
        sized = not is_null_resource(res)
        bundle = bundle_of(res.cpu, res.gpu, res.memMB) if sized else dict(DEFAULT_BUNDLE)
        ws = role.metadata.get("tsm.workspace")
        if isinstance(ws, dict) and ws.get("ray_working_dir"):
            working_dir, source = str(ws["ray_working_dir"]), str(ws.get("workspace") or "")
        for i in range(role.num_replicas):
            r = macros.Values(img_root="", app_id=app_id, replica_id=str(i), rank0_env="TSM_RANK0_HOST").apply(role)
            env = dict(r.env)
            env.update({
                "TSM_APP_ID": app_id, "TSM_ROLE_NAME": role.name, "TSM_REPLICA_ID": str(i),
                "TSM_NUM_REPLICAS": str(role.num_replicas), "PYTHONUNBUFFERED": "1",
            })
            if warn:
                env["TSM_WARN_SIGNAL"] = warn
            replicas.append(ReplicaSpec(role.name, i, actor_name(app_id, role.name, i), [r.entrypoint, *r.args],
                                        env, dict(bundle), list(names.get(role.name, []))))
    payload = DriverPayload(app_id, roles, replicas, opts.placement_strategy, opts.gang_timeout, opts.grace_period,
                            opts.time_limit_s, warn, opts.warn_before_s, opts.max_preemptions,
                            opts.requeue_on_time_limit, list(opts.exclude_nodes or []), opts.stall_timeout_s,
                            opts.on_stall, new_uri() if entries else "")
    shape = [[r.name, r.num_replicas] for r in roles]
    metadata = {
        META_SCHEDULER: "ray", META_APP: app.name, META_SESSION: session, META_ROLES: json.dumps(shape),
        META_CREATED: f"{created:.3f}",
    }
    entrypoint = f"python -m tsm.schedulers.ray.driver {payload_module(app_id)}"
    # the driver asks for no CPU: only the replicas' actors hold resources
    runtime_env: dict[str, Any] = {"env_vars": {"RAY_JOB_SUBMISSION_ID_TSM": app_id}}
    if warn:  # `ray job stop` SIGKILLs the driver 3 s after its SIGTERM by default: leave it the warning's time
        stop_wait = str(math.ceil(opts.warn_before_s + opts.grace_period) + 15)
        runtime_env["env_vars"]["RAY_JOB_STOP_WAIT_TIME_S"] = metadata[META_STOP_WAIT] = stop_wait
    spec = app.to_dict()
    for role in spec["roles"]:
        if role["name"] in envs:
            p = envs[role["name"]]["plan"]
            role.setdefault("metadata", {})[METADATA_KEY] = {"key": p["key"], "lock": p["lock"], "python": p["python"]}
    return RayRequest(app_id, app.name, session, address, entrypoint, metadata, runtime_env, payload,
                      working_dir, spec, source, default_sized, secrets=entries)


def _environments(app: AppDef, opts: RayOptions) -> dict[str, dict[str, Any]]:
    """Each role's lockfile environment as the payload ships it (:mod:`.envs`); nothing when none is named."""
    if not opts.environment and not any(r.environment for r in app.roles):
        return {}
    from tsm.env.options import role_plan
    from tsm.schedulers.ray.envs import shipped

    out = {}
    for role in app.roles:
        plan = role_plan(role, opts)
        if plan is not None:
            out[role.name] = shipped(plan, f"role '{role.name}': environment")
    return out


def _secrets(app: AppDef) -> tuple[list[str], dict[str, list[str]]]:
    """The app's secret entries (validated) and each role's secret names; nothing when none is declared."""
    if not any(role.secrets for role in app.roles):
        return [], {}
    from tsm.specs.secrets import app_secrets, declared

    entries = [str(ref) for ref in app_secrets(app.roles).values()]
    return entries, {role.name: [ref.name for ref in declared(role.secrets, f"role '{role.name}'")]
                     for role in app.roles}


def format_request(req: RayRequest) -> str:
    """The request as what it amounts to: the ``ray job submit`` call and the actor of each replica."""
    env = dict(req.runtime_env)
    if req.working_dir:
        env["working_dir"] = req.working_dir
    lines = [
        f"# app {req.app_id}: a Ray job at {req.address} whose driver (0 CPU) starts {len(req.payload.replicas)} "
        f"actor(s) in namespace '{NAMESPACE}', gang-placed ({req.payload.strategy}, "
        f"timeout {req.payload.gang_timeout:g}s)",
        shlex.join(["ray", "job", "submit", "--address", req.address, "--submission-id", req.app_id,
                    "--no-wait", "--metadata-json", json.dumps(req.metadata, sort_keys=True),
                    "--runtime-env-json", json.dumps(env, sort_keys=True), "--", *shlex.split(req.entrypoint)]),
    ]
    if req.implicit_working_dir:
        lines.append(f"# replicas start in the job's working_dir: the launching directory {req.working_dir}, shipped "
                     f"by Ray at submission (no --workspace given; .gitignore and {', '.join(IMPLICIT_EXCLUDES)} left "
                     "out; -c ship_cwd=False to ship nothing)")
    elif req.working_dir:
        lines.append(f"# replicas start in the job's working_dir, a snapshot of {req.working_dir_source or req.working_dir}")
    else:
        lines.append("# no working_dir: replicas start in the Ray worker's directory (relative paths are the worker's)")
    p = req.payload
    if p.time_limit is not None:
        lines.append(f"# time limit {format_duration(p.time_limit)}, enforced by the driver"
                     + (f"; SIG{p.warn_signal} {format_duration(p.warn_before)} before it" if p.warn_signal else ""))
    if p.requeue_on_time_limit:
        lines.append("# at the time limit the app restarts, as a preemption")
    lines.append(f"# actors lost with their node restart elsewhere as a preemption (max_preemptions={p.max_preemptions}; "
                 "max_retries untouched); the lost node is excluded from later attempts")
    if p.stall_timeout is not None:
        lines.append(f"# a replica without output and CPU for {format_duration(p.stall_timeout)} is stalled: "
                     + ("its failure (retried per its role)" if p.on_stall == "restart" else "the app fails"))
    if p.exclude_nodes:
        lines.append(f"# excluded nodes (by node id, IP or hostname): {', '.join(p.exclude_nodes)}")
    if p.warn_signal:
        lines.append(f"# on cancel: SIG{p.warn_signal}, {format_duration(p.warn_before)}, then SIGTERM")
    if req.secrets:
        lines.append(f"# secrets {', '.join(req.secrets)}: read at submit, never shown; put in the cluster's store "
                     f"under {p.secrets_uri} (named by nothing above), taken and deleted there by the driver as it "
                     "starts, then in each replica's environment at every attempt")
    for role in req.payload.roles:
        if role.environment:
            lines.append(dryrun_line(role.name, role.environment))
        lines.append(f"# role {role.name}: {role.num_replicas} replica(s), retries {role.max_retries} "
                     f"({role.retry_policy})" + ("" if role.name not in req.default_sized else
                                                 "; no resource given: each replica holds the default 1 CPU"))
    for r in req.payload.replicas:
        res = " ".join(f"{k}={v:g}" for k, v in sorted(r.bundle.items()))
        envs = " ".join(shlex.quote(f"{k}={v}") for k, v in r.env.items())
        hidden = "".join(f" {n}=<secret>" for n in r.secrets)
        lines.append(f"actor {r.actor} [{res}]: env {envs}{hidden} {shlex.join(r.command)}")
    return "\n".join(lines)
