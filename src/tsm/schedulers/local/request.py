"""What the local scheduler submits: the request types, its run options, and the pure helpers that build them.

``LocalRequest`` (roles of replicas: command, working directory, environment) is the dry run's value and what
``request.json`` holds for the supervisor; ``format_request`` prints it as shell-like lines. The helpers decide
a replica's PATH, how a ``*.py`` entrypoint runs, and which GPUs each replica gets. Nothing here starts a
process or writes a file, so the dry run is exactly what is submitted.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tsm.env.options import EnvOptions
from tsm.errors import InvalidAppError, InvalidRunOptionError
from tsm.schedulers.common.interpreter import Interpreter, replica_python
from tsm.schedulers.common.lifecycle_opts import LifecycleOptions, format_duration
from tsm.schedulers.common.options import option
from tsm.specs.api import Role

#: Longest grace period accepted (seconds): a day. Far above any real shutdown, far below the ~24.8 days
#: where a timeout overflows the kernel's millisecond sleeps.
MAX_GRACE_PERIOD = 86400.0


def replica_path(prefix: Sequence[str], role_path: str | None, python: Interpreter | None = None) -> str:
    """The PATH a replica runs with: ``prefix`` (image, current directory) then the role's PATH.

    When the role's env does not set PATH, the directory of the replicas' python comes before the caller's
    PATH: ``python`` (default: :func:`~tsm.schedulers.common.interpreter.replica_python`, the activated
    environment's, else the interpreter that launched the app even from a virtualenv that is not
    activated -- the same rule as on Slurm). A role that sets PATH gets exactly its own after the prefix.
    """
    if role_path is not None:
        rest = [role_path]
    else:
        rest = [(python or replica_python()).bin_dir, os.environ.get("PATH", os.defpath)]
    return os.pathsep.join([*prefix, *rest])


def python_entrypoint(entrypoint: str, img_root: str, python: Interpreter | None = None) -> list[str]:
    """The command that starts ``entrypoint``: ``[PYTHON, FILE]`` for a script that can't run alone.

    A ``*.py`` entrypoint that is a file of the image (relative to ``img_root``, or absolute) without the
    execute bit runs with the replicas' python (see :func:`replica_path`), as the seed TSM API ran
    ``.runs("train_main.py")``; anything else is run as given. Decided at dry run, so the dry run shows the
    command that runs.
    """
    if not entrypoint.endswith(".py"):
        return [entrypoint]
    target = entrypoint if os.path.isabs(entrypoint) else os.path.join(img_root, entrypoint)
    if os.path.isfile(target) and not os.access(target, os.X_OK):
        return [(python or replica_python()).path, target]
    return [entrypoint]


@dataclass
class LocalReplicaRequest:
    """One process to start: its command (verbatim argv), working directory and env additions."""

    idx: int
    cmd: list[str]
    cwd: str | None
    env: dict[str, str]


@dataclass
class LocalRoleRequest:
    """The replicas of one role and what to do when one fails."""

    name: str
    max_retries: int
    retry_policy: str
    port_names: list[str]
    replicas: list[LocalReplicaRequest] = field(default_factory=list)
    #: the names of the secrets its replicas get (values: never here, see :mod:`tsm.specs.secrets`)
    secrets: list[str] = field(default_factory=list)


@dataclass
class LocalRequest:
    """Everything the supervisor needs; ``base_env`` (the caller's environment) is filled at schedule."""

    app_id: str
    app_name: str
    session: str
    app_dir: str
    log_dir: str
    grace_period: float
    roles: list[LocalRoleRequest]
    spec: dict[str, Any]
    timers: bool = True
    base_env: dict[str, str] = field(default_factory=dict)
    #: the long-run settings the supervisor enforces (see :func:`lifecycle_request`); {} when none
    lifecycle: dict[str, Any] = field(default_factory=dict)
    #: with ``-c queue=true``: what the supervisor reserves before it starts replicas (see resources.py);
    #: {} when the app does not queue
    queue: dict[str, Any] = field(default_factory=dict)
    #: each role's lockfile environment (:meth:`tsm.env.spec.EnvPlan.to_dict`), built at schedule; {} when none
    environments: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: every secret the roles declare (``str`` of each :class:`~tsm.specs.secrets.SecretRef`), read at schedule
    secrets: list[str] = field(default_factory=list)


#: The values of ``on_failure``.
ON_FAILURE = ("stop", "wait")


@dataclass(frozen=True)
class LocalOptions(LifecycleOptions, EnvOptions):
    """The local run options: where logs go, how replicas start and how they are stopped.

    The long-run options (``time_limit``, ``warn_signal``, ``stall_timeout``, ...) come from
    :class:`~tsm.schedulers.common.lifecycle_opts.LifecycleOptions`; the supervisor enforces them. The
    environment options (``environment``, ``find_links``, ...) come from :class:`~tsm.env.options.EnvOptions`.
    """

    log_dir: str | None = option(
        "directory for the app's logs (a folder per app is made in it); default $TSM_HOME/local/<app_id>/logs"
    )
    prepend_cwd: bool = option("put the current directory first on the replicas' PATH", False)
    auto_set_cuda_visible_devices: bool = option(
        "give each replica of a GPU role its own CUDA_VISIBLE_DEVICES slice of this machine's GPUs", True
    )
    queue: bool = option(
        "keep the app PENDING until the CPUs, memory and GPUs its roles request are free on this machine (shared "
        "by your apps that queue), then give each GPU replica its own CUDA_VISIBLE_DEVICES; default for sweeps",
        False,
    )
    grace_period: float = option("seconds between SIGTERM and SIGKILL when stopping replicas", 10.0)
    timers: bool = option(
        "host an expiration-timer server for the app (TSM_TIMER_SOCKET): tsm.timer.expires() reaps hung workers",
        True,
    )
    cwd: str | None = option("working directory of replicas whose image is not a directory; default the current one")
    on_failure: str = option(
        "what a replica's failure with no retries left does to the others: stop (the app fails at once) or wait "
        "(they run to their own end, then the app fails with the first failed replica's error, in rank order)",
        "stop",
    )
    python: str | None = option(
        "the python replicas run (an interpreter, its bin directory or an environment's root); default: the "
        "activated environment's, else the one running tsm (a role's env TSM_PYTHON wins)"
    )

    def check(self) -> None:
        """Refuse a grace period outside 0..MAX_GRACE_PERIOD, a ``cwd`` that is not a directory, and bad long-run options."""
        super().check()
        host = os.uname().nodename
        if host in (self.exclude_nodes or []) or host.split(".")[0] in (self.exclude_nodes or []):
            raise InvalidRunOptionError(
                f"run option exclude_nodes names this machine ({host}), the only node the local scheduler has"
            )
        if not 0 <= self.grace_period <= MAX_GRACE_PERIOD:
            raise InvalidRunOptionError(
                f"run option grace_period={self.grace_period!r} is out of range: grace_period must be >= 0 and <= "
                f"{MAX_GRACE_PERIOD:g} seconds (one day) between SIGTERM and SIGKILL"
            )
        if self.on_failure not in ON_FAILURE:
            raise InvalidRunOptionError(
                f"run option on_failure={self.on_failure!r} must be one of {', '.join(ON_FAILURE)}"
            )
        if self.cwd and not os.path.isdir(self.cwd):
            raise InvalidRunOptionError(f"run option cwd={self.cwd!r} is not a directory; give an existing folder")


def lifecycle_request(opts: LocalOptions) -> dict[str, Any]:
    """The long-run settings of ``opts`` as the supervisor reads them: seconds, a signal number, flags.

    Keys: ``time_limit`` and ``stall_timeout`` (seconds or None), ``warn_signal`` (a signal number or
    None), ``warn_before`` (seconds), ``max_preemptions``, ``on_stall``, ``requeue_on_time_limit``, ``wait_all``
    (``on_failure=wait``).
    """
    sig = opts.warn_signum
    return {
        "time_limit": opts.time_limit_s, "stall_timeout": opts.stall_timeout_s,
        "warn_signal": int(sig) if sig is not None else None, "warn_before": opts.warn_before_s,
        "max_preemptions": opts.max_preemptions, "on_stall": opts.on_stall,
        "requeue_on_time_limit": opts.requeue_on_time_limit, "wait_all": opts.on_failure == "wait",
    }


def _lifecycle_line(lc: dict[str, Any]) -> str | None:
    """One comment line saying what the supervisor will enforce, None when nothing."""
    import signal  # only a dry run prints the request

    parts = []
    if lc.get("time_limit"):
        parts.append(f"time limit {format_duration(lc['time_limit'])}"
                     + (f" (requeued up to {lc['max_preemptions']} time(s))" if lc.get("requeue_on_time_limit") else ""))
    if lc.get("warn_signal"):
        parts.append(f"warning {signal.Signals(lc['warn_signal']).name.removeprefix('SIG')} {format_duration(lc['warn_before'])} before")
    if lc.get("stall_timeout"):
        parts.append(f"stall after {format_duration(lc['stall_timeout'])} quiet: {lc['on_stall']}")
    return "# lifecycle: " + ", ".join(parts) if parts else None


def format_request(req: LocalRequest) -> str:
    """The request as shell-like lines a person can read (and paste): one per replica."""
    lines = [f"# local app {req.app_id}: logs in {req.log_dir}, grace period {req.grace_period:g}s"]
    if (lc_line := _lifecycle_line(req.lifecycle)) is not None:
        lines.append(lc_line)
    if req.queue:
        q = req.queue
        gpus = sum(g[2] for g in q["gpus"])
        lines.append(f"# queue: PENDING until {q['cpu']:g} CPU(s), {q['memMB']:g} MB and {gpus} GPU(s) are free; "
                     "GPU replicas get CUDA_VISIBLE_DEVICES then")
    if req.environments:
        from tsm.schedulers.local import envs

        lines += envs.lines(req.environments)
    if req.secrets:
        lines.append(f"# secrets (read at submit, never shown): {', '.join(req.secrets)}")
    for role in req.roles:
        policy = f"max_retries={role.max_retries} retry_policy={role.retry_policy}"
        lines.append(f"# role {role.name}: {len(role.replicas)} replica(s), {policy}")
        for rep in role.replicas:
            import shlex  # only a dry run prints the request

            env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(rep.env.items()))
            ports = "".join(f" TSM_PORT_{p.upper()}=<free port>" for p in role.port_names)
            cd = f"cd {shlex.quote(rep.cwd)} && " if rep.cwd else ""
            hidden = "".join(f" {n}=<secret>" for n in role.secrets)
            lines.append(f"{role.name}/{rep.idx}: {cd}env {env}{ports}{hidden} {shlex.join(rep.cmd)}")
    return "\n".join(lines)


