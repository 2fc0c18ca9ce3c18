"""Pure: an AppDef and :class:`DockerOptions` -> :class:`DockerRequest`, the exact containers to create.

No Docker call happens here (the dry run must not need a daemon); :func:`format_request` prints the
request as the ``docker`` commands it amounts to, which is what ``tsm run --dryrun -s docker`` shows.

Naming, per app ``<app_id>``:

* network ``tsm-<app_id>`` (a bridge network of its own, so Docker's DNS serves only this app);
* container ``<app_id>-<role>-<k>`` with host name and network alias ``<role>-<k>``: replicas reach each
  other by that name, and ``TSM_RANK0_HOST`` (the ``${rank0_env}`` macro) is ``<role0>-0``; a host name
  longer than Linux's 63 characters is cut and ends with a hash of the whole (:func:`dns_name`);
* labels ``tsm.*`` (:data:`LABEL_APP` ...) on every container and the network, among them the owner
  (:data:`LABEL_OWNER`, :mod:`tsm.schedulers.common.owner`): status, ``list``, cancel and cleanup select by
  them, so what a crashed launcher left is still found and another user's apps are never touched.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import re
import secrets
import shlex
from dataclasses import asdict, dataclass, field
from typing import Any

from tsm.env.options import EnvOptions
from tsm.errors import InvalidAppError, InvalidRunOptionError
from tsm.schedulers.common.container_request import LifecycleFields, lifecycle_fields
from tsm.schedulers.common.lifecycle_opts import LifecycleOptions, format_duration
from tsm.schedulers.common.options import option
from tsm.specs.api import AppDef, RetryPolicy, Role, is_null_resource, macros
from tsm.specs.mounts import BindMount, DeviceMount, VolumeMount
from tsm.specs.secrets import app_secrets, declared
from tsm.workspace.image import ImagePlan as WorkspaceBuild  # a workspace image: built, or reused

LABEL_SCHEDULER = "tsm.scheduler"
LABEL_APP = "tsm.app-id"
LABEL_SESSION = "tsm.session"
LABEL_OWNER = "tsm.owner"
LABEL_ROLE = "tsm.role"
LABEL_REPLICA = "tsm.replica-id"
LABEL_ATTEMPT = "tsm.attempt"
#: JSON ``[[role, replicas, max_retries, policy], ...]``: the app's shape, so status needs no local file
LABEL_ROLES = "tsm.roles"
LABEL_CREATED = "tsm.created"

PULL_POLICIES = ("missing", "always", "never")
_NAME_OK = re.compile(r"[^a-z0-9-]+")
#: the longest host name Linux takes (HOST_NAME_MAX is 64 with its NUL) and a DNS label may have
HOST_MAX = 63


#: the long-run options the docker scheduler does not carry out: refused, never ignored
_NOT_YET = {
    "exclude_nodes": "one Docker daemon is one node",
}


@dataclass(frozen=True)
class DockerOptions(LifecycleOptions, EnvOptions):
    """Run options of the ``docker`` scheduler, with the long-run ones it carries out when tsm looks at the
    app: ``time_limit`` (and ``requeue_on_time_limit``), ``warn_signal`` and ``warn_before`` (before the
    time limit, a cancel or a stall), ``max_preemptions`` (containers ended by a daemon restart),
    ``stall_timeout`` and ``on_stall``."""

    pull: str = option("when to pull a role's image: missing (only if not present locally), always, never", "missing")
    grace_period: float = option("seconds cancel waits after SIGTERM before SIGKILL", 10.0)
    remove_finished: bool = option(
        "remove an app's containers and network once it has ended (logs are kept in $TSM_HOME); "
        "default keeps them until `tsm rm` or DockerScheduler.cleanup()",
        False,
    )
    shm_fraction: float = option("size of /dev/shm as a fraction of the role's memMB (0 = Docker's 64 MB)", 0.5)

    def check(self) -> None:
        super().check()
        given = {"exclude_nodes": bool(self.exclude_nodes)}
        for name, why in _NOT_YET.items():
            if given[name]:
                raise InvalidRunOptionError(f"run option {name} is not supported on docker yet ({why})")
        if self.pull not in PULL_POLICIES:
            raise InvalidRunOptionError(f"pull must be one of {', '.join(PULL_POLICIES)}, not {self.pull!r}")
        if self.grace_period < 0:
            raise InvalidRunOptionError(f"grace_period must be >= 0, not {self.grace_period}")
        if not 0 <= self.shm_fraction <= 1:
            raise InvalidRunOptionError(f"shm_fraction must be in [0, 1], not {self.shm_fraction}")


@dataclass
class ContainerSpec:
    """One replica's container, in the terms of Docker's create API (plain data, JSON-able)."""

    name: str
    role: str
    replica_id: int
    image: str
    command: list[str]
    env: dict[str, str]
    hostname: str
    labels: dict[str, str]
    nano_cpus: int | None = None
    mem_limit: int | None = None
    shm_size: int | None = None
    gpus: int = 0
    #: ``{"type": "bind"|"volume", "source", "target", "read_only"}``
    mounts: list[dict[str, Any]] = field(default_factory=list)
    #: ``"host:container:perms"``
    devices: list[str] = field(default_factory=list)
    #: REPLICA retries: Docker restarts the container itself up to this many times
    restart_max: int = 0
    stop_grace: float = 10.0
    #: the warning signal's name (``USR1``), empty when the app asked for none
    warn_signal: str = ""
    #: the names of the secrets its command reads from its secrets volume (:mod:`tsm.schedulers.docker.secrets`)
    secrets: list[str] = field(default_factory=list)


@dataclass
class DockerRequest(LifecycleFields):
    """What ``schedule`` does: pull images per policy, create the network, create and start containers; the
    long-run fields are the kit's (:class:`~tsm.schedulers.common.container_request.LifecycleFields`), the
    time limit counted from ``created``."""

    app_id: str
    app_name: str
    session: str
    network: str
    pull: str
    images: list[str]
    containers: list[ContainerSpec]
    app_dir: str
    remove_finished: bool
    roles: list[list[Any]]
    builds: list[WorkspaceBuild] = field(default_factory=list)
    spec: dict[str, Any] = field(default_factory=dict)
    #: the owner label value of every object of the app
    owner: str = ""
    #: seconds before the time limit the warning comes, and a warned replica has before SIGTERM on a cancel
    warn_before: float = 120.0
    #: the submission time (epoch seconds), as the containers' ``tsm.created`` label says
    created: float | None = None
    #: every secret the roles declare (``str`` of each :class:`~tsm.specs.secrets.SecretRef`), read at schedule
    secrets: list[str] = field(default_factory=list)

    def to_json(self) -> str:
        """The request as JSON (what is saved beside the app and read back to recreate containers)."""
        return json.dumps(asdict(self), indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> DockerRequest:
        data = json.loads(text)
        data["containers"] = [ContainerSpec(**c) for c in data["containers"]]
        data["builds"] = [WorkspaceBuild(**b) for b in data.get("builds", [])]
        return cls(**data)


def dns_name(role: str, replica_id: int) -> str:
    """The host name replica ``replica_id`` of ``role`` has on its app's network: ``<role>-<k>``.

    Docker's DNS wants ``[a-z0-9-]``: other characters become ``-`` (``Trainer_A`` -> ``trainer-a-0``). A
    name over :data:`HOST_MAX` characters is cut, and ends with ``-<8 hex of the role>-<k>``, so two long
    roles sharing a prefix stay apart and the same role always gets the same name.
    """
    base = _NAME_OK.sub("-", role.lower()).strip("-") or "role"
    name = f"{base}-{replica_id}"
    if len(name) <= HOST_MAX:
        return name
    tail = f"-{hashlib.sha256(role.encode('utf-8', 'surrogateescape')).hexdigest()[:8]}-{replica_id}"
    return base[: HOST_MAX - len(tail)].rstrip("-") + tail


def new_app_id(app_name: str) -> str:
    """``<name>-<8 hex>``, with the name cut to what Docker accepts in container and network names."""
    base = re.sub(r"[^a-zA-Z0-9_.-]+", "-", app_name).strip("-._")[:40] or "app"
    return f"{base}-{secrets.token_hex(4)}"


def _utf8(value: str, what: str) -> str:
    """Docker's API carries JSON text: a value holding bytes that are not UTF-8 cannot reach a container."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InvalidAppError(
            f"{what} holds bytes that are not UTF-8 ({value[e.start:e.end]!r}); Docker's API carries text only: "
            "pass such data in a file (a bind mount) instead"
        ) from e
    return value


