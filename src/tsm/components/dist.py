"""Distributed PyTorch builtins: ``dist.ddp`` and ``dist.spmd`` launch a program with torchrun on N nodes.

Usage::

    tsm run dist.ddp -j 2x4 --script train.py -- --lr 0.1     # 2 nodes x 4 processes, static
    tsm run dist.ddp -j 1:4x8 -m trainer.main                 # elastic: starts with 1 to 4 nodes
    tsm run dist.ddp -j 4 --script train.py                   # one node of 4 processes (TorchX's -j N)
    tsm run dist.spmd -j 2 -h gpu.small --script train.py     # 2 nodes, one process per GPU of gpu.small

``-j [min:]NxM`` asks for N nodes (replicas of the role) of M processes each; with ``min:`` the role is
elastic (``min_replicas=min``, torchrun ``--nnodes min:N``). ``dist.ddp -j M`` is one node of M processes
and ``dist.spmd -j N`` is N nodes of as many processes as the named resource ``-h`` has GPUs (one per node
without ``-h``), as in TorchX. Exactly one of ``--script`` or ``-m`` says what to run; the words after the
script or module (or after ``--``) go to it verbatim. In both builtins ``-h`` is the *named resource* of
a node (TorchX's meaning), not help: ``--help`` shows the help.

Names, as TorchX gives them
---------------------------
The role is named after the script's stem or the module's last part (``path/train.py`` and ``pkg.train``
give ``train``). ``--name`` is ``{experiment}/{run}``: the app is named after the run (after the role
when the run part is empty: ``/``, the default, or ``exp/``); the replicas see both names as
``TORCHX_TRACKING_EXPERIMENT_NAME`` (default ``default-experiment``) and ``TORCHX_TRACKING_RUN_NAME``.

What each node runs
-------------------
Each replica runs a small fixed launcher, ``python -c LAUNCHER``, whose arguments are every value the user
gave (no shell is involved, so no value is ever run as code)::

    python -c LAUNCHER 3 ${rank0_env} 29500 train --nnodes 2 --nproc_per_node 4 --rdzv_backend c10d \\
        --rdzv_id <app id> --max_restarts 0 --role train train.py --lr 0.1

The launcher starts ``python -m torch.distributed.run`` with those arguments plus, on several nodes,
``--rdzv_endpoint <host>:<port>``, where the host is the value of the env var the scheduler names through
the macro ``${rank0_env}`` (``TSM_RANK0_HOST``; ``localhost`` when it is empty). A single node (``-j 1xM``
without ``min:``) uses ``--standalone`` instead: torchrun picks a free local port, so two single-node apps
on one machine never collide. A static rendezvous (``--rdzv_backend static``) also passes
``--node_rank ${replica_id}``. The rendezvous port is named ``c10d`` in the role's ``port_map`` so
cluster schedulers can open it.

Whole lines per rank (``--tee``)
--------------------------------
Workers of one node share the replica's stdout and stderr; with unbuffered Python (``print`` writes the
text and the newline separately) their lines tear into each other. So, for the streams ``--tee`` selects
(TorchX's values: 0 none, 1 stdout, 2 stderr, 3 both, the default), torchrun writes each worker's output to
its own file (``--redirects``) in a private folder, and the launcher copies each file to the replica's
stream one *whole* line at a time, prefixed ``[<role><local rank>]:`` as torchrun's own ``--tee`` does
(which cannot keep lines whole: it copies a line it has read only half of). A line is passed on when its
newline arrives (every 0.1 s, as torchrun polls its own log files), a last line without one when the
program ends, and a line longer than 1 MiB in 1 MiB pieces. The folder is removed when torchrun ends.
Signals the launcher gets (SIGTERM, SIGINT, SIGHUP) are passed to torchrun, which stops its workers;
the launcher exits as torchrun did. ``--tee 0`` runs torchrun directly (workers write straight to the
replica's streams). ``PYTHONUNBUFFERED=1`` is set (unless ``--env`` sets it) so lines arrive live.

The role names ``torch`` as a package its replicas import (metadata ``tsm.python_needs``): the local
scheduler refuses the app at dry run, with the line that installs it, when the python its replicas run
(the activated environment, else the one running tsm) has no torch.

``--max_retries`` is both torchrun's ``--max_restarts`` (restart the worker processes in place) and the
role's ``max_retries`` (the scheduler restarts the replicas). ``--debug`` sets the usual PyTorch debug
variables (:data:`TORCH_DEBUG_FLAGS`); ``LOGLEVEL`` (torchrun's own log level) is the caller's, else
``WARNING``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import PurePosixPath

from tsm.components.base import check_script, resource, safe_name
from tsm.errors import ComponentArgumentError, TsmError
from tsm.specs.api import NULL_IMAGE, AppDef, Resource, Role, macros

#: ``tsm.schedulers.common.interpreter.NEEDS_KEY``: the role metadata naming the packages its replicas import,
#: which a scheduler running them with this host's python checks at dry run (written out: importing the kit
#: here would cost every component's start; ``tests/components/test_dist.py`` checks the two agree).
NEEDS_KEY = "tsm.python_needs"

#: Environment variables ``--debug`` sets: synchronous CUDA launches, NCCL desync reports, detailed
#: torch.distributed checks and C++ stack traces (the same set as TorchX's ``dist.ddp``).
TORCH_DEBUG_FLAGS: dict[str, str] = {
    "CUDA_LAUNCH_BLOCKING": "1",
    "NCCL_DESYNC_DEBUG": "1",
    "TORCH_DISTRIBUTED_DEBUG": "DETAIL",
    "TORCH_SHOW_CPP_STACKTRACES": "1",
}

#: The launcher each replica runs as ``python -c LAUNCHER TEE HOST_VAR PORT ROLE TORCHRUN_ARGS...``.
#: It is a constant: user values only ever reach it as arguments (see the module docstring).
LAUNCHER = r"""
import os, shutil, signal, subprocess, sys, tempfile, time
tee, host_var, port, role, *args = sys.argv[1:]
cmd = [sys.executable, "-m", "torch.distributed.run"]
if host_var:
    cmd += ["--rdzv_endpoint", (os.environ.get(host_var) or "localhost") + ":" + port]
