"""The Slurm scheduler: an app is one ``sbatch`` heterogeneous job, one component per role, submitted here or
on a login node over SSH (``-c ssh=login``). The manual is docs/schedulers/slurm.md.

The package::

    scheduler      SlurmScheduler: finds where an app lives (a Where) and asks that host
    host           Host: where Slurm commands run and job directories live; LocalHost, this machine
    ssh_host       SshHost, a login node over SSH; SshOptions; this machine's records of remote apps
    script         SlurmOptions, SlurmBatchRequest, build_script: the request, pure
    array          a sweep of single-role trials as one job array
    describe       describe's answer from Slurm's records and the job directory
    jobdir         the job directory's files, and reading them
    parse          reading squeue/sacct output, pure
    queries        SlurmQueries: one squeue per refresh, shared by every describe of a host
    cli            running Slurm's commands on this machine
    view           the views' batch hook (BatchedViews)
    workspace_ssh  workspace snapshots shipped to a login node by content
    programs/      the bash and Python programs the job and the hosts run, as files

Importing this package imports none of them; :func:`create_scheduler` and the names below load them when
first used.
"""

from __future__ import annotations

import importlib
from typing import Any

TYPE_CHECKING = False
if TYPE_CHECKING:
    from tsm.schedulers.slurm.cli import command_counts, parse_version, slurm_version
    from tsm.schedulers.slurm.jobdir import ReplicaFile, read_status
    from tsm.schedulers.slurm.parse import (
        SACCT_FIELDS,
        SQUEUE_ARGS,
        SQUEUE_FIELDS,
        SlurmJob,
        expand_hostlist,
        parse_sacct_text,
        parse_squeue_text,
        sacct_args,
        slurm_state,
    )
    from tsm.schedulers.slurm.queries import SlurmQueries, queries
    from tsm.schedulers.slurm.scheduler import SlurmScheduler
    from tsm.schedulers.slurm.script import (
        GPUS_PER_TASK_SINCE,
        REPLICA_WRAPPER,
        SlurmBatchRequest,
        SlurmOptions,
        build_script,
    )

#: public name -> the module of this package that defines it
_LAZY = {
    "command_counts": "cli", "parse_version": "cli", "slurm_version": "cli",
    "SACCT_FIELDS": "parse", "SQUEUE_ARGS": "parse", "SQUEUE_FIELDS": "parse", "sacct_args": "parse",
    "ReplicaFile": "jobdir", "SlurmJob": "parse", "expand_hostlist": "parse",
    "parse_sacct_text": "parse", "parse_squeue_text": "parse",
    "read_status": "jobdir", "slurm_state": "parse",
    "SlurmQueries": "queries", "queries": "queries",
    "SlurmScheduler": "scheduler",
    "GPUS_PER_TASK_SINCE": "script", "REPLICA_WRAPPER": "script", "SlurmBatchRequest": "script",
    "SlurmOptions": "script", "build_script": "script",
}  # fmt: skip

__all__ = [
    "GPUS_PER_TASK_SINCE",
    "REPLICA_WRAPPER",
    "ReplicaFile",
    "SACCT_FIELDS",
    "SQUEUE_ARGS",
    "SQUEUE_FIELDS",
    "SlurmBatchRequest",
    "SlurmJob",
    "SlurmOptions",
    "SlurmQueries",
    "SlurmScheduler",
    "build_script",
    "command_counts",
    "create_scheduler",
    "expand_hostlist",
    "parse_sacct_text",
    "parse_squeue_text",
    "parse_version",
    "queries",
    "read_status",
    "sacct_args",
    "slurm_state",
    "slurm_version",
]


def __getattr__(name: str) -> Any:
    """Load a public name from its module on first use (PEP 562); submodules load as usual."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def create_scheduler(session_name: str, **kwargs: Any) -> SlurmScheduler:
    """Factory registered as ``slurm`` in :mod:`tsm.schedulers`."""
    from tsm.schedulers.common.factory import scheduler_params
    from tsm.schedulers.slurm.scheduler import SlurmScheduler

    scheduler_params("slurm", kwargs, ("backend", "queries_"))  # any other keyword: an error naming it
    return SlurmScheduler(session_name, **kwargs)