def _mounts(role: Role) -> tuple[list[dict[str, Any]], list[str]]:
    mounts: list[dict[str, Any]] = []
    devices: list[str] = []
    for m in role.mounts:
        if isinstance(m, BindMount):
            mounts.append({"type": "bind", "source": os.path.abspath(m.src_path), "target": m.dst_path,
                           "read_only": m.read_only})
        elif isinstance(m, VolumeMount):
            mounts.append({"type": "volume", "source": m.src, "target": m.dst_path, "read_only": m.read_only})
        elif isinstance(m, DeviceMount):
            devices.append(f"{m.src_path}:{m.dst_path}:{m.permissions}")
        else:  # pragma: no cover - the mount types are closed
            raise InvalidAppError(f"role '{role.name}': unsupported mount {m!r}")
    return mounts, devices


def validate(app: AppDef, has_gpus: bool) -> None:
    """Refuse what the docker scheduler cannot run (raises :class:`InvalidAppError`)."""
    for role in app.roles:
        if not role.image:
            raise InvalidAppError(f"role '{role.name}' has no image: the docker scheduler runs a container image")
        if role.resource.gpu > 0 and not has_gpus:
            raise InvalidAppError(
                f"role '{role.name}' asks for {role.resource.gpu} GPU(s) but this host has none "
                "(no /dev/nvidiactl): run it where NVIDIA GPUs and the NVIDIA container toolkit are, or set gpu=0"
            )
        if role.max_retries < 0:
            raise InvalidAppError(f"role '{role.name}': max_retries must be >= 0, not {role.max_retries}")
        _utf8(role.entrypoint, f"role '{role.name}' entrypoint")
        for i, a in enumerate(role.args):
            _utf8(a, f"role '{role.name}' argument {i}")
        for k, v in role.env.items():
            _utf8(k, f"role '{role.name}' env name")
            _utf8(v, f"role '{role.name}' env {k}")
    names = [dns_name(r.name, 0) for r in app.roles]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise InvalidAppError(f"roles map to the same host names on Docker's network: {', '.join(sorted(dup))}")