if tee == "0":
    os.execv(sys.executable, cmd + args)
logs = tempfile.mkdtemp(prefix="tsm-torchrun-")
child = subprocess.Popen(cmd + ["--redirects", tee, "--log-dir", logs] + args, preexec_fn=os.setpgrp)
def forward(sig, frame):
    try:
        child.send_signal(sig)
    except OSError:
        pass
for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(s, forward)
tails = {}
def write(fd, data):
    while data:
        data = data[os.write(fd, data):]
def drain(final):
    for folder, _, files in os.walk(logs):
        rank = os.path.basename(folder)
        for name, fd in (("stdout.log", 1), ("stderr.log", 2)):
            path = os.path.join(folder, name)
            if rank.isdigit() and name in files and path not in tails:
                tails[path] = [open(path, "rb"), b"", ("[%s%s]:" % (role, rank)).encode(), fd]
    for t in sorted(tails.values(), key=lambda t: t[2]):
        lines = (t[1] + t[0].read()).split(b"\n")
        t[1] = lines.pop()
        while len(t[1]) > 1048576:
            lines.append(t[1][:1048576])
            t[1] = t[1][1048576:]
        if final and t[1]:
            lines.append(t[1])
            t[1] = b""
        batch = b""
        for line in lines:
            line = t[2] + line + b"\n"
            if batch and len(batch) + len(line) > 4096:
                write(t[3], batch)
                batch = b""
            batch += line
        write(t[3], batch)
try:
    while child.poll() is None:
        drain(False)
        time.sleep(0.1)
    drain(True)
finally:
    if child.poll() is None:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
    for t in tails.values():
        t[0].close()
    shutil.rmtree(logs, ignore_errors=True)
if child.returncode < 0:
    signal.signal(-child.returncode, signal.SIG_DFL)
    os.kill(os.getpid(), -child.returncode)
sys.exit(child.returncode)
"""

#: TorchX's private name for :data:`TORCH_DEBUG_FLAGS`, for code that imports it.
_TORCH_DEBUG_FLAGS = TORCH_DEBUG_FLAGS

_J_RE = re.compile(r"(?:(?:(\d+):)?(\d+)x)?(\d+)")
_J_FORM = "expected [min:]NxM (N nodes of M processes each, min nodes when elastic), e.g. 2x4 or 1:2x4, or M"


@dataclass(frozen=True)
class JobShape:
    """What ``-j [min:]NxM`` asks for: ``nnodes`` N, ``nproc_per_node`` M, ``min_nnodes`` min (None if static)."""

    nnodes: int
    nproc_per_node: int
    min_nnodes: int | None = None

    @property
    def single_node(self) -> bool:
        """One node and not elastic: no rendezvous host is needed."""
        return self.nnodes == 1 and self.min_nnodes is None

    @property
    def nnodes_arg(self) -> str:
        """torchrun's ``--nnodes``: ``N``, or ``min:N`` when elastic."""
        return f"{self.min_nnodes}:{self.nnodes}" if self.min_nnodes is not None else str(self.nnodes)


