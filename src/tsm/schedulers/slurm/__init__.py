"""The Slurm scheduler: an app becomes one ``sbatch`` heterogeneous job, one component per role.

The package: ``script`` (the request, pure), ``cli`` (running Slurm's commands), ``parse`` (reading their
answers, pure), ``queries`` (the shared status cache) and ``scheduler`` (the interface). Importing this
package imports none of them; :func:`create_scheduler` and the names below load them when first used.

Usage::

    tsm run -s slurm -c partition=gpu,time=2:00:00 dist.ddp -j 2x8 --script train.py
    tsm status slurm://default/4242        # the app id is the Slurm job id
    tsm log -f slurm://default/4242/trainer/0  # follow replica 0 of role trainer

The request
-----------
``tsm run --dryrun -s slurm ...`` prints the batch script exactly as ``sbatch`` receives it. Role ``i`` is
het-job component ``i`` (components are separated by ``#SBATCH hetjob``); an app of one role is a plain
job. Each replica gets a node of its own (``--nodes=N --ntasks-per-node=1``), or, with the run option
``pack_replicas``, the replicas are ``N`` tasks that Slurm may pack onto fewer nodes (``--ntasks=N``).
A role's resource becomes ``--cpus-per-task``, ``--mem`` (``--mem-per-cpu`` when packed) and GPUs:
``--gpus-per-node`` before Slurm 23.02, ``--gpus-per-task`` from 23.02 on or when packed (the version is
asked of ``sbatch --version`` once per process, and only when a role wants GPUs; the run option
``slurm_version`` overrides it). A role without a resource gets none of these: the partition's defaults
apply, and the dry run says so (as TorchX submits such a role). The body starts one ``srun --het-group=i``
per role in the background
and waits for all of them. When a replica fails, ``srun --kill-on-bad-exit`` stops the rest of its role
and the script sends SIGTERM to every other role (SIGKILL ``kill_grace`` seconds later); the job then
fails, and ``describe`` names the failed replica and its exit code.

Each task runs a fixed wrapper, ``bash -c "$_tsm_replica" tsm-replica <role> <n> <nenv> K=V... CMD...``:
the wrapper's text never changes, and every value from the app (entrypoint, args, env) is one of its
positional parameters, shell-quoted once in the script, so arguments reach the replica byte for byte
(quotes, ``$()``, backticks, newlines, non-ASCII) and can never run as script. Env names that are not
shell names are set with ``env --`` (a name like ``--unset`` stays a name, never an option), and at dry
run every value must fit what Linux passes to one program, the submitter's environment included
(:func:`tsm.specs.validate.check_exec_size`). The wrapper exports
``TSM_REPLICA_ID`` (the task's ``SLURM_PROCID`` within its role), ``TSM_ROLE_NAME``,
``TSM_NUM_REPLICAS``, ``TSM_APP_ID`` (the job id) and ``TSM_RANK0_HOST`` (the first node of the first
role, resolved by name, or by its ``NodeAddr`` when the name does not resolve), substitutes the run-time
macros ``${app_id}`` and ``${replica_id}`` (the others are substituted at dry run), records the replica's
host and exit code, and runs the command. The job keeps the submitter's environment (``--export=ALL``),
and the wrapper puts the directory of the replicas' python first on its ``PATH`` (``TSM_PYTHON_BIN``), chosen
by the rule shared with the local scheduler (:mod:`tsm.schedulers.common.interpreter`): a role's env
``TSM_PYTHON``, else the run option ``python``, else the activated environment (``$VIRTUAL_ENV``, a conda
env other than ``base``), else the interpreter running tsm -- so ``venv/bin/tsm`` runs that venv's python
on the nodes even when it is not activated. The dry run names it (``# python: ...``).

Values in ``#SBATCH`` lines are shell-quoted too; ``sbatch`` reads those lines with quotes of its own
that agree with the shell's except for backslashes and line breaks, so run options may not hold those.

Files
-----
Every app has a job directory (run option ``job_dir``, default ``$TSM_HOME/slurm/jobs/<app>-<time>-<rand>``,
made 0700 at submission; it must be on a filesystem that the compute nodes share with the submit host)::

    app.json            the AppDef and submission details (describe rebuilds the app from it)
    job.sbatch          the script as submitted
    batch.out           output of the batch script itself (Slurm's own messages land here)
    exit                the batch script's exit code, written as it ends
    <role>/<k>.stdout   replica k's standard output (``srun --output=<role>/%t.stdout``)
    <role>/<k>.stderr   replica k's standard error
    <role>/<k>.status   ``running <host> <time> <attempt>``, then ``exited <code> <time> <attempt> <signal> <host>``

The job runs with ``umask 077``, so what it writes is readable by its owner only. The job's working
directory (``--chdir``) is the job directory, so any process finds it again from ``squeue``/``sacct``
(``WorkDir``); a copy of the path is also kept in ``$TSM_HOME/slurm/index/<job id>``. Replicas run in the
role's image when it is a directory path, else in the directory ``tsm run`` was called from.

Sweeps (``SweepNative``): a sweep of single-role trials is one job array, ``--array=0-(N-1)%P``. Each trial
keeps a job directory of its own as above (its ``job.sbatch`` names the app ``<array id>_<task>``); the
array's script is in ``<trial 0's job dir>-array/``, whose entries ``0``, ``1``, ... link to the trials'
directories, and task *i* runs trial *i*'s script there. A trial's app id is ``<array id>_<task>``, as squeue
and sacct show it (the tasks not started yet are one row, ``<array id>_[3-19%4]``, read as one record each).

Status
------
States come from ``squeue --json`` while Slurm remembers the job and from ``sacct --json`` after (both
parsed for Slurm 22.05, whose ``squeue --json`` ignores ``-j`` and gives ``job_state`` as a string, and for
newer versions that give a list of state flags and ``{"set", "number"}`` objects; a Slurm without JSON
output is read from ``squeue -O``/``sacct -P`` text columns instead). Slurm states map as:
PENDING, REQUEUED, SUSPENDED, CONFIGURING -> PENDING; RUNNING, COMPLETING -> RUNNING; COMPLETED ->
SUCCEEDED; CANCELLED -> CANCELLED; FAILED, TIMEOUT, NODE_FAIL, PREEMPTED, OUT_OF_MEMORY, BOOT_FAIL,
DEADLINE -> FAILED, with the Slurm state and reason in the message. Per replica, the wrapper's status
file refines the role's state with the replica's own host and exit code.

One process-wide :class:`SlurmQueries` (a :class:`~tsm.schedulers.common.watcher.StatusWatcher`) answers
every ``describe``: one ``squeue`` call (at most one a second) serves every app, and ``sacct`` is asked,
once for all the apps that need it, only about jobs ``squeue`` no longer lists. Each app's job directory
and ``app.json`` (written once, before ``sbatch``) are read once per process and kept. :meth:`SlurmScheduler.wait` backs off from 0.5 s to 5 s between polls, so
waiting on a hundred apps in threads costs about one ``squeue`` a second in all.

``tsm top`` and ``tsm serve`` see every Slurm app of a tick through one ``view_snapshot`` call
(:mod:`.view`): one ``squeue``, one ``sstat`` for the usage of the running jobs' steps, and ``sacct`` only
for jobs the controller forgot.

``cancel`` runs ``scancel`` and returns once Slurm reports the job ended (CANCELLED, or whatever ended it
first; at most ``SlurmScheduler.cancel_timeout`` seconds, 120 by default), so ``tsm cancel`` and Ctrl-C of
an attached run print the terminal state, not RUNNING/COMPLETING. An app that asked for a warning
(``warn_signal``) is warned first: ``scancel --batch --signal`` to its batch shell, which forwards it to every
task, then up to ``warn_before`` (less once the job ended) before the ``scancel``.

Long runs (issue 25; the script's part is described in :mod:`.script`): the warning reaches the batch shell
before the time limit, at a preemption (on clusters with ``SlurmctldParameters=preempt_send_user_signal``,
as ``scripts/slurm-up`` configures) and from ``cancel``, and is forwarded once to every task. Restarts the
cluster decides are preemptions (``max_preemptions``); a restart after ``NODE_FAIL``/``BOOT_FAIL``, or after
the kernel's OOM killer ended a replica on a node it shares, keeps the app off that node (``excluded`` below);
``stall_timeout`` is watched by the batch shell. More files of the job directory::

    failures, moves     the script's own requeues: for the app's failures, and moves off a failed node
    requeue_cause       why the script requeued (the next attempt's TSM_LAST_EXIT), then last_exit
    excluded            ``node3 NODE_FAIL (reason: ...)``: nodes kept out of later attempts (describe says so)
    oom_nodes           ``node3 OOM (the kernel's OOM killer ended w/0)``: written by the replicas' wrapper when
                        a task ended by SIGKILL (not tsm's) while the node's ``/proc/vmstat`` ``oom_kill`` rose
                        and no memory limit of the job's own was hit; ``node3 GPU (w/0: nvidia-smi: ...)`` when
                        a task with GPUs failed while ``nvidia-smi`` could not reach a GPU of the node or its
                        uncorrectable ECC errors rose; read into ``excluded`` at the restart
    node_error          why the script could not keep the app off a failed node (Slurm refused the
                        exclusion, or the moves ran past ``max_preemptions``): the app fails, describe says why
    stalled             ``<role>/<k> stalled for 15m, last line: '...'``, from the stall watcher; a stalled
                        attempt fails (exit 1) even when its tasks exit 0 on the warning
    cancel              written by ``cancel`` before it warns: the warning is a cancel's (removed when no
                        scancel follows, and as each attempt starts)
    stopping            the attempt whose tasks the batch shell is stopping (a role failed, or stalled): a
                        task that dies of that SIGTERM before its wrapper gets its own is recorded as stopped

Not carried over: ``min_replicas`` (Slurm allocates all ``num_replicas`` nodes; torchrun's own
``--nnodes min:max`` still works inside them), ``port_map`` (nodes of one job reach each other freely) and
``mounts`` (refused: replicas see the nodes' filesystems). Resource ``capabilities`` may set a role's own
``partition`` or ``constraint``.

Retries
-------
A role with ``max_retries`` > 0 makes the job requeueable (``--requeue``). When a replica fails, the batch
script compares ``SLURM_RESTART_COUNT`` with that role's ``max_retries`` and, while retries are left,
runs ``scontrol requeue`` on its own job: Slurm starts the whole job again (every role: the
``APPLICATION`` retry policy; ``ROLE`` and ``REPLICA`` are treated the same way) after the cluster's
requeue delay (``AuthInfo=cred_expire``, 120 s by default). ``num_restarts`` is Slurm's restart count.
Logs of every attempt are kept: files are opened in append mode.

Over SSH
--------
With ``-c ssh=[user@]host[:port]`` (and ``ssh_options``, ``remote_home``) every Slurm command runs on that
login node over one multiplexed OpenSSH connection (:mod:`tsm.schedulers.common.ssh`); the job directory and
logs are on the cluster, the app's record here, and the app id is ``<host slug>-<job id>``. Submission is
idempotent, logs are read (and followed, resuming from a byte offset) over the connection, and a workspace
snapshot is shipped by content: see :mod:`.remote` (the connection's side), :mod:`.remote_apps` (the
scheduler's operations on remote apps) and :mod:`.workspace_ssh`.

Logs
----
``log_iter`` reads the replica's files in the job directory. Slurm keeps stdout and stderr in separate
files without timestamps, so ``Stream.COMBINED`` (the default) gives stdout's lines, then stderr's (while
following, lines come as they appear in either), and ``since``/``until`` select whole files: a file last
written before ``since``, or a replica started after ``until``, gives no lines. ``should_tail`` follows
the files until the replica has exited for good (no retry left) or the job has ended.
"""