def build_request(app: AppDef, opts: DockerOptions, session: str, app_dir_root: str, created: float,
                  owner: str = "") -> DockerRequest:
    """The containers for ``app`` (labelled with ``owner``); pure but for a fresh random app id."""
    app_id = new_app_id(app.name)
    network = f"tsm-{app_id}"
    rank0 = dns_name(app.roles[0].name, 0)
    shape = [[r.name, r.num_replicas, r.max_retries, r.retry_policy.value] for r in app.roles]
    sig = opts.warn_signum
    warn = sig.name.removeprefix("SIG") if sig is not None else ""
    containers: list[ContainerSpec] = []
    for role in app.roles:
        res = role.resource
        sized = not is_null_resource(res)
        mounts, devices = _mounts(role)
        for i in range(role.num_replicas):
            host = dns_name(role.name, i)
            r = macros.Values(img_root="/", app_id=app_id, replica_id=str(i)).apply(role)
            env = dict(r.env)
            env.update({
                "TSM_APP_ID": app_id, "TSM_ROLE_NAME": role.name, "TSM_REPLICA_ID": str(i),
                "TSM_NUM_REPLICAS": str(role.num_replicas), "TSM_RANK0_HOST": rank0, "PYTHONUNBUFFERED": "1",
                **attempt_env(0, 0, ""),
            })
            if warn:
                env["TSM_WARN_SIGNAL"] = warn
            if "TORCHX_JOB_ID" in env:  # the runner sets TorchX's names unless torchx_env=false
                env["TORCHX_RANK0_HOST"] = rank0
            mem = res.memMB * 1024 * 1024 if sized and res.memMB > 0 else None
            containers.append(ContainerSpec(
                name=f"{app_id}-{host}",
                role=role.name,
                replica_id=i,
                image=role.image,
                command=[r.entrypoint, *r.args],
                env=env,
                hostname=host,
                labels={
                    LABEL_SCHEDULER: "docker", LABEL_APP: app_id, LABEL_SESSION: session, LABEL_ROLE: role.name,
                    LABEL_REPLICA: str(i), LABEL_ATTEMPT: "0", LABEL_ROLES: json.dumps(shape),
                    LABEL_CREATED: f"{created:.3f}", LABEL_OWNER: owner,
                },
                nano_cpus=int(res.cpu * 1e9) if sized and res.cpu > 0 else None,
                mem_limit=mem,
                shm_size=int(mem * opts.shm_fraction) if mem and opts.shm_fraction > 0 else None,
                gpus=max(res.gpu, 0),
                mounts=mounts,
                devices=devices,
                restart_max=role.max_retries if role.retry_policy == RetryPolicy.REPLICA else 0,
                stop_grace=opts.grace_period,
                warn_signal=warn,
            ))
    images = sorted({c.image for c in containers})
    req = DockerRequest(
        app_id=app_id, app_name=app.name, session=session, network=network, pull=opts.pull, images=images,
        containers=containers, app_dir=os.path.join(app_dir_root, app_id), remove_finished=opts.remove_finished,
        roles=shape, spec=app.to_dict(), owner=owner, warn_before=opts.warn_before_s, created=round(created, 3),
        **lifecycle_fields(opts),
    )
    if any(role.secrets for role in app.roles):
        plan_secrets(app, req)
    return req