#: ``PATH`` values on which ``nvidia-smi`` was looked for and not found (a machine gains no GPU driver while
#: a process runs; a search of every PATH entry costs about 0.1 ms per dry run, which a sweep pays per trial)
_NO_SMI: set[str] = set()


def detect_gpus() -> list[str]:
    """GPU ids visible here: ``CUDA_VISIBLE_DEVICES`` if set, else ``nvidia-smi``, else none."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [d for d in (s.strip() for s in visible.split(",")) if d and d != "-1"]
    path = os.environ.get("PATH", os.defpath)
    if path in _NO_SMI:
        return []  # asked before: no nvidia-smi on this PATH (a dry run per app of a sweep asks again)
    import shutil  # only to ask nvidia-smi: kept out of ``tsm status``/``list``
    import subprocess

    smi = shutil.which("nvidia-smi")
    if not smi:
        _NO_SMI.add(path)
        return []
    try:
        out = subprocess.run(
            [smi, "--query-gpu=index", "--format=csv,noheader"], capture_output=True, text=True, timeout=10
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


def assign_gpus(roles: list[Role], devices: list[str]) -> dict[tuple[str, int], list[str]]:
    """Give each replica of a GPU role its own slice of ``devices``, in role order.

    Returns ``{(role, replica): [device ids]}``; raises :class:`InvalidAppError` when the app asks for
    more GPUs than ``devices`` holds. With no devices at all nothing is assigned (CPU machine).
    """
    if not devices:
        return {}
    need = sum(r.resource.gpu * r.num_replicas for r in roles if r.resource.gpu > 0)
    if need > len(devices):
        raise InvalidAppError(
            f"the app asks for {need} GPU(s) but this machine has {len(devices)} ({','.join(devices)}); "
            "lower gpu or num_replicas, or pass -c auto_set_cuda_visible_devices=false"
        )
    out: dict[tuple[str, int], list[str]] = {}
    pos = 0
    for role in roles:
        if role.resource.gpu <= 0:
            continue
        for i in range(role.num_replicas):
            out[(role.name, i)] = devices[pos : pos + int(role.resource.gpu)]
            pos += int(role.resource.gpu)
    return out
