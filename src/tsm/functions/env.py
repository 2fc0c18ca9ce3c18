"""Inside a function job: which rank this is, of how many, on which node; and torch.distributed's variables.

::

    env = tsm.functions.environment()
    env.rank, env.world_size, env.local_rank, env.node, env.num_nodes, env.rank0_host, env.attempt
    env.export_torch()        # MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE

Read from what tsm gives every replica (``TSM_REPLICA_ID``, ``TSM_NUM_REPLICAS``, ``TSM_RANK0_HOST``,
``TSM_APP_ID``, ``TSM_ATTEMPT``). Where replicas share a node, ``local_rank`` and ``node`` come from Slurm's
``SLURM_LOCALID``/``SLURM_NODEID`` when it set them, else from the job's ``tasks_per_node`` (submit's option,
``TSM_FUNCTION_TASKS_PER_NODE``): rank ``r`` is local rank ``r % tasks_per_node`` of node ``r //
tasks_per_node``. Without either every replica is a node of its own.
"""

from __future__ import annotations

import os
import socket
import zlib
from dataclasses import dataclass

#: the variable the worker sets from the job's ``tasks_per_node``
TASKS_PER_NODE_ENV = "TSM_FUNCTION_TASKS_PER_NODE"


def _int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, ""))
    except ValueError:
        return default


@dataclass(frozen=True)
class Environment:
    """This replica's place in its job (see the module doc)."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node: int
    num_nodes: int
    rank0_host: str
    hostname: str
    app_id: str
    attempt: int

    @property
    def master_port(self) -> int:
        """A port every rank of the job agrees on without talking: derived from the app id (20000-59999)."""
        return 20000 + zlib.crc32(self.app_id.encode()) % 40000

    def export_torch(self, port: int | None = None) -> None:
        """Set torch.distributed's ``env://`` variables for this rank (``init_process_group()`` then needs no
        arguments): ``MASTER_ADDR`` (rank 0's host), ``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
        ``LOCAL_WORLD_SIZE``."""
        os.environ.update({
            "MASTER_ADDR": self.rank0_host, "MASTER_PORT": str(port or self.master_port), "RANK": str(self.rank),
            "WORLD_SIZE": str(self.world_size), "LOCAL_RANK": str(self.local_rank),
            "LOCAL_WORLD_SIZE": str(self.local_world_size),
        })


def environment() -> Environment:
    """This replica's :class:`Environment`; outside a function job: rank 0 of 1 on this host."""
    rank = _int("TSM_REPLICA_ID", 0)
    world = max(1, _int("TSM_NUM_REPLICAS", 1))
    per_node = _int(TASKS_PER_NODE_ENV, 0)
    if "SLURM_LOCALID" in os.environ and "SLURM_NODEID" in os.environ:
        local_rank, node = _int("SLURM_LOCALID", 0), _int("SLURM_NODEID", 0)
        num_nodes = max(1, _int("SLURM_JOB_NUM_NODES", _int("SLURM_NNODES", 1)))
        local_world = per_node or 1
    elif per_node > 0:
        local_rank, node = rank % per_node, rank // per_node
        num_nodes, local_world = -(-world // per_node), per_node
    else:
        local_rank, node, num_nodes, local_world = 0, rank, world, 1
    host = socket.gethostname()
    return Environment(
        rank=rank, world_size=world, local_rank=local_rank, local_world_size=local_world, node=node,
        num_nodes=num_nodes, rank0_host=os.environ.get("TSM_RANK0_HOST") or host, hostname=host,
        app_id=os.environ.get("TSM_APP_ID", ""), attempt=_int("TSM_ATTEMPT", 0),
    )