def attempt_env(attempt: int, restart_count: int, last_exit: str) -> dict[str, str]:
    """What an attempt of a replica is told (:mod:`tsm.lifecycle`): ``TSM_ATTEMPT``, ``TSM_RESTART_COUNT``
    and ``TSM_LAST_EXIT`` (``failed:<code>`` ...; empty on the first)."""
    return {"TSM_ATTEMPT": str(attempt), "TSM_RESTART_COUNT": str(restart_count), "TSM_LAST_EXIT": last_exit}


def docker_run_args(c: ContainerSpec, network: str) -> list[str]:
    """The ``docker run`` command line equivalent to creating and starting ``c`` (for people and the dry run)."""
    args = ["docker", "run", "-d", "--name", c.name, "--hostname", c.hostname, "--network", network,
            "--network-alias", c.hostname, "--log-driver", "local"]
    for k, v in sorted(c.labels.items()):
        args += ["--label", f"{k}={v}"]
    for k, v in c.env.items():
        args += ["-e", f"{k}={v}"]
    if c.nano_cpus:
        args += ["--cpus", f"{c.nano_cpus / 1e9:g}"]
    if c.mem_limit:
        args += ["--memory", f"{c.mem_limit // (1024 * 1024)}m"]
    if c.shm_size:
        args += ["--shm-size", f"{c.shm_size // (1024 * 1024)}m"]
    if c.gpus:
        args += ["--gpus", str(c.gpus)]
    for m in c.mounts:
        ro = ",readonly" if m["read_only"] else ""
        args += ["--mount", f"type={m['type']},source={m['source']},target={m['target']}{ro}"]
    for d in c.devices:
        args += ["--device", d]
    if c.restart_max:
        args += ["--restart", f"on-failure:{c.restart_max}"]
    args += ["--stop-timeout", f"{c.stop_grace:g}", "--entrypoint", c.command[0], c.image, *c.command[1:]]
    return args


def format_request(req: DockerRequest) -> str:
    """The request as the commands it amounts to: builds, pulls, the network, one ``docker run`` per replica."""
    lines = [f"# app {req.app_id}: {len(req.containers)} container(s) on network {req.network}"]
    warn = next((c.warn_signal for c in req.containers if c.warn_signal), "")
    if req.time_limit is not None:
        lines.append(f"# time limit {format_duration(req.time_limit)}, enforced by tsm when it looks at the app"
                     + (f"; SIG{warn} {format_duration(req.warn_before)} before it" if warn else ""))
    if req.time_limit is not None and req.requeue_on_time_limit:
        lines.append(f"# at the time limit the app restarts, as a preemption (max_preemptions={req.max_preemptions})")
    if req.stall_timeout is not None:
        lines.append(f"# stall_timeout {format_duration(req.stall_timeout)} (no log line, no CPU time), checked by tsm "
                     f"when it looks at the app; on_stall={req.on_stall}")
    if warn:
        lines.append(f"# on cancel: SIG{warn}, {format_duration(req.warn_before)}, then docker stop")
    for b in req.builds:
        verb = "build" if b.build else "reuse (unchanged workspace, no build)"
        lines.append(f"# workspace of role '{b.role}': {verb} {b.tag} FROM {b.base_image} ({b.base_image_id[:19]})")
    for image in req.images:
        how = {"missing": "pull if not present", "always": "pull", "never": "use local only"}[req.pull]
        lines.append(f"# image {image}: {how}")
    lines.append(shlex.join(["docker", "network", "create", "--label", f"{LABEL_APP}={req.app_id}",
                             "--label", f"{LABEL_OWNER}={req.owner}", req.network]))
    if req.secrets:
        lines += volume_lines(req)
    for c in req.containers:
        hidden = "".join(f" {n}=<secret>" for n in c.secrets)
        lines.append(shlex.join(docker_run_args(c, req.network)) + (f"  #{hidden}" if hidden else ""))
    return "\n".join(lines)