def parse_j(j: str, nproc_per_node: int | None = None) -> JobShape:
    """Parse ``-j [min:]NxM``, or ``-j N`` alone; a malformed or impossible shape is a ComponentArgumentError.

    ``-j N`` means one node of N processes (``dist.ddp``, TorchX's ``parse_nnodes``), or, when
    ``nproc_per_node`` is given, N nodes of that many processes (``dist.spmd``).
    """
    m = _J_RE.fullmatch(j.strip())
    if m is None:
        raise ComponentArgumentError(f"-j {j!r}: {_J_FORM}")
    if m.group(2) is None:
        count = int(m.group(3))
        nnodes, nproc = (1, count) if nproc_per_node is None else (count, nproc_per_node)
        min_nnodes = None
    else:
        min_nnodes = int(m.group(1)) if m.group(1) is not None else None
        nnodes, nproc = int(m.group(2)), int(m.group(3))
    if nnodes < 1 or nproc < 1:
        raise ComponentArgumentError(
            f"-j {j!r}: the number of nodes and of processes per node must be at least 1"
        )
    if min_nnodes is not None and not 1 <= min_nnodes <= nnodes:
        raise ComponentArgumentError(
            f"-j {j!r}: the minimum number of nodes ({min_nnodes}) must be between 1 and the number of nodes ({nnodes})"
        )
    return JobShape(nnodes, nproc, min_nnodes)


def parse_nnodes(j: str) -> tuple[int, int, int, str]:
    """TorchX's ``parse_nnodes``: ``(min_nnodes, max_nnodes, nproc_per_node, nnodes_rep)`` of ``dist.ddp``'s ``-j``.

    ``2x4`` gives ``(2, 2, 4, "2")``, ``1:3x4`` gives ``(1, 3, 4, "1:3")`` and ``4`` gives ``(1, 1, 4, "1")``;
    a bad ``-j`` raises :class:`~tsm.errors.ComponentArgumentError` (a ValueError, as TorchX raises).
    """
    shape = parse_j(j)
    low = shape.min_nnodes if shape.min_nnodes is not None else shape.nnodes
    return low, shape.nnodes, shape.nproc_per_node, shape.nnodes_arg


def role_name(script: str | None, m: str | None) -> str:
    """The role's name: the script's stem (``a/train.py`` gives ``train``) or the module's last part."""
    base = PurePosixPath(script.rstrip("/")).stem if script else (m or "").rpartition(".")[2]
    return safe_name(base, "worker")


def get_role_name(script: str | None, m: str | None) -> str:
    """TorchX's name for :func:`role_name`; with neither ``script`` nor ``m`` it raises ValueError as TorchX does."""
    if not script and not m:
        raise ComponentArgumentError("give --script or -m to name the role after")
    return role_name(script, m)


def parse_name(name: str, script: str | None, m: str | None) -> tuple[str, str]:
    """``(experiment, run)`` from ``--name {experiment}/{run}`` (either part may be empty), as TorchX reads it.

    No ``/`` makes the whole name the run; an empty run is the role's name (script stem or module part);
    an empty experiment is ``default-experiment``.
    """
    experiment, sep, run = name.partition("/")
    if not sep:
        experiment, run = "", name
    return experiment or "default-experiment", run or role_name(script, m)


def _one_of(script: str | None, m: str | None) -> None:
    given = [flag for flag, value in (("--script", script), ("-m", m)) if value is not None]
    if len(given) != 1:
        got = ", ".join(given) or "none"
        raise ComponentArgumentError(f"give exactly one of --script or -m (got {got})")


