"""Distributed PyTorch builtins: ``dist.ddp`` and ``dist.spmd`` launch a program with torchrun on N nodes.

Usage::

    tsm run dist.ddp -j 2x4 --script train.py -- --lr 0.1     # 2 nodes x 4 processes, static
    tsm run dist.ddp -j 1:4x8 -m trainer.main                 # elastic: starts with 1 to 4 nodes
    tsm run dist.ddp -j 1x2 --script train.py                 # one node: a private local rendezvous

``-j [min:]NxM`` asks for N nodes (replicas of the role) of M processes each; with ``min:`` the role is
elastic (``min_replicas=min``, torchrun ``--nnodes min:N``). Exactly one of ``--script`` or ``-m`` says
what to run; everything after ``--`` goes to it verbatim.

What each node runs
-------------------
Several nodes meet at a rendezvous on the role's *first* replica, whose host name the scheduler only knows
at run time and hands to every replica in the env var named by the macro ``${rank0_env}``
(``TSM_RANK0_HOST``). A shell must expand that variable, so the entrypoint is ``sh`` with a *fixed* script,
and every value a user gave is a positional parameter of it, never part of the script text::

    sh -c 'exec python -m torch.distributed.run --rdzv_endpoint "$TSM_RANK0_HOST:$0" "$@"' \\
        29500 --nnodes 2 --nproc_per_node 4 --rdzv_backend c10d --rdzv_id <app id> \\
        --max_restarts 0 --role ddp train.py --lr 0.1

The host is expanded inside double quotes, so whatever the variable holds (even ``h;$(rm -rf ~)``) is
one word for torchrun and is never run. The rendezvous port is named ``c10d`` in the role's ``port_map`` so
cluster schedulers can open it.

A single node (``-j 1xM`` with no ``min:``) needs no rendezvous host: it runs ``python -m
torch.distributed.run --standalone ...`` directly (no shell), and torchrun picks a free local port, so two
single-node apps on one machine never collide (``--rdzv_backend`` and ``--rdzv_port`` are then unused).

``--max_retries`` is both torchrun's ``--max_restarts`` (restart the worker processes in place) and the
role's ``max_retries`` (the scheduler restarts the replicas).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tsm.components.base import app_name, exactly_one, resource
from tsm.errors import ComponentArgumentError
from tsm.specs.api import NULL_IMAGE, AppDef, Resource, Role, macros

#: The fixed launcher script of a multi-node role: ``$0`` is the rendezvous port, ``$@`` torchrun's arguments.
LAUNCH_SCRIPT = f'exec python -m torch.distributed.run --rdzv_endpoint "${macros.rank0_env}:$0" "$@"'

_J_RE = re.compile(r"(?:(\d+):)?(\d+)x(\d+)")
_J_FORM = "expected [min:]NxM (N nodes of M processes each, min nodes when elastic), e.g. 2x4 or 1:2x4"


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


def parse_j(j: str) -> JobShape:
    """Parse ``-j [min:]NxM``; a malformed or impossible shape is a ComponentArgumentError saying why."""
    m = _J_RE.fullmatch(j.strip())
    if m is None:
        raise ComponentArgumentError(f"-j {j!r}: {_J_FORM}")
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


def _torchrun_app(
    script_args: tuple[str, ...] | list[str],
    *,
    script: str | None,
    m: str | None,
    image: str,
    name: str,
    res: Resource,
    j: str,
    env: dict[str, str] | None,
    max_retries: int,
    rdzv_port: int,
    rdzv_backend: str,
) -> AppDef:
    """The app both launchers build: one role of N replicas, each running torchrun (see the module docstring)."""
    flag, target = exactly_one(script=script, m=m)
    shape = parse_j(j)
    if not 1 <= rdzv_port <= 65535:
        raise ComponentArgumentError(f"--rdzv_port {rdzv_port}: a port must be between 1 and 65535")
    program = [target] if flag == "--script" else ["-m", target]
    nproc = ["--nproc_per_node", str(shape.nproc_per_node)]
    tail = ["--max_restarts", str(max_retries), "--role", name, *program, *script_args]
    port_map: dict[str, int] = {}
    if shape.single_node:
        entrypoint = "python"
        args = ["-m", "torch.distributed.run", "--standalone", "--nnodes", "1", *nproc, *tail]
    else:
        entrypoint = "sh"
        args = [
            "-c",
            LAUNCH_SCRIPT,
            str(rdzv_port),
            "--nnodes",
            shape.nnodes_arg,
            *nproc,
            "--rdzv_backend",
            rdzv_backend,
            "--rdzv_id",
            macros.app_id,
            *tail,
        ]
        port_map["c10d"] = rdzv_port
    role = Role(
        name=name,
        image=image,
        entrypoint=entrypoint,
        args=args,
        env=dict(env or {}),
        num_replicas=shape.nnodes,
        min_replicas=shape.min_nnodes,
        max_retries=max_retries,
        resource=res,
        port_map=port_map,
    )
    return AppDef(name=app_name(script, m, fallback=name), roles=[role])


def ddp(
    *script_args: str,
    script: str | None = None,
    m: str | None = None,
    image: str = NULL_IMAGE,
    name: str = "ddp",
    h: str | None = None,
    cpu: int = 2,
    gpu: int = 0,
    memMB: int = 1024,  # noqa: N803
    j: str = "1x2",
    env: dict[str, str] | None = None,
    max_retries: int = 0,
    rdzv_port: int = 29500,
    rdzv_backend: str = "c10d",
) -> AppDef:
    """Distributed data parallel training: torchrun on N nodes of M processes (-j NxM).

    The app is named after the script or module (train.py gives "train"); its one role is --name.

    Args:
        *script_args: arguments for the script or module
        script: the training script to run
        m: the training module to run, as with python -m
        image: where to run (a directory for the local scheduler, a container image elsewhere)
        name: the role's name, also torchrun's --role
        h: a named resource per node such as gpu.small, instead of cpu/gpu/memMB
        cpu: CPUs per node (ignored with -h)
        gpu: GPUs per node (ignored with -h)
        memMB: memory per node in MB (ignored with -h)
        j: [min:]NxM, N nodes of M processes each; with min the job is elastic (min to N nodes)
        env: environment variables to set, as KEY=value,KEY2=value2
        max_retries: restarts allowed, both of the workers by torchrun and of the nodes by the scheduler
        rdzv_port: the rendezvous port on the first node (multi-node only)
        rdzv_backend: torchrun's rendezvous backend (multi-node only)
    """
    return _torchrun_app(
        script_args,
        script=script,
        m=m,
        image=image,
        name=name,
        res=resource(h, cpu, gpu, memMB),
        j=j,
        env=env,
        max_retries=max_retries,
        rdzv_port=rdzv_port,
        rdzv_backend=rdzv_backend,
    )


def spmd(
    *args: str,
    script: str | None = None,
    m: str | None = None,
    image: str = NULL_IMAGE,
    name: str = "spmd",
    h: str | None = None,
    j: str = "1x1",
    env: dict[str, str] | None = None,
    max_retries: int = 0,
    rdzv_port: int = 29500,
) -> AppDef:
    """A single-program multiple-data job: the dist.ddp launcher with one process per node by default.

    Args:
        *args: arguments for the script or module
        script: the program's script
        m: the program's module, as with python -m
        image: where to run (a directory for the local scheduler, a container image elsewhere)
        name: the role's name, also torchrun's --role
        h: a named resource per node such as gpu.small (default: 1 CPU, 1024 MB)
        j: [min:]NxM, N nodes of M processes each; with min the job is elastic (min to N nodes)
        env: environment variables to set, as KEY=value,KEY2=value2
        max_retries: restarts allowed, both of the workers by torchrun and of the nodes by the scheduler
        rdzv_port: the rendezvous port on the first node (multi-node only)
    """
    return _torchrun_app(
        args,
        script=script,
        m=m,
        image=image,
        name=name,
        res=resource(h),
        j=j,
        env=env,
        max_retries=max_retries,
        rdzv_port=rdzv_port,
        rdzv_backend="c10d",
    )