from __future__ import annotations

import importlib
from typing import Any

TYPE_CHECKING = False
if TYPE_CHECKING:
    from tsm.schedulers.slurm.cli import command_counts, parse_version, slurm_version
    from tsm.schedulers.slurm.parse import (
        SACCT_TEXT_FIELDS,
        SQUEUE_TEXT_ARGS,
        SQUEUE_TEXT_FIELDS,
        ReplicaFile,
        SlurmJob,
        expand_hostlist,
        parse_sacct_json,
        parse_sacct_text,
        parse_squeue_json,
        parse_squeue_text,
        read_status,
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
    "SACCT_TEXT_FIELDS": "parse", "SQUEUE_TEXT_ARGS": "parse", "SQUEUE_TEXT_FIELDS": "parse",
    "ReplicaFile": "parse", "SlurmJob": "parse", "expand_hostlist": "parse", "parse_sacct_json": "parse",
    "parse_sacct_text": "parse", "parse_squeue_json": "parse", "parse_squeue_text": "parse",
    "read_status": "parse", "slurm_state": "parse",
    "SlurmQueries": "queries", "queries": "queries",
    "SlurmScheduler": "scheduler",
    "GPUS_PER_TASK_SINCE": "script", "REPLICA_WRAPPER": "script", "SlurmBatchRequest": "script",
    "SlurmOptions": "script", "build_script": "script",
}  # fmt: skip

__all__ = [
    "GPUS_PER_TASK_SINCE",
    "REPLICA_WRAPPER",
    "ReplicaFile",
    "SACCT_TEXT_FIELDS",
    "SQUEUE_TEXT_ARGS",
    "SQUEUE_TEXT_FIELDS",
    "SlurmBatchRequest",
    "SlurmJob",
    "SlurmOptions",
    "SlurmQueries",
    "SlurmScheduler",
    "build_script",
    "command_counts",
    "create_scheduler",
    "expand_hostlist",
    "parse_sacct_json",
    "parse_sacct_text",
    "parse_squeue_json",
    "parse_squeue_text",
    "parse_version",
    "queries",
    "read_status",
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