def _torchrun_app(
    script_args: tuple[str, ...] | list[str],
    *,
    script: str | None,
    m: str | None,
    image: str,
    name: str,
    res: Resource,
    shape: JobShape,
    env: dict[str, str] | None,
    metadata: dict[str, str] | None,
    max_retries: int,
    rdzv_port: int,
    rdzv_backend: str,
    rdzv_conf: str | None,
    mounts: list[str] | None,
    debug: bool,
    tee: int,
) -> AppDef:
    """The app both launchers build: one role of N replicas, each running torchrun (see the module docstring)."""
    if not 1 <= rdzv_port <= 65535:
        raise ComponentArgumentError(f"--rdzv_port {rdzv_port}: a port must be between 1 and 65535")
    if tee not in (0, 1, 2, 3):
        raise ComponentArgumentError(f"--tee {tee}: use 0 (none), 1 (stdout), 2 (stderr) or 3 (both)")
    role = role_name(script, m)
    experiment, run = parse_name(name, script, m)
    role_env = dict(env or {})
    role_env.setdefault("LOGLEVEL", os.environ.get("LOGLEVEL", "WARNING"))
    role_env.setdefault("PYTHONUNBUFFERED", "1")
    role_env["TORCHX_TRACKING_EXPERIMENT_NAME"] = experiment
    role_env["TORCHX_TRACKING_RUN_NAME"] = run
    if debug:
        role_env.update(TORCH_DEBUG_FLAGS)
    role_mounts = []
    if mounts:
        from tsm.specs.mounts import parse_mounts

        try:
            role_mounts = parse_mounts(mounts)
        except TsmError as e:
            raise ComponentArgumentError(f"--mounts: {e}") from e
    program = [script] if script is not None else ["-m", str(m)]
    args = ["--nnodes", shape.nnodes_arg, "--nproc_per_node", str(shape.nproc_per_node)]
    port_map: dict[str, int] = {}
    if shape.single_node:
        host_var = ""
        args.insert(0, "--standalone")
    else:
        host_var = macros.rank0_env
        args += ["--rdzv_backend", rdzv_backend, "--rdzv_id", macros.app_id]
        if rdzv_conf is not None:
            args += ["--rdzv_conf", rdzv_conf]
        if rdzv_backend == "static":
            args += ["--node_rank", macros.replica_id]
        port_map["c10d"] = rdzv_port
    args += ["--max_restarts", str(max_retries), "--role", role, *program, *script_args]
    return AppDef(
        name=safe_name(run, role),
        roles=[
            Role(
                name=role,
                image=image,
                entrypoint="python",
                args=["-c", LAUNCHER, str(tee), host_var, str(rdzv_port), role, *args],
                env=role_env,
                num_replicas=shape.nnodes,
                min_replicas=shape.min_nnodes,
                max_retries=max_retries,
                resource=res,
                port_map=port_map,
                mounts=role_mounts,
                metadata={NEEDS_KEY: "torch"},
            )
        ],
        metadata=dict(metadata or {}),
    )


def ddp(
    *script_args: str,
    script: str | None = None,
    m: str | None = None,
    image: str = NULL_IMAGE,
    name: str = "/",
    h: str | None = None,
    cpu: int = 2,
    gpu: int = 0,
    memMB: int = 1024,  # noqa: N803
    j: str = "1x2",
    env: dict[str, str] | None = None,
    metadata: dict[str, str] | None = None,
    max_retries: int = 0,
    rdzv_port: int = 29500,
    rdzv_backend: str = "c10d",
    rdzv_conf: str | None = None,
    mounts: list[str] | None = None,
    debug: bool = False,
    tee: int = 3,
) -> AppDef:
    """Distributed data parallel training: torchrun on N nodes of M processes (-j NxM).

    The role is named after the script or module (train.py gives "train"); -h is a named resource, not
    help (use --help). Each worker's lines reach the log whole, prefixed [<role><local rank>]:.

    Args:
        *script_args: arguments for the script or module
        script: the training script to run
        m: the training module to run, as with python -m
        image: where to run (a directory for the local scheduler, a container image elsewhere)
        name: {experiment}/{run}, {experiment}/, /{run} or {run}; the app is named after the run (default: the role's name)
        h: a named resource per node such as gpu.small, instead of cpu/gpu/memMB (not help: use --help)
        cpu: CPUs per node (ignored with -h)
        gpu: GPUs per node (ignored with -h)
        memMB: memory per node in MB (ignored with -h)
        j: [min:]NxM, N nodes of M processes each (with min the job is elastic: min to N nodes); M alone is one node of M
        env: environment variables to set, as KEY=value,KEY2=value2
        metadata: metadata for the scheduler, as KEY=value,KEY2=value2
        max_retries: restarts allowed, both of the workers by torchrun and of the nodes by the scheduler
        rdzv_port: the rendezvous port on the first node (multi-node only)
        rdzv_backend: torchrun's rendezvous backend (multi-node only); static also passes --node_rank
        rdzv_conf: extra rendezvous configuration for torchrun, e.g. join_timeout=600,timeout=600
        mounts: mounts for container schedulers, e.g. type=bind,src=/data,dst=/data,readonly
        debug: set PyTorch's debug environment variables (CUDA_LAUNCH_BLOCKING, TORCH_DISTRIBUTED_DEBUG, ...)
        tee: streams whose lines stay whole per worker: 0 none, 1 stdout, 2 stderr, 3 both
    """
    _one_of(script, m)
    check_script(script, image)
    return _torchrun_app(
        script_args,
        script=script,
        m=m,
        image=image,
        name=name,
        res=resource(h, cpu, gpu, memMB),
        shape=parse_j(j),
        env=env,
        metadata=metadata,
        max_retries=max_retries,
        rdzv_port=rdzv_port,
        rdzv_backend=rdzv_backend,
        rdzv_conf=rdzv_conf,
        mounts=mounts,
        debug=debug,
        tee=tee,
    )