# -- secrets (tsm.schedulers.docker.secrets delivers the values at submit) --------------------------------
#: Where a role's secrets volume is mounted (read-only) in its containers: one file per secret, its name.
SECRETS_DIR = "/run/tsm/secrets"
#: The shell the wrapper needs in the image.
SHELL = "/bin/sh"
#: ``$0`` of the wrapper (what ``ps`` shows until the ``exec``).
ARGV0 = "tsm-secrets"
#: The label of the container that fills a volume (never started): the volume's name.
LABEL_FILLER = "tsm.secrets-volume"

def volume_name(app_id: str, role_index: int) -> str:
    """The secrets volume of the ``role_index``-th role of an app."""
    return f"tsm-{app_id}-secrets-{role_index}"


def script(names: list[str], folder: str = SECRETS_DIR) -> str:
    """The POSIX shell program that exports each secret of ``names`` read from ``folder/NAME`` and then runs
    its arguments (``exec "$@"``). Each file is read line by line by the shell's ``read`` and joined again
    with the newlines ``read`` took off, the last line as it is, so the value is the file's bytes exactly.
    A file that cannot be read ends the container with status 1 and a line on stderr naming it. Its own
    variables are named apart from every secret (and unset before the ``exec``)."""
    taken = set(names)
    nl, var, path, val, line = (_free(f"tsm_{v}", taken) for v in ("nl", "var", "path", "val", "line"))
    return (f"{nl}='\n'; for {var} in {' '.join(names)}; do {path}={shlex.quote(folder)}/${{{var}}}; "
            f'[ -r "${{{path}}}" ] || {{ echo "tsm: cannot read secret ${{{var}}} from ${{{path}}}" >&2; exit 1; }}; '
            f'{val}=; while IFS= read -r {line}; do {val}="${{{val}}}${{{line}}}${{{nl}}}"; done < "${{{path}}}"; '
            f'export "${{{var}}}=${{{val}}}${{{line}}}"; done; unset {nl} {var} {path} {val} {line}; exec "$@"')


def _free(name: str, taken: set[str]) -> str:
    """``name``, with ``_`` added until it is none of ``taken``."""
    while name in taken:
        name += "_"
    return name


def wrap(command: list[str], names: list[str]) -> list[str]:
    """``command`` (entrypoint and args) run by the wrapper shell that first exports ``names``."""
    return [SHELL, "-c", script(names), ARGV0, *command]


def plan_secrets(app: AppDef, req: DockerRequest) -> None:
    """Give each role of ``app`` that declares secrets its volume's read-only mount and the wrapped command,
    and ``req`` every declaration (read at schedule); an :class:`InvalidAppError` when a role already
    mounts something at :data:`SECRETS_DIR`."""
    refs = app_secrets(app.roles)
    req.secrets = [str(ref) for ref in refs.values()]
    for i, role in enumerate(app.roles):
        names = [ref.name for ref in declared(role.secrets, f"role '{role.name}'")]
        if not names:
            continue
        for m in role.mounts:
            dst = posixpath.normpath(getattr(m, "dst_path", "") or "/")
            if dst == SECRETS_DIR or dst.startswith(SECRETS_DIR + "/"):
                raise InvalidAppError(f"role '{role.name}' mounts {dst}, where its secrets' volume goes: "
                                      f"mount it elsewhere")
        mount = {"type": "volume", "source": volume_name(req.app_id, i), "target": SECRETS_DIR, "read_only": True}
        for c in req.containers:
            if c.role == role.name:
                c.secrets = list(names)
                c.mounts = [*c.mounts, dict(mount)]
                c.command = wrap(c.command, names)


def volumes(req: DockerRequest) -> dict[str, tuple[str, str, list[str]]]:
    """Each secrets volume of ``req``: ``{volume: (role, image, names)}``."""
    out: dict[str, tuple[str, str, list[str]]] = {}
    for c in req.containers:
        if c.secrets:
            source = next(str(m["source"]) for m in c.mounts if m["target"] == SECRETS_DIR)
            out.setdefault(source, (c.role, c.image, list(c.secrets)))
    return out


def volume_lines(req: DockerRequest) -> list[str]:
    """The dry run's lines for the secrets: what is read at submit and each volume made (names only)."""
    lines = [f"# secrets (read at submit, never shown): {', '.join(req.secrets)}"]
    for name, (role, _image, names) in volumes(req).items():
        lines.append(shlex.join(["docker", "volume", "create", "--label", f"{LABEL_APP}={req.app_id}",
                                 "--label", f"{LABEL_OWNER}={req.owner}", name])
                     + f"  # role {role}: {', '.join(names)} as files 0444, mounted read-only at {SECRETS_DIR}")
    return lines