def spmd(
    *args: str,
    script: str | None = None,
    m: str | None = None,
    image: str = NULL_IMAGE,
    name: str = "/",
    h: str | None = None,
    j: str = "1x1",
    env: dict[str, str] | None = None,
    metadata: dict[str, str] | None = None,
    max_retries: int = 0,
    rdzv_port: int = 29500,
    mounts: list[str] | None = None,
    debug: bool = False,
) -> AppDef:
    """A single-program multiple-data job: the dist.ddp launcher with one process per node by default.

    -j N is N nodes of one process per GPU of -h (one process without -h); -h is a named resource, not
    help (use --help).

    Args:
        *args: arguments for the script or module
        script: the program's script
        m: the program's module, as with python -m
        image: where to run (a directory for the local scheduler, a container image elsewhere)
        name: {experiment}/{run}, {experiment}/, /{run} or {run}; the app is named after the run (default: the role's name)
        h: a named resource per node such as gpu.small (default: 1 CPU, 1024 MB); not help: use --help
        j: [min:]NxM, N nodes of M processes each (with min the job is elastic); N alone infers M from -h's GPUs
        env: environment variables to set, as KEY=value,KEY2=value2
        metadata: metadata for the scheduler, as KEY=value,KEY2=value2
        max_retries: restarts allowed, both of the workers by torchrun and of the nodes by the scheduler
        rdzv_port: the rendezvous port on the first node (multi-node only)
        mounts: mounts for container schedulers, e.g. type=bind,src=/data,dst=/data,readonly
        debug: set PyTorch's debug environment variables (CUDA_LAUNCH_BLOCKING, TORCH_DISTRIBUTED_DEBUG, ...)
    """
    _one_of(script, m)
    check_script(script, image)
    res = resource(h)
    if h is None:
        nproc = 1
    elif res.gpu > 0:
        nproc = res.gpu
    else:
        nproc = 0  # only -j NxM can say how many processes a host without GPUs runs
    if nproc == 0 and "x" not in j:
        raise ComponentArgumentError(
            f"-j {j!r}: {h} has no GPU to count processes by; give -j {j.strip()}xM (M processes per node)"
        )
    return _torchrun_app(
        args,
        script=script,
        m=m,
        image=image,
        name=name,
        res=res,
        shape=parse_j(j, nproc_per_node=nproc or None),
        env=env,
        metadata=metadata,
        max_retries=max_retries,
        rdzv_port=rdzv_port,
        rdzv_backend="c10d",
        rdzv_conf=None,
        mounts=mounts,
        debug=debug,
        tee=3,
    )


class _noquote(str):  # noqa: N801 (TorchX's name, imported by tools that build torchrun commands)
    """A string that :func:`_args_join` writes as it is, unquoted, so a shell expands it (``$$HOST:29500``).

    Every other argument is quoted for the shell. Tools built on TorchX (NeMo-Run) wrap the rendezvous
    endpoint and the node rank in it when they build a ``torchrun`` command line for ``bash -c``.
    """


def _args_join(args: list[str] | tuple[str, ...]) -> str:
    """``shlex.join`` except that :class:`_noquote` arguments are left unquoted (TorchX's helper)."""
    import shlex

    return " ".join(a if isinstance(a, _noquote) else shlex.quote(a) for a in args)
