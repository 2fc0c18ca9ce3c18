"""The Slurm scheduler: an app becomes one ``sbatch`` heterogeneous job, one component per role.

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
``slurm_version`` overrides it). The body starts one ``srun --het-group=i`` per role in the background
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
so ``python`` is the one first on the submitter's ``PATH``: activate the venv before submitting.

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

One process-wide :class:`SlurmQueries` answers every ``describe``: one ``squeue`` call (at most one a
second) serves every app, and ``sacct`` is asked, once for all the apps that need it, only about jobs
``squeue`` no longer lists. :meth:`SlurmScheduler.wait` backs off from 0.5 s to 5 s between polls, so
waiting on a hundred apps in threads costs about one ``squeue`` a second in all.

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

Logs
----
``log_iter`` reads the replica's files in the job directory. Slurm keeps stdout and stderr in separate
files without timestamps, so ``Stream.COMBINED`` (the default) gives stdout's lines, then stderr's (while
following, lines come as they appear in either), and ``since``/``until`` select whole files: a file last
written before ``since``, or a replica started after ``until``, gives no lines. ``should_tail`` follows
the files until the replica has exited for good (no retry left) or the job has ended.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shlex
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from tsm.errors import (
    InvalidAppError,
    InvalidRunOptionError,
    SchedulerError,
    SchedulerUnavailableError,
    SubmissionError,
    UnknownAppError,
)
from tsm.schedulers.api import (
    DescribeAppResponse,
    ListAppResponse,
    Scheduler,
    Stream,
    filter_regex,
    split_lines,
)
from tsm.specs.api import AppDef, AppDryRunInfo, AppState, ReplicaStatus, Role, RoleStatus, macros
from tsm.specs.runopts import CfgVal, runopts
from tsm.specs.validate import check_exec_size

__all__ = [
    "SlurmBatchRequest",
    "SlurmJob",
    "SlurmQueries",
    "SlurmScheduler",
    "command_counts",
    "create_scheduler",
    "parse_sacct_json",
    "parse_sacct_text",
    "parse_squeue_json",
    "parse_squeue_text",
    "slurm_state",
]

#: First Slurm version whose GPU request is ``--gpus-per-task`` (before it: ``--gpus-per-node``).
GPUS_PER_TASK_SINCE = (23, 2)

_INSTALL_HINT = (
    "install the Slurm client tools and run tsm on a host of the cluster "
    "(Debian/Ubuntu: apt-get install slurm-client; for a local test cluster run scripts/slurm-up as root)"
)

# -- running Slurm commands ---------------------------------------------------------------------------

_counts: Counter[str] = Counter()
_counts_lock = threading.Lock()


def command_counts() -> dict[str, int]:
    """How many times this process ran each Slurm command (``{"squeue": 12, ...}``), for benchmarks."""
    with _counts_lock:
        return dict(_counts)


def _run(
    args: list[str], *, timeout: float = 60.0, cwd: str | None = None, umask: int = -1
) -> subprocess.CompletedProcess[str]:
    """Run one Slurm command (an argument list, never a shell) and return it finished, whatever its code.

    A missing command is :class:`SchedulerUnavailableError` saying what to install; a hang is a
    :class:`SchedulerError`.
    """
    with _counts_lock:
        _counts[os.path.basename(args[0])] += 1
    try:
        return subprocess.run(
            args,
            capture_output=True,
            text=True,
            errors="surrogateescape",
            timeout=timeout,
            cwd=cwd,
            check=False,
            umask=umask,
        )
    except FileNotFoundError as e:
        raise SchedulerUnavailableError(f"Slurm's '{args[0]}' command was not found: {_INSTALL_HINT}") from e
    except subprocess.TimeoutExpired as e:
        raise SchedulerError(
            f"'{' '.join(args[:2])}' did not answer within {timeout:g}s: is the Slurm controller (slurmctld) up?"
        ) from e


def _unreachable(proc: subprocess.CompletedProcess[str]) -> bool:
    text = proc.stderr.lower()
    return "unable to contact slurm controller" in text or "connection refused" in text


def _no_json(proc: subprocess.CompletedProcess[str]) -> bool:
    """True when a failed ``--json`` call says this Slurm cannot write JSON."""
    err = proc.stderr.lower()
    return "json" in err or "unrecognized option" in err or "invalid option" in err or "unknown option" in err


def _check(proc: subprocess.CompletedProcess[str], what: str) -> str:
    """stdout of a finished command; a failure says what failed and Slurm's own words."""
    if proc.returncode == 0:
        return proc.stdout
    err = proc.stderr.strip() or proc.stdout.strip() or f"exit code {proc.returncode}"
    if _unreachable(proc):
        raise SchedulerUnavailableError(
            f"{what}: the Slurm controller cannot be reached ({err}); start slurmctld "
            "(scripts/slurm-up for the local test cluster)"
        )
    raise SchedulerError(f"{what} failed: {err}")


_version_lock = threading.Lock()
_version: tuple[int, int] | None = None


def parse_version(text: str) -> tuple[int, int]:
    """``(major, minor)`` from ``sbatch --version`` output such as ``slurm-wlm 22.05.8`` or ``slurm 23.11.1``."""
    m = re.search(r"(\d+)\.(\d+)", text)
    if not m:
        raise SchedulerError(f"cannot read a Slurm version from {text.strip()!r}")
    return int(m.group(1)), int(m.group(2))


def slurm_version() -> tuple[int, int]:
    """The Slurm version of this host's ``sbatch``, asked once per process and cached."""
    global _version
    with _version_lock:
        if _version is None:
            _version = parse_version(_check(_run(["sbatch", "--version"], timeout=20), "sbatch --version"))
        return _version


# -- parsing squeue / sacct ------------------------------------------------------------------------------


def _num(value: Any) -> int | None:
    """An integer from Slurm JSON: a plain number (22.05) or ``{"set": true, "number": n}`` (23.02+)."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value)
    if isinstance(value, dict):
        if not value.get("set", True) or value.get("infinite"):
            return None
        return _num(value.get("number"))
    return None


def _states(value: Any) -> list[str]:
    """Slurm state names from a string (22.05: ``"RUNNING"``, ``"CANCELLED by 0"``) or a list (newer)."""
    if isinstance(value, dict):  # sacct: {"current": ..., "reason": ...}
        value = value.get("current")
    if isinstance(value, str):
        return [value.split()[0].upper()] if value.strip() else []
    if isinstance(value, list):
        return [str(v).split()[0].upper() for v in value if str(v).strip()]
    return []


_PENDING = {
    "PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "SUSPENDED", "CONFIGURING",
    "POWER_UP_NODE", "SPECIAL_EXIT_HOLD",
}  # fmt: skip
_RUNNING = {"RUNNING", "COMPLETING", "STAGE_OUT", "SIGNALING", "RESIZING", "STOPPED", "UPDATE_DB"}
_FAILED = {
    "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE",
    "SPECIAL_EXIT", "LAUNCH_FAILED",
}  # fmt: skip
_CANCELLED = {"CANCELLED", "REVOKED"}
_WAITING_REASONS = {
    "BeginTime", "Resources", "Priority", "Dependency", "ReqNodeNotAvail", "JobHeldUser", "JobHeldAdmin",
    "None", "Reservation", "QOSMaxJobsPerUserLimit", "AssocMaxJobsLimit", "PartitionTimeLimit",
}  # fmt: skip
# Flags that override the base state: the job is not where its base state says yet.
_FLAG_STATES = {
    "REQUEUED": AppState.PENDING, "REQUEUE_HOLD": AppState.PENDING, "REQUEUE_FED": AppState.PENDING,
    "CONFIGURING": AppState.PENDING, "COMPLETING": AppState.RUNNING, "STAGE_OUT": AppState.RUNNING,
    "SIGNALING": AppState.RUNNING, "RESIZING": AppState.RUNNING, "UPDATE_DB": AppState.RUNNING,
}  # fmt: skip


def slurm_state(names: str | Iterable[str]) -> AppState:
    """Map a Slurm job state (a name, or the list of names newer Slurm gives) to an :class:`AppState`."""
    items = _states(names) if isinstance(names, str) else [str(n).split()[0].upper() for n in names if str(n)]
    for name in items[1:]:  # flags after the base state
        if name in _FLAG_STATES:
            return _FLAG_STATES[name]
    for name in items:
        if name == "COMPLETED":
            return AppState.SUCCEEDED
        if name in _CANCELLED:
            return AppState.CANCELLED
        if name in _FAILED:
            return AppState.FAILED
        if name in _RUNNING:
            return AppState.RUNNING
        if name in _PENDING:
            return AppState.PENDING
    return AppState.UNKNOWN


@dataclass
class SlurmJob:
    """One job record from ``squeue``/``sacct``: a het-job component (one role of an app) or a plain job.

    ``app_id`` is the het-job leader's id (the job's own id when it is not heterogeneous); ``offset`` is the
    component's index, i.e. the role's index in the app.
    """

    job_id: str
    app_id: str
    offset: int
    name: str
    states: list[str]
    reason: str = ""
    description: str = ""
    exit_code: int | None = None
    signal: int | None = None
    nodes: str = ""
    num_tasks: int | None = None
    restarts: int = 0
    submit_time: float | None = None
    start_time: float | None = None
    end_time: float | None = None
    work_dir: str = ""
    user: str = ""
    source: str = "squeue"

    @property
    def state(self) -> AppState:
        """The record's state as an :class:`AppState`."""
        return slurm_state(self.states)

    @property
    def state_name(self) -> str:
        """The Slurm state as people read it (``RUNNING``, ``PENDING,REQUEUED``)."""
        return ",".join(self.states) or "UNKNOWN"


def _time(value: Any) -> float | None:
    n = _num(value)
    return float(n) if n else None


def _squeue_exit(value: Any) -> tuple[int | None, int | None]:
    """squeue's ``exit_code``: a raw wait status (22.05) or ``{"status", "return_code", "signal"}`` (newer)."""
    if isinstance(value, dict) and ("return_code" in value or "status" in value):
        return _sacct_exit(value)
    raw = _num(value)
    if raw is None:
        return None, None
    if raw & 0x7F:
        return None, raw & 0x7F
    return (raw >> 8) & 0xFF, None


def _sacct_exit(value: Any) -> tuple[int | None, int | None]:
    """sacct's ``exit_code``: ``{"status": "SUCCESS"|"FAILED"|"SIGNALED", "return_code": n, "signal": {...}}``."""
    if not isinstance(value, dict):
        return _num(value), None
    sig = value.get("signal")
    signo = _num(sig.get("id") if isinstance(sig, dict) else sig)
    status = value.get("status")
    status_names = [str(s) for s in status] if isinstance(status, list) else [str(status or "")]
    if "SIGNALED" in status_names and signo:
        return None, signo
    return _num(value.get("return_code")), (signo or None)


def parse_squeue_json(text: str) -> dict[str, list[SlurmJob]]:
    """Parse ``squeue --json`` into ``{app id: [component records sorted by offset]}``.

    Every job in the output is kept (22.05 ignores ``-j``): callers pick theirs by app id.
    """
    data = json.loads(text)
    out: dict[str, list[SlurmJob]] = {}
    for j in data.get("jobs", []):
        job_id = _num(j.get("job_id"))
        if job_id is None:
            continue
        het_id = _num(j.get("het_job_id")) or 0
        offset = _num(j.get("het_job_offset")) or 0
        code, sig = _squeue_exit(j.get("exit_code"))
        rec = SlurmJob(
            job_id=str(job_id),
            app_id=str(het_id or job_id),
            offset=offset if het_id else 0,
            name=str(j.get("name") or ""),
            states=_states(j.get("job_state")),
            reason=str(j.get("state_reason") or ""),
            description=str(j.get("state_description") or ""),
            exit_code=code,
            signal=sig,
            nodes=str(j.get("nodes") or ""),
            num_tasks=_num(j.get("tasks")) if "tasks" in j else _num(j.get("num_tasks")),
            restarts=_num(j.get("restart_cnt")) or 0,
            submit_time=_time(j.get("submit_time")),
            start_time=_time(j.get("start_time")),
            end_time=_time(j.get("end_time")),
            work_dir=str(j.get("current_working_directory") or ""),
            user=str(j.get("user_name") or ""),
            source="squeue",
        )
        out.setdefault(rec.app_id, []).append(rec)
    for recs in out.values():
        recs.sort(key=lambda r: r.offset)
    return out


def parse_sacct_json(text: str) -> dict[str, list[SlurmJob]]:
    """Parse ``sacct --json`` (with or without ``-D``) into ``{app id: [latest record per component]}``.

    With ``-D`` a requeued job has a ``REQUEUED`` record per earlier run; those are counted into
    ``restarts`` of the current record and dropped.
    """
    data = json.loads(text)
    runs: dict[tuple[str, int], list[SlurmJob]] = {}
    for j in data.get("jobs", []):
        job_id = _num(j.get("job_id"))
        if job_id is None:
            continue
        het = j.get("het") or {}
        het_id = _num(het.get("job_id")) or 0
        offset = _num(het.get("job_offset")) or 0
        t = j.get("time") or {}
        state = j.get("state") or {}
        code, sig = _sacct_exit(j.get("exit_code"))
        nodes = j.get("nodes")
        required = j.get("required") or {}
        rec = SlurmJob(
            job_id=str(job_id),
            app_id=str(het_id or job_id),
            offset=offset if het_id else 0,
            name=str(j.get("name") or ""),
            states=_states(state),
            reason=str(state.get("reason") or "") if isinstance(state, dict) else "",
            exit_code=code,
            signal=sig,
            nodes=str(nodes or "") if not isinstance(nodes, dict) else str(nodes.get("range") or ""),
            num_tasks=_num(required.get("tasks")) if isinstance(required, dict) else None,
            submit_time=_time(t.get("submission")),
            start_time=_time(t.get("start")),
            end_time=_time(t.get("end")),
            work_dir=str(j.get("working_directory") or ""),
            user=str(j.get("user") or ""),
            source="sacct",
        )
        runs.setdefault((rec.app_id, rec.offset), []).append(rec)
    return _latest_runs(runs)


#: ``squeue -O`` fields for Slurm without JSON output (before 21.08, or built without the JSON plugin);
#: each is followed by ``|``, the free-text WorkDir last.
SQUEUE_TEXT_FIELDS = [
    "JobID", "HetJobID", "HetJobOffset", "State", "Reason", "NodeList", "NumTasks", "RestartCnt",
    "SubmitTime", "StartTime", "EndTime", "UserName", "Name", "WorkDir",
]  # fmt: skip
SQUEUE_TEXT_ARGS = ["squeue", "--me", "-t", "all", "-h", "-O", ",".join(f + ":|" for f in SQUEUE_TEXT_FIELDS)]
#: ``sacct -P`` fields for the same case.
SACCT_TEXT_FIELDS = ["JobIDRaw", "JobID", "State", "ExitCode", "Reason", "NodeList", "NTasks", "Submit", "Start",
                     "End", "User", "JobName", "WorkDir"]  # fmt: skip


def _text_time(value: str) -> float | None:
    """A Slurm text timestamp (``2026-11-21T15:38:30``, local time) as epoch seconds; None for Unknown/N/A."""
    try:
        return datetime.fromisoformat(value.strip()).timestamp()
    except ValueError:
        return None


def _text_int(value: str) -> int | None:
    value = value.strip()
    return int(value) if value.isdigit() else None


def parse_squeue_text(text: str) -> dict[str, list[SlurmJob]]:
    """Parse the output of :data:`SQUEUE_TEXT_ARGS` like :func:`parse_squeue_json` (no exit codes there)."""
    out: dict[str, list[SlurmJob]] = {}
    n = len(SQUEUE_TEXT_FIELDS)
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.removesuffix("|").split("|", n - 1)
        if len(parts) < n:
            continue
        f = dict(zip(SQUEUE_TEXT_FIELDS, parts, strict=True))
        job_id = f["JobID"].strip()
        if not job_id.isdigit():
            continue
        het_id = _text_int(f["HetJobID"]) or 0
        rec = SlurmJob(
            job_id=job_id,
            app_id=str(het_id or job_id),
            offset=(_text_int(f["HetJobOffset"]) or 0) if het_id else 0,
            name=f["Name"],
            states=_states(f["State"].strip()),
            reason=f["Reason"].strip(),
            nodes=f["NodeList"].strip() if f["NodeList"].strip() not in ("", "(null)") else "",
            num_tasks=_text_int(f["NumTasks"]),
            restarts=_text_int(f["RestartCnt"]) or 0,
            submit_time=_text_time(f["SubmitTime"]),
            start_time=_text_time(f["StartTime"]),
            end_time=_text_time(f["EndTime"]),
            work_dir=f["WorkDir"],
            user=f["UserName"].strip(),
            source="squeue",
        )
        out.setdefault(rec.app_id, []).append(rec)
    for recs in out.values():
        recs.sort(key=lambda r: r.offset)
    return out


def parse_sacct_text(text: str) -> dict[str, list[SlurmJob]]:
    """Parse ``sacct -P -n -X -D -o <SACCT_TEXT_FIELDS>`` like :func:`parse_sacct_json`."""
    runs: dict[tuple[str, int], list[SlurmJob]] = {}
    n = len(SACCT_TEXT_FIELDS)
    for line in text.splitlines():
        parts = line.split("|", n - 1)
        if len(parts) < n:
            continue
        f = dict(zip(SACCT_TEXT_FIELDS, parts, strict=True))
        raw, shown = f["JobIDRaw"].strip(), f["JobID"].strip()
        if not raw.isdigit() or "." in shown:
            continue  # steps (123.batch, 123+0.1) are not jobs
        leader, plus, off = shown.partition("+")
        code, _, sig = f["ExitCode"].partition(":")
        rec = SlurmJob(
            job_id=raw,
            app_id=leader if plus else raw,
            offset=int(off) if plus and off.isdigit() else 0,
            name=f["JobName"],
            states=_states(f["State"].strip()),
            reason=f["Reason"].strip(),
            exit_code=_text_int(code),
            signal=_text_int(sig) or None,
            nodes=f["NodeList"].strip() if f["NodeList"].strip() not in ("", "None assigned") else "",
            num_tasks=_text_int(f["NTasks"]),
            submit_time=_text_time(f["Submit"]),
            start_time=_text_time(f["Start"]),
            end_time=_text_time(f["End"]),
            work_dir=f["WorkDir"],
            user=f["User"].strip(),
            source="sacct",
        )
        runs.setdefault((rec.app_id, rec.offset), []).append(rec)
    return _latest_runs(runs)


def _latest_runs(runs: dict[tuple[str, int], list[SlurmJob]]) -> dict[str, list[SlurmJob]]:
    """Keep each component's latest run; earlier runs (REQUEUED) count as its restarts."""
    out: dict[str, list[SlurmJob]] = {}
    for (app_id, _), recs in runs.items():
        current = [r for r in recs if "REQUEUED" not in r.states] or recs
        rec = max(current, key=lambda r: (r.submit_time or 0, r.start_time or 0))
        rec.restarts = sum(1 for r in recs if "REQUEUED" in r.states)
        out.setdefault(app_id, []).append(rec)
    for recs in out.values():
        recs.sort(key=lambda r: r.offset)
    return out


def expand_hostlist(expr: str) -> list[str]:
    """Expand a Slurm host list such as ``node[1-3,7],gpu[01-02]-ib`` to host names, in order."""
    parts: list[str] = []
    depth, start = 0, 0
    for i, ch in enumerate(expr):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(expr[start:i])
            start = i + 1
    parts.append(expr[start:])
    hosts: list[str] = []
    for part in filter(None, (p.strip() for p in parts)):
        hosts.extend(_expand_one(part))
    return hosts


def _expand_one(part: str) -> list[str]:
    m = re.match(r"^([^\[]*)\[([^\]]*)\](.*)$", part)
    if not m:
        return [part]
    prefix, ranges, rest = m.groups()
    tails = _expand_one(rest) if rest else [""]
    out: list[str] = []
    for rng in ranges.split(","):
        lo, sep, hi = rng.partition("-")
        if sep and lo.isdigit() and hi.isdigit():
            width = len(lo) if lo.startswith("0") else 0
            values = [str(v).zfill(width) for v in range(int(lo), int(hi) + 1)]
        else:
            values = [rng]
        out.extend(prefix + v + t for v in values for t in tails)
    return out


# -- the process-wide status batcher ------------------------------------------------------------------------


class SlurmQueries:
    """One process-wide, thread-safe view of the queue, so many ``describe`` calls share few Slurm calls.

    ``squeue --json`` lists every job the controller holds; one answer is reused by every caller for
    ``max_age`` seconds (default 1 s) and, while one thread asks Slurm, the others wait for its answer
    rather than ask again. Jobs the controller has forgotten are looked up with ``sacct --json -D``, all
    the ids wanted in the last minute in one call; ended jobs are cached for good, missing ones are asked
    again at most every 5 s.
    """

    def __init__(self, runner: Callable[[list[str]], subprocess.CompletedProcess[str]] | None = None) -> None:
        self._run = runner or _run
        self._lock = threading.Lock()
        self._squeue_at = float("-inf")
        self._squeue: dict[str, list[SlurmJob]] = {}
        self._final: dict[str, list[SlurmJob]] = {}
        self._sacct_at: dict[str, float] = {}
        self._sacct: dict[str, list[SlurmJob]] = {}
        self._wanted: dict[str, float] = {}
        self._submitted: dict[str, float] = {}
        self._squeue_began = float("-inf")
        self.sacct_available = True
        #: False once Slurm answered that it has no ``--json`` (before 21.08, or no JSON plugin).
        self.json = True

    def invalidate(self) -> None:
        """Forget the queue snapshot (after a cancel, so the next look is fresh)."""
        with self._lock:
            self._squeue_at = float("-inf")

    def submitted(self, app_id: str) -> None:
        """Note a job this process just submitted: a queue snapshot begun before now cannot show it."""
        with self._lock:
            self._submitted[app_id] = time.monotonic()
            self._squeue_at = float("-inf")

    def _refresh_squeue(self) -> None:
        self._squeue_began = time.monotonic()
        if self.json:
            proc = self._run(["squeue", "--json", "--me"])
            if proc.returncode == 0 or not _no_json(proc):
                self._squeue = parse_squeue_json(_check(proc, "squeue --json"))
                self._squeue_at = time.monotonic()
                return
            self.json = False  # this Slurm has no JSON output: read its text columns from now on
        proc = self._run(SQUEUE_TEXT_ARGS)
        self._squeue = parse_squeue_text(_check(proc, "squeue"))
        self._squeue_at = time.monotonic()

    def _run_sacct(self, args: list[str]) -> subprocess.CompletedProcess[str]:
        """Run sacct with JSON output, or with ``-P`` text columns when this Slurm has no JSON."""
        if self.json:
            proc = self._run(["sacct", "--json", *args])
            if proc.returncode == 0 or not _no_json(proc):
                return proc
            self.json = False
        fields = ",".join(SACCT_TEXT_FIELDS)
        return self._run(["sacct", "-P", "-n", "-X", "-o", fields, *args])

    def _parse_sacct(self, text: str) -> dict[str, list[SlurmJob]]:
        return parse_sacct_json(text) if self.json else parse_sacct_text(text)

    def _refresh_sacct(self, ids: list[str]) -> None:
        if not ids or not self.sacct_available:
            return
        now = time.monotonic()
        for i in ids:
            self._sacct_at[i] = now
        for i in [i for i, t in self._wanted.items() if now - t > 60]:
            del self._wanted[i]  # nobody asked for a minute
        proc = self._run_sacct(["-D", "-j", ",".join(sorted(ids, key=_id_key))])
        if proc.returncode != 0:
            if "accounting storage is disabled" in proc.stderr.lower() or "slurmdbd" in proc.stderr.lower():
                self.sacct_available = False  # no accounting: squeue and the job directory are all there is
                return
            _check(proc, "sacct")
        found = self._parse_sacct(proc.stdout)
        for app_id, recs in found.items():
            self._sacct[app_id] = recs
            if recs and recs[0].state.is_terminal and all(r.state.is_terminal for r in recs):
                self._final[app_id] = recs
                self._wanted.pop(app_id, None)

    def job(self, app_id: str, max_age: float = 1.0) -> list[SlurmJob] | None:
        """The component records of app ``app_id`` (sorted by offset), or None when Slurm does not know it."""
        with self._lock:
            if app_id in self._final:
                return self._final[app_id]
            now = time.monotonic()
            if now - self._squeue_at > max_age:
                self._refresh_squeue()
            recs = self._squeue.get(app_id)
            if not recs and self._submitted.get(app_id, float("-inf")) >= self._squeue_began:
                self._refresh_squeue()  # the snapshot began before this job was submitted
                recs = self._squeue.get(app_id)
            if recs:
                return recs
            self._wanted[app_id] = now
            last = self._sacct_at.get(app_id)
            if last is None or now - last > max(max_age, 5.0):
                ids = [i for i, t in self._wanted.items() if now - t < 60 and i not in self._squeue]
                ids = [i for i in ids if i == app_id or now - self._sacct_at.get(i, float("-inf")) > max_age]
                self._refresh_sacct(ids)
            return self._final.get(app_id) or self._sacct.get(app_id)

    def queue(self, max_age: float = 1.0) -> dict[str, list[SlurmJob]]:
        """Every job ``squeue`` shows for this user, by app id."""
        with self._lock:
            if time.monotonic() - self._squeue_at > max_age:
                self._refresh_squeue()
            return dict(self._squeue)

    def recent(self, since: str = "now-7days") -> dict[str, list[SlurmJob]]:
        """This user's jobs that ``sacct`` recorded since ``since`` (empty without accounting)."""
        if not self.sacct_available:
            return {}
        proc = self._run_sacct(["-S", since])
        if proc.returncode != 0:
            return {}
        return self._parse_sacct(proc.stdout)


def _id_key(app_id: str) -> tuple[int, str]:
    return (int(app_id), "") if app_id.isdigit() else (0, app_id)


_queries: SlurmQueries | None = None
_queries_lock = threading.Lock()


def queries() -> SlurmQueries:
    """The process-wide :class:`SlurmQueries`."""
    global _queries
    with _queries_lock:
        if _queries is None:
            _queries = SlurmQueries()
        return _queries


# -- building the request --------------------------------------------------------------------------------


@dataclass
class SlurmBatchRequest:
    """What :meth:`SlurmScheduler.schedule` submits: the batch script and where the job's files go.

    ``script`` is passed to ``sbatch`` unchanged (saved as ``job_dir/job.sbatch``); ``app_json`` is saved as
    ``job_dir/app.json``; ``roles`` are the role names in het-group order.
    """

    script: str
    job_dir: str
    app_name: str
    roles: list[str]
    app_json: str
    sbatch_args: list[str] = field(default_factory=lambda: ["--parsable"])

    def __str__(self) -> str:
        return self.script


def _format_request(request: Any) -> str:
    return request.script if isinstance(request, SlurmBatchRequest) else repr(request)


_FORBIDDEN_IN_DIRECTIVE = re.compile(r"[\\\n\r\x00]")


def _directive(option: str, value: str | int | None = None) -> str:
    """One ``#SBATCH`` line, its value shell-quoted (sbatch reads the same quotes; no backslash or newline)."""
    if value is None:
        return f"#SBATCH {option}"
    text = str(value)
    if _FORBIDDEN_IN_DIRECTIVE.search(text):
        raise InvalidRunOptionError(
            f"{option} value {text!r} holds a backslash or a line break, which sbatch cannot read in a script"
        )
    return f"#SBATCH {option}={shlex.quote(text)}"


#: The fixed program every task runs (bash -c "$_tsm_replica" tsm-replica ROLE N NENV K=V... CMD...).
#: It never contains a value of the app: those arrive as positional parameters.
REPLICA_WRAPPER = r"""role=$1 n=$2 nenv=$3
shift 3
export TSM_REPLICA_ID="${SLURM_PROCID:-0}" TSM_ROLE_NAME="$role" TSM_NUM_REPLICAS="$n"
status="$TSM_JOB_DIR/$role/$TSM_REPLICA_ID.status"
attempt="${SLURM_RESTART_COUNT:-0}"
host="${SLURMD_NODENAME:-$(hostname)}"
printf 'running %s %s %s\n' "$host" "$(date +%s)" "$attempt" >"$status"
tsm_sub() {
  REPLY=$1
  case $REPLY in *'${'*)
    REPLY=${REPLY//'${app_id}'/"$TSM_APP_ID"}
    REPLY=${REPLY//'${replica_id}'/"$TSM_REPLICA_ID"} ;;
  esac
}
odd=()
while [ "$nenv" -gt 0 ]; do
  kv=$1
  shift
  nenv=$((nenv - 1))
  tsm_sub "${kv#*=}"
  if [[ ${kv%%=*} =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]]; then
    export "${kv%%=*}=$REPLY"
  else
    odd+=("${kv%%=*}=$REPLY")
  fi
done
cmd=()
for a in "$@"; do
  tsm_sub "$a"
  cmd+=("$REPLY")
done
sig=-
trap 'sig=TERM' TERM
trap 'sig=INT' INT
if [ "${#odd[@]}" -gt 0 ]; then
  env -- "${odd[@]}" "${cmd[@]}"
else
  "${cmd[@]}"
fi
rc=$?
printf 'exited %s %s %s %s %s\n' "$rc" "$(date +%s)" "$attempt" "$sig" "$host" >"$status"
exit "$rc"
"""

#: The batch script's body after the per-role sruns: wait for all, stop the rest when one fails,
#: requeue while the failed role has retries left, record the exit code.
_WAIT_LOOP = r"""_tsm_failed=
_tsm_grace=
while :; do
  _tsm_alive=0
  for i in "${!_tsm_pid[@]}"; do
    [ -n "${_tsm_rc[$i]:-}" ] && continue
    if kill -0 "${_tsm_pid[$i]}" 2>/dev/null; then
      _tsm_alive=1
      continue
    fi
    wait "${_tsm_pid[$i]}"
    _tsm_rc[$i]=$?
    if [ "${_tsm_rc[$i]}" -ne 0 ] && [ -z "$_tsm_failed" ]; then
      _tsm_failed=$i
      echo "tsm: role ${_tsm_role[$i]} failed (srun exit code ${_tsm_rc[$i]}); stopping the other roles" >&2
      # SIGTERM to every step of every role (not to this script); after the grace period a SIGTERM to
      # each srun still running makes it kill its step outright.
      scancel --signal=TERM "$SLURM_JOB_ID" 2>/dev/null
      (sleep "$TSM_KILL_GRACE"; for p in "${_tsm_pid[@]}"; do kill -TERM "$p" 2>/dev/null; done) &
      _tsm_grace=$!
    fi
  done
  [ "$_tsm_alive" = 0 ] && break
  wait -n 2>/dev/null
done
[ -n "$_tsm_grace" ] && kill "$_tsm_grace" 2>/dev/null
if [ -z "$_tsm_failed" ]; then
  echo 0 >"$TSM_JOB_DIR/exit"
  exit 0
fi
_tsm_code=${_tsm_rc[$_tsm_failed]}
if [ "${SLURM_RESTART_COUNT:-0}" -lt "${_tsm_retries[$_tsm_failed]}" ]; then
  echo "tsm: requeueing (restart $((${SLURM_RESTART_COUNT:-0} + 1)) of ${_tsm_retries[$_tsm_failed]})" >&2
  echo requeued >"$TSM_JOB_DIR/exit"
  if scontrol requeue "$SLURM_JOB_ID"; then
    sleep 600 # Slurm ends this run of the job now
  fi
fi
echo "$_tsm_code" >"$TSM_JOB_DIR/exit"
exit "$_tsm_code"
"""


def shell_quote(value: str) -> str:
    """Quote ``value`` as one bash word: ``shlex.quote``, or ``$'...'`` when it holds a carriage return.

    sbatch refuses a script with a CR-LF anywhere ("DOS line breaks"), so such values are written with
    bash's ANSI-C quoting, every control character as ``\\xHH``; bash turns them back into the same bytes.
    """
    if "\r" not in value:
        return shlex.quote(value)
    out = []
    for ch in value:
        if ch in "\\'":
            out.append("\\" + ch)
        elif ord(ch) < 32 or ord(ch) == 127:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return "$'" + "".join(out) + "'"


_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _role_cwd(role: Role, submit_dir: str) -> str:
    """Where a role's replicas run: its image when that is a directory path, else the submit directory."""
    image = role.image
    if image and (image.startswith(("/", "./", "../", "~")) or image in (".", "..")):
        return os.path.abspath(os.path.expanduser(image))
    return submit_dir


def build_script(
    app: AppDef,
    cfg: Mapping[str, CfgVal],
    job_dir: str,
    submit_dir: str,
    version: tuple[int, int] | None,
) -> str:
    """The complete sbatch script for ``app`` (see the module docstring for its shape).

    ``version`` is the Slurm version that decides the GPU option; it may be None when no role wants GPUs.
    """
    pack = bool(cfg.get("pack_replicas"))
    lines = ["#!/bin/bash"]
    job_wide: list[str] = [
        _directive("--job-name", f"{app.name}.{app.roles[0].name}"),
        _directive("--chdir", job_dir),
        _directive("--output", f"{job_dir}/batch.out"),
        _directive("--open-mode", "append"),
        _directive("--export", "ALL"),
    ]
    retries = any(r.max_retries > 0 for r in app.roles)
    if cfg.get("requeue") is True or retries:
        job_wide.append(_directive("--requeue"))
    elif cfg.get("requeue") is False:
        job_wide.append(_directive("--no-requeue"))
    for key, opt in (("comment", "--comment"), ("mail_user", "--mail-user"), ("mail_type", "--mail-type")):
        if cfg.get(key):
            job_wide.append(_directive(opt, str(cfg[key])))
    for extra in _str_list(cfg.get("sbatch_args")):
        job_wide.append(_raw_directive(extra))

    for i, role in enumerate(app.roles):
        if i > 0:
            lines.append("#SBATCH hetjob")
            lines.append(_directive("--job-name", f"{app.name}.{role.name}"))
        else:
            lines.extend(job_wide)
        res = role.resource
        n = role.num_replicas
        if pack:
            lines.append(_directive("--ntasks", n))
        else:
            lines.append(_directive("--nodes", n))
            lines.append(_directive("--ntasks-per-node", 1))
        cpus = _whole(res.cpu)
        lines.append(_directive("--cpus-per-task", cpus))
        if res.memMB and res.memMB > 0:  # rounded up: "--mem=0" would mean all of a node's memory
            if pack:
                lines.append(_directive("--mem-per-cpu", f"{-(-math.ceil(res.memMB) // cpus)}M"))
            else:
                lines.append(_directive("--mem", f"{math.ceil(res.memMB)}M"))
        if res.gpu and res.gpu > 0:
            per_task = pack or version is None or version >= GPUS_PER_TASK_SINCE
            lines.append(_directive("--gpus-per-task" if per_task else "--gpus-per-node", int(res.gpu)))
        caps = res.capabilities or {}
        partition = caps.get("partition") or cfg.get("partition")
        constraint = caps.get("constraint") or cfg.get("constraint")
        for opt, value in (
            ("--partition", partition),
            ("--time", cfg.get("time")),
            ("--account", cfg.get("account")),
            ("--qos", cfg.get("qos")),
            ("--constraint", constraint),
            ("--reservation", cfg.get("reservation")),
            ("--nodelist", cfg.get("nodelist")),
            ("--exclude", cfg.get("exclude")),
        ):
            if value:
                lines.append(_directive(opt, str(value)))
        if cfg.get("exclusive"):
            lines.append(_directive("--exclusive"))

    q = shlex.quote
    roles_desc = ", ".join(f"{r.name} x{r.num_replicas}" for r in app.roles)
    lines += [
        "",
        f"# tsm app {app.name}: {roles_desc}. The job directory holds app.json, logs and replica status.",
        "umask 077",
        f"export TSM_JOB_DIR={q(job_dir)}",
        'export TSM_APP_ID="$SLURM_JOB_ID"',
        f"export TSM_KILL_GRACE={int(_kill_grace(cfg))}",
        'echo "${SLURM_RESTART_COUNT:-0}" >"$TSM_JOB_DIR/restarts"',
        'rm -f -- "$TSM_JOB_DIR/exit"',
        "# The first node of the first role, by a name that resolves (else by its address).",
        '_tsm_nodes="${SLURM_JOB_NODELIST_HET_GROUP_0:-$SLURM_JOB_NODELIST}"',
        'TSM_RANK0_HOST=$(scontrol show hostnames "$_tsm_nodes" | head -n 1)',
        'if ! getent hosts "$TSM_RANK0_HOST" >/dev/null 2>&1; then',
        '  _tsm_addr=$(scontrol show node "$TSM_RANK0_HOST" 2>/dev/null | sed -n "s/.*NodeAddr=\\([^ ]*\\).*/\\1/p" | head -n 1)',
        '  [ -n "$_tsm_addr" ] && TSM_RANK0_HOST=$_tsm_addr',
        "fi",
        "export TSM_RANK0_HOST",
        f"_tsm_replica={q(REPLICA_WRAPPER)}",
        "declare -a _tsm_pid _tsm_rc _tsm_role _tsm_retries",
    ]
    het = len(app.roles) > 1
    extra_srun = _str_list(cfg.get("srun_args"))
    for i, role in enumerate(app.roles):
        values = macros.Values(
            img_root=_role_cwd(role, submit_dir),
            app_id=macros.app_id,  # run time: the wrapper substitutes $SLURM_JOB_ID
            replica_id=macros.replica_id,  # run time: the wrapper substitutes the task's rank
        )
        r = values.apply(role)
        n = r.num_replicas
        cpus = _whole(r.resource.cpu)
        srun = ["srun"]
        if het:
            srun.append(f"--het-group={i}")
        srun += [f"--ntasks={n}"]
        if not pack:
            srun += [f"--nodes={n}", "--ntasks-per-node=1"]
        srun += [
            f"--cpus-per-task={cpus}",
            f"--job-name={app.name}.{r.name}",
            f"--chdir={values.img_root}",
            f"--output={job_dir}/{r.name}/%t.stdout",
            f"--error={job_dir}/{r.name}/%t.stderr",
            "--open-mode=append",
            "--kill-on-bad-exit=1",
            "--export=ALL",
            *extra_srun,
        ]
        env_pairs = [f"{k}={v}" for k, v in r.env.items()]
        argv = [*srun, "bash", "-c", "$_tsm_replica", "tsm-replica", r.name, str(n), str(len(env_pairs))]
        argv += [*env_pairs, r.entrypoint, *r.args]
        quoted = " ".join('"$_tsm_replica"' if a == "$_tsm_replica" else shell_quote(a) for a in argv)
        lines += [
            f"# role {i}: {r.name}, {n} replica(s)",
            f'mkdir -p -- "$TSM_JOB_DIR"/{q(r.name)}',
            f"_tsm_role[{i}]={q(r.name)}",
            f"_tsm_retries[{i}]={int(r.max_retries)}",
            f"{quoted} &",
            f"_tsm_pid[{i}]=$!",
        ]
    lines.append(_WAIT_LOOP.rstrip("\n"))
    return "\n".join(lines) + "\n"


def _whole(cpu: float) -> int:
    """CPUs per task: at least one, and never fewer than asked for (2.5 is 3)."""
    return max(1, math.ceil(cpu))


def _kill_grace(cfg: Mapping[str, CfgVal]) -> int:
    value = cfg.get("kill_grace")
    return 30 if not isinstance(value, int) or isinstance(value, bool) else value


def _str_list(value: CfgVal) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value] if value else []
    if isinstance(value, list):
        return [str(v) for v in value]
    raise InvalidRunOptionError(f"expected a list of strings, got {value!r}")


def _raw_directive(option: str) -> str:
    """An extra ``#SBATCH`` option given verbatim (``--signal=USR1@60``), quoted as one word."""
    if not option.startswith("-"):
        raise InvalidRunOptionError(f"sbatch_args entry {option!r} must be an option starting with '-'")
    if _FORBIDDEN_IN_DIRECTIVE.search(option):
        raise InvalidRunOptionError(f"sbatch_args entry {option!r} holds a backslash or a line break")
    return f"#SBATCH {shlex.quote(option)}"


def _default_job_dir(app_name: str) -> str:
    from tsm.store import tsm_home

    stamp = time.strftime("%Y%m%d-%H%M%S")
    return str(tsm_home() / "slurm" / "jobs" / f"{app_name}-{stamp}-{os.urandom(3).hex()}")


def _index_dir() -> Path:
    from tsm.store import tsm_home

    return tsm_home() / "slurm" / "index"


# -- job directory helpers ------------------------------------------------------------------------------


@dataclass
class ReplicaFile:
    """What a replica's status file says: running on a host, or exited with a code (and the signal seen)."""

    running: bool
    host: str = ""
    started: float | None = None
    exit_code: int | None = None
    ended: float | None = None
    attempt: int = 0
    signal: str = ""


def read_status(path: str | Path) -> ReplicaFile | None:
    """Parse a ``<role>/<k>.status`` file, or None when it is missing or unreadable."""
    try:
        text = Path(path).read_text(errors="replace").strip()
    except OSError:
        return None
    words = text.split()
    try:
        if words[:1] == ["running"] and len(words) >= 4:
            return ReplicaFile(True, host=words[1], started=float(words[2]), attempt=int(words[3]))
        if words[:1] == ["exited"] and len(words) >= 4:
            sig = words[4] if len(words) > 4 and words[4] != "-" else ""
            host = words[5] if len(words) > 5 else ""
            return ReplicaFile(
                False,
                host=host,
                exit_code=int(words[1]),
                ended=float(words[2]),
                attempt=int(words[3]),
                signal=sig,
            )
    except ValueError:
        return None
    return None


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


# -- the scheduler ------------------------------------------------------------------------------------------


class SlurmScheduler(Scheduler):
    """Runs apps as Slurm heterogeneous batch jobs; see the module docstring for the whole picture."""

    def __init__(
        self, session_name: str, backend: str = "slurm", queries_: SlurmQueries | None = None
    ) -> None:
        super().__init__(backend, session_name)
        self._queries = queries_

    @property
    def queries(self) -> SlurmQueries:
        """The status batcher this scheduler reads through (the process-wide one by default)."""
        return self._queries or queries()

    # -- run options --------------------------------------------------------------------------------------
    def run_opts(self) -> runopts:
        """The sbatch options tsm exposes, each applied to every role unless said otherwise."""
        opts = runopts()
        opts.add("partition", str, "partition (queue) to submit to; default: the cluster's default partition")
        opts.add("time", str, "time limit per job, as sbatch --time takes it: minutes, HH:MM:SS or D-HH:MM")
        opts.add("account", str, "account to charge (sbatch --account)")
        opts.add("qos", str, "quality of service (sbatch --qos)")
        opts.add("constraint", str, "node features required (sbatch --constraint), e.g. 'a100&ib'")
        opts.add("reservation", str, "reservation to run in (sbatch --reservation)")
        opts.add("nodelist", str, "nodes each role's allocation must include (sbatch --nodelist)")
        opts.add("exclude", str, "nodes never to use (sbatch --exclude), e.g. node[3-4]")
        opts.add(
            "exclusive",
            bool,
            "take whole nodes, sharing them with no other job (sbatch --exclusive)",
            default=False,
        )
        opts.add("comment", str, "free-text comment stored with the job (sbatch --comment)")
        opts.add("mail_user", str, "where Slurm mails job events (sbatch --mail-user)")
        opts.add("mail_type", str, "which events to mail: BEGIN, END, FAIL, ALL, ... (sbatch --mail-type)")
        opts.add(
            "requeue",
            bool,
            "let Slurm requeue the job after a node failure or preemption (--requeue/--no-requeue); "
            "default: the cluster's setting, and always on when a role has max_retries",
        )
        opts.add(
            "pack_replicas",
            bool,
            "run a role's replicas as tasks Slurm may pack onto shared nodes (--ntasks=N) instead of one "
            "node per replica (--nodes=N --ntasks-per-node=1)",
            default=False,
        )
        opts.add(
            "job_dir",
            str,
            "directory for the job's script, logs and status (made 0700; must be shared with the compute "
            "nodes); default $TSM_HOME/slurm/jobs/<app>-<time>-<random>",
        )
        opts.add(
            "kill_grace",
            int,
            "seconds the other roles get between SIGTERM and SIGKILL after a role fails",
            default=30,
        )
        opts.add(
            "sbatch_args",
            list[str],
            "extra sbatch options for the whole job, e.g. --signal=USR1@60,--nice=10",
        )
        opts.add("srun_args", list[str], "extra srun options for every role, e.g. --cpu-bind=cores")
        opts.add(
            "slurm_version",
            str,
            "assume this Slurm version (e.g. 23.02) instead of asking sbatch --version; decides the GPU option",
        )
        return opts

    # -- requests -----------------------------------------------------------------------------------------
    def _validate(self, app: AppDef, cfg: Mapping[str, CfgVal]) -> None:
        """Reject what Slurm cannot carry: mounts, odd env names with an '=' in the entrypoint, bad paths."""
        for role in app.roles:
            if role.mounts:
                raise InvalidAppError(
                    f"role '{role.name}': the slurm scheduler has no mounts; replicas see the nodes' own filesystems"
                )
            odd = [k for k in role.env if not _IDENT.match(k)]
            if odd and "=" in role.entrypoint:
                raise InvalidAppError(
                    f"role '{role.name}': env names {odd} are not shell names, so they are set with env(1), "
                    "which would read the entrypoint (it holds '=') as another variable"
                )
            for key in ("partition", "constraint"):
                value = (role.resource.capabilities or {}).get(key)
                if value is not None and not isinstance(value, str):
                    raise InvalidAppError(f"role '{role.name}': resource capability '{key}' must be a string")
            # Both programs the job starts per replica must fit ARG_MAX with the submitter's environment
            # (the job keeps it): bash, given the wrapper, the env pairs and the command as arguments, then
            # the command itself, given the env.
            env_pairs = [f"{k}={v}" for k, v in role.env.items()]
            wrapper = ["bash", "-c", REPLICA_WRAPPER, "tsm-replica", role.name, str(role.num_replicas), "0"]
            check_exec_size(f"role '{role.name}'", [*wrapper, *env_pairs, role.entrypoint, *role.args], os.environ)
            check_exec_size(f"role '{role.name}'", [role.entrypoint, *role.args], {**os.environ, **role.env})
        job_dir = cfg.get("job_dir")
        if job_dir is not None:
            text = str(job_dir)
            if not text or "%" in text or _FORBIDDEN_IN_DIRECTIVE.search(text):
                raise InvalidRunOptionError(
                    f"job_dir {text!r} must be a non-empty path without '%', backslashes or line breaks"
                )
        version = cfg.get("slurm_version")
        if version is not None:
            parse_version(str(version))
        grace = cfg.get("kill_grace")
        if isinstance(grace, int) and grace < 0:
            raise InvalidRunOptionError(f"kill_grace must be >= 0, got {grace}")

    def _submit_dryrun(self, app: AppDef, cfg: Mapping[str, CfgVal]) -> AppDryRunInfo:
        """Build the batch script; asks ``sbatch --version`` only when a role wants GPUs."""
        job_dir = os.path.abspath(os.path.expanduser(str(cfg.get("job_dir") or _default_job_dir(app.name))))
        if "%" in job_dir or _FORBIDDEN_IN_DIRECTIVE.search(job_dir):
            raise InvalidRunOptionError(f"job_dir {job_dir!r} must not hold '%', backslashes or line breaks")
        version: tuple[int, int] | None = None
        if cfg.get("slurm_version"):
            version = parse_version(str(cfg["slurm_version"]))
        elif any(r.resource.gpu and r.resource.gpu > 0 for r in app.roles):
            version = slurm_version()
        submit_dir = os.getcwd()
        script = build_script(app, cfg, job_dir, submit_dir, version)
        meta = {
            "scheduler": "slurm",
            "session": self.session_name,
            "submit_dir": submit_dir,
            "job_dir": job_dir,
            "app": app.to_dict(),
        }
        request = SlurmBatchRequest(
            script=script,
            job_dir=job_dir,
            app_name=app.name,
            roles=[r.name for r in app.roles],
            app_json=json.dumps(meta, indent=1, sort_keys=True),
        )
        return AppDryRunInfo(request=request, fmt=_format_request)

    def schedule(self, dryrun_info: AppDryRunInfo) -> str:
        """Make the job directory, save the script and app, ``sbatch`` the script unchanged; returns the job id."""
        req = dryrun_info.request
        if not isinstance(req, SlurmBatchRequest):
            raise SubmissionError(f"the slurm scheduler cannot submit a {type(req).__name__} request")
        job_dir = Path(req.job_dir)
        try:
            _make_private_dirs(job_dir)
            if (job_dir / "app.json").exists():
                raise SubmissionError(f"job_dir {job_dir} already holds an app: choose another directory")
            for role in req.roles:
                (job_dir / role).mkdir(mode=0o700, exist_ok=True)
            _write_private(job_dir / "app.json", req.app_json)
            _write_private(job_dir / "job.sbatch", req.script)
        except OSError as e:
            raise SubmissionError(f"cannot prepare the job directory {job_dir}: {e.strerror or e}") from e
        try:
            # umask 077: files Slurm creates for the job before its script runs (batch.out) are private too
            proc = _run(
                ["sbatch", *req.sbatch_args, str(job_dir / "job.sbatch")], cwd=str(job_dir), umask=0o077
            )
            if proc.returncode != 0:
                err = proc.stderr.strip() or proc.stdout.strip() or f"exit code {proc.returncode}"
                if _unreachable(proc):
                    raise SchedulerUnavailableError(f"sbatch: the Slurm controller cannot be reached ({err})")
                raise SubmissionError(f"sbatch refused the job: {err}")
            job_id = proc.stdout.strip().splitlines()[-1].split(";")[0].strip() if proc.stdout.strip() else ""
            if not job_id.isdigit():
                raise SubmissionError(
                    f"sbatch gave no job id: {proc.stdout.strip()!r} {proc.stderr.strip()!r}"
                )
        except BaseException:
            _remove_job_files(job_dir, req.roles)  # nothing was submitted: leave no half-made job behind
            raise
        try:
            _write_private(job_dir / "job_id", job_id + "\n")
            index = _index_dir()
            _make_private_dirs(index)
            _write_private(index / job_id, str(job_dir) + "\n")
        except OSError:
            pass  # the job's WorkDir still leads to the job directory
        self.queries.submitted(job_id)
        return job_id

    # -- queries ------------------------------------------------------------------------------------------
    @staticmethod
    def _indexed_job_dir(app_id: str) -> Path | None:
        """The job directory this ``$TSM_HOME`` recorded for ``app_id`` at submission, if any."""
        try:
            text = _read_text(_index_dir() / app_id) if re.fullmatch(r"\d+", app_id) else None
        except Exception:  # noqa: BLE001 - an unusable TSM_HOME only loses the index
            return None
        path = Path(text.strip()) if text and text.strip() else None
        return path if path is not None and (path / "app.json").is_file() else None

    def _job_dir(self, app_id: str, recs: list[SlurmJob] | None) -> Path | None:
        """The app's job directory: from this TSM_HOME's index, else from the job's WorkDir."""
        indexed = self._indexed_job_dir(app_id)
        if indexed is not None:
            return indexed
        for r in recs or []:
            if r.work_dir and (Path(r.work_dir) / "app.json").is_file():
                return Path(r.work_dir)
        return None

    def _load_app(self, job_dir: Path | None) -> AppDef | None:
        if job_dir is None:
            return None
        text = _read_text(job_dir / "app.json")
        if not text:
            return None
        try:
            return AppDef.from_dict(json.loads(text)["app"])
        except (ValueError, KeyError, TypeError):
            return None

    @staticmethod
    def _rebuild_app(recs: list[SlurmJob]) -> AppDef:
        """An app shaped like the job when its app.json is gone: roles named after the components."""
        app_name = recs[0].name.rsplit(".", 1)[0] if recs else "unknown"
        roles = []
        for r in recs:
            role_name = r.name.rsplit(".", 1)[-1] if "." in r.name else f"role{r.offset}"
            roles.append(Role(name=role_name, entrypoint="?", num_replicas=max(1, r.num_tasks or 1)))
        return AppDef(name=app_name or "unknown", roles=roles)

    def describe(self, app_id: str, max_age: float = 1.0) -> DescribeAppResponse | None:
        """The app's state, per role and replica, from squeue/sacct refined by the job directory.

        ``max_age`` is how old (seconds) a shared squeue answer may be; see :class:`SlurmQueries`.
        """
        if not re.fullmatch(r"\d+", app_id):
            return None
        recs = self.queries.job(app_id, max_age=max_age)
        job_dir = self._job_dir(app_id, recs)
        if not recs:
            return self._describe_from_files(app_id, job_dir)
        app = self._load_app(job_dir)
        if app is None or len(app.roles) != len(recs):
            app = self._rebuild_app(recs)
        leader = recs[0]
        state = leader.state
        restarts = leader.restarts
        if job_dir is not None and leader.source == "sacct" and not restarts:
            text = _read_text(job_dir / "restarts")
            restarts = int(text.strip()) if text and text.strip().isdigit() else 0
        roles_statuses: list[RoleStatus] = []
        failure = ""
        for role, rec in zip(app.roles, recs, strict=False):
            hosts = expand_hostlist(rec.nodes) if rec.nodes else []
            replicas = []
            for k in range(role.num_replicas):
                rs = self._replica_status(role, k, rec, hosts, job_dir, restarts)
                replicas.append(rs)
                if rs.state == AppState.FAILED and rs.exit_code not in (None, 0) and not failure:
                    failure = f"role '{role.name}' replica {k} exited with code {rs.exit_code}"
            roles_statuses.append(RoleStatus(role=role.name, replicas=replicas))
        if failure:
            # The others were stopped because of that failure: they did not fail themselves.
            for rs_role in roles_statuses:
                for r in rs_role.replicas:
                    if r.state == AppState.FAILED and r.exit_code is None:
                        r.state = AppState.CANCELLED
                        r.error_msg = f"stopped after {failure}"
        elif state == AppState.FAILED and leader.state_name != "FAILED":
            # Slurm ended the job (TIMEOUT, NODE_FAIL, OUT_OF_MEMORY, PREEMPTED...): every replica it
            # stopped failed with it.
            for rs_role in roles_statuses:
                for r in rs_role.replicas:
                    if r.state in (AppState.CANCELLED, AppState.RUNNING, AppState.FAILED):
                        r.state = AppState.FAILED
                        r.error_msg = f"job ended by Slurm: {leader.state_name}" + (
                            f" ({r.error_msg})" if r.error_msg else ""
                        )
        msg = self._message(leader, state, failure)
        return DescribeAppResponse(
            app_id=app_id,
            state=state,
            num_restarts=restarts,
            msg=msg,
            structured_error_msg=failure,
            roles_statuses=roles_statuses,
            app=app,
            created=leader.submit_time,
        )

    @staticmethod
    def _message(leader: SlurmJob, state: AppState, failure: str) -> str:
        reason = leader.reason if leader.reason and leader.reason != "None" else ""
        if state != AppState.PENDING and reason in _WAITING_REASONS:
            reason = ""  # a stale pending reason (sacct keeps the last one) says nothing about the end
        parts = [leader.state_name]
        if reason:
            parts.append(f"reason: {reason}")
        if leader.description:
            parts.append(leader.description)
        if state == AppState.FAILED:
            if failure:
                parts.append(failure)
            elif leader.exit_code:
                parts.append(f"exit code {leader.exit_code}")
            elif leader.signal:
                parts.append(f"signal {leader.signal}")
        return "; ".join(parts)

    @staticmethod
    def _replica_status(
        role: Role,
        k: int,
        rec: SlurmJob,
        hosts: list[str],
        job_dir: Path | None,
        restarts: int,
    ) -> ReplicaStatus:
        comp_state = rec.state
        host = hosts[k] if k < len(hosts) and rec.num_tasks in (None, len(hosts)) else ""
        rs = ReplicaStatus(id=k, role=role.name, state=comp_state, hostname=host, restarts=restarts)
        if comp_state == AppState.PENDING or job_dir is None:
            return rs
        f = read_status(job_dir / role.name / f"{k}.status")
        if f is None or f.attempt != restarts:
            return rs  # not started in this attempt (or files not shared): the role's state stands
        rs.hostname = f.host or rs.hostname
        if f.running:
            rs.state = AppState.RUNNING if not comp_state.is_terminal else comp_state
            return rs
        rs.exit_code = f.exit_code
        if f.exit_code == 0:
            rs.state = AppState.SUCCEEDED
        elif f.signal:
            # stopped by tsm (another role failed) or by Slurm (scancel, time limit): not its own failure
            rs.state = AppState.CANCELLED
            rs.error_msg = f"stopped by SIG{f.signal} (exit code {f.exit_code})"
        else:
            rs.state = AppState.FAILED
            rs.error_msg = f"exited with code {f.exit_code}"
        return rs

    def _describe_from_files(self, app_id: str, job_dir: Path | None) -> DescribeAppResponse | None:
        """Slurm forgot the job (no accounting): its job directory's ``exit`` file still tells how it ended."""
        if job_dir is None:
            return None
        app = self._load_app(job_dir)
        code = (_read_text(job_dir / "exit") or "").strip()
        if code.isdigit():
            state = AppState.SUCCEEDED if code == "0" else AppState.FAILED
            msg = "ended (Slurm no longer lists the job)" + (f"; exit code {code}" if code != "0" else "")
        else:
            state, msg = AppState.UNKNOWN, "Slurm no longer lists the job and it left no exit code"
        roles_statuses = []
        for role in app.roles if app else []:
            reps = []
            for k in range(role.num_replicas):
                f = read_status(job_dir / role.name / f"{k}.status")
                st = state
                if f is not None and not f.running:
                    st = AppState.SUCCEEDED if f.exit_code == 0 else AppState.FAILED
                reps.append(
                    ReplicaStatus(
                        id=k,
                        role=role.name,
                        state=st,
                        hostname=f.host if f else "",
                        exit_code=f.exit_code if f else None,
                    )
                )
            roles_statuses.append(RoleStatus(role=role.name, replicas=reps))
        return DescribeAppResponse(
            app_id=app_id, state=state, msg=msg, roles_statuses=roles_statuses, app=app
        )

    def wait(self, app_id: str, timeout: float | None = None) -> DescribeAppResponse | None:
        """Block until the app is terminal or ``timeout`` passes; return its last description.

        Polls :meth:`describe` starting every 0.5 s and backing off by 1.5x to every 5 s; the polls go
        through the shared :class:`SlurmQueries`, so many apps waited on in threads share their squeue
        calls (about one a second in all) instead of each asking the controller.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.5
        while True:
            desc = self.describe(app_id, max_age=min(delay, 1.0))
            if desc is None or desc.state.is_terminal:
                return desc
            if deadline is not None and time.monotonic() >= deadline:
                return desc
            pause = delay if deadline is None else min(delay, max(0.0, deadline - time.monotonic()))
            time.sleep(pause)
            delay = min(delay * 1.5, 5.0)

    def list(self) -> list[ListAppResponse]:
        """This user's jobs: those ``squeue`` shows and those ``sacct`` recorded in the last 7 days."""
        found: dict[str, list[SlurmJob]] = {}
        found.update(self.queries.recent())
        found.update(self.queries.queue())
        me = _user_name()
        out = []
        for app_id, recs in found.items():
            leader = recs[0]
            if me and leader.user and leader.user != me:
                continue  # 22.05's squeue --json ignores --me, and root's sacct shows everyone
            out.append(
                ListAppResponse(
                    app_id=app_id,
                    state=leader.state,
                    app_handle=f"{self.backend}://{self.session_name}/{app_id}",
                    name=leader.name.rsplit(".", 1)[0] if "." in leader.name else leader.name,
                    created=leader.submit_time,
                )
            )
        out.sort(key=lambda r: (r.created or 0, _id_key(r.app_id)), reverse=True)
        return out

    def cancel(self, app_id: str) -> None:
        """``scancel`` the job (every role); cancelling an ended or unknown job is not an error."""
        if not re.fullmatch(r"\d+", app_id):
            return
        proc = _run(["scancel", app_id])
        if proc.returncode != 0:
            err = proc.stderr.lower()
            if "already completing or completed" in err or "invalid job id" in err:
                return
            _check(proc, f"scancel {app_id}")
        self.queries.invalidate()

    def remove(self, app_id: str) -> bool:
        """Delete the files tsm wrote for an ended app (its job directory and index entry).

        Only the files tsm and Slurm write there are deleted, and then the directories if that leaves
        them empty, so a ``job_dir`` that held other files keeps them. Slurm's own records stay.
        """
        if not re.fullmatch(r"\d+", app_id):
            return False
        job_dir = self._indexed_job_dir(app_id)
        if job_dir is None:
            job_dir = self._job_dir(app_id, self.queries.job(app_id))
        removed = False
        if job_dir is not None:
            app = self._load_app(job_dir)
            removed = _remove_job_files(job_dir, [r.name for r in app.roles] if app else [])
        with contextlib.suppress(Exception):  # an unusable TSM_HOME has no index to clean
            removed |= _unlink(_index_dir() / app_id)
        return removed

    # -- logs ---------------------------------------------------------------------------------------------
    def log_iter(
        self,
        app_id: str,
        role_name: str,
        k: int = 0,
        regex: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        should_tail: bool = False,
        streams: Stream | None = None,
    ) -> Iterator[str]:
        """Lines of replica ``k`` of ``role_name`` from its files in the job directory.

        See the module docstring for what COMBINED, ``since``/``until`` and ``should_tail`` mean here.
        """
        job_dir = None
        if re.fullmatch(r"\d+", app_id):
            job_dir = self._indexed_job_dir(app_id) or self._job_dir(app_id, self.queries.job(app_id))
        if job_dir is None:
            raise UnknownAppError(
                f"no job directory found for slurm app '{app_id}' (not submitted by tsm, or its files are gone)"
            )
        app = self._load_app(job_dir)
        roles = {r.name: r for r in app.roles} if app else {}
        if role_name not in roles:
            raise UnknownAppError(f"app '{app_id}' has no role '{role_name}' (roles: {', '.join(roles)})")
        role = roles[role_name]
        if not 0 <= k < role.num_replicas:
            raise UnknownAppError(
                f"role '{role_name}' of '{app_id}' has replicas 0..{role.num_replicas - 1}, not {k}"
            )
        stream = Stream(streams) if streams is not None else Stream.COMBINED
        names = {Stream.STDOUT: ["stdout"], Stream.STDERR: ["stderr"]}.get(stream, ["stdout", "stderr"])
        paths = [job_dir / role_name / f"{k}.{n}" for n in names]
        status_path = job_dir / role_name / f"{k}.status"
        if since is not None or until is not None:
            paths = [p for p in paths if _file_in_window(p, status_path, since, until)]
        if not should_tail:
            return filter_regex(regex, _read_all(paths))
        ended = self._tail_end_check(app_id, role, status_path)
        return filter_regex(regex, _follow(paths, ended))

    def _tail_end_check(self, app_id: str, role: Role, status_path: Path) -> Callable[[], bool]:
        """A callable that is True once the replica is done for good (no retry left) or the job has ended."""
        last_check = [0.0]

        def ended() -> bool:
            f = read_status(status_path)
            if f is not None and not f.running and (f.exit_code == 0 or f.attempt >= role.max_retries):
                return True
            now = time.monotonic()
            if now - last_check[0] < 2.0:
                return False
            last_check[0] = now
            recs = self.queries.job(app_id, max_age=2.0)
            return recs is None or bool(recs) and recs[0].state.is_terminal

        return ended


def _remove_job_files(job_dir: Path, roles: list[str]) -> bool:
    """Delete the files tsm and Slurm write in a job directory, then the directories left empty."""
    removed = False
    for role in roles:
        for f in (job_dir / role).glob("*"):
            if re.fullmatch(r"\d+\.(stdout|stderr|status)", f.name):
                removed |= _unlink(f)
        _rmdir(job_dir / role)
    for name in ("job.sbatch", "batch.out", "exit", "restarts", "job_id", "app.json"):
        removed |= _unlink(job_dir / name)
    _rmdir(job_dir)
    return removed


def _unlink(path: Path) -> bool:
    try:
        path.unlink()
        return True
    except OSError:
        return False


def _rmdir(path: Path) -> None:
    with contextlib.suppress(OSError):  # not empty (someone else's files) or already gone
        path.rmdir()


def _user_name() -> str:
    """This process's user name, as Slurm reports job owners ("" when it cannot be told)."""
    try:
        import pwd

        return pwd.getpwuid(os.getuid()).pw_name
    except (ImportError, KeyError):
        return os.environ.get("USER", "")


def _make_private_dirs(path: Path) -> None:
    """``mkdir -p`` where every directory made is 0700 (``Path.mkdir(parents=True)`` leaves parents 0755)."""
    missing = []
    p = path
    while not p.exists():
        missing.append(p)
        if p.parent == p:
            break
        p = p.parent
    for d in reversed(missing):
        d.mkdir(mode=0o700, exist_ok=True)


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8", errors="surrogateescape") as f:
        f.write(text)


def _file_in_window(path: Path, status_path: Path, since: datetime | None, until: datetime | None) -> bool:
    """Whole-file time filter: Slurm's log lines carry no time of their own."""
    try:
        mtime = path.stat().st_mtime
    except OSError:
        return True
    if since is not None and mtime < since.timestamp():
        return False
    if until is not None:
        f = read_status(status_path)
        if f is not None and f.started is not None and f.started > until.timestamp():
            return False
    return True


def _decode(raw: bytes) -> str:
    return raw.decode("utf-8", errors="surrogateescape")


def _read_all(paths: list[Path]) -> Iterator[str]:
    for p in paths:
        try:
            data = p.read_bytes()
        except OSError:
            continue
        yield from split_lines(_decode(data))


def _follow(paths: list[Path], ended: Callable[[], bool]) -> Iterator[str]:
    """Yield complete lines from ``paths`` as they are written until ``ended()``; then drain and stop.

    Files on a shared filesystem give no event to wait on, so this polls: every 0.1 s while lines keep
    coming, backing off to 1 s when idle.
    """
    offsets = {p: 0 for p in paths}
    partial = {p: b"" for p in paths}
    delay = 0.1
    while True:
        done = ended()  # decided before reading, so nothing written before the end is missed
        got = False
        for p in paths:
            try:
                with open(p, "rb") as f:
                    f.seek(offsets[p])
                    data = f.read()
            except OSError:
                continue
            if not data:
                continue
            got = True
            offsets[p] += len(data)
            buf = partial[p] + data
            *lines, rest = buf.split(b"\n")
            partial[p] = rest
            for line in lines:
                yield _decode(line) + "\n"
        if done:
            for p in paths:
                if partial[p]:
                    yield _decode(partial[p])
            return
        delay = 0.1 if got else min(delay * 1.5, 1.0)
        time.sleep(delay)


def create_scheduler(session_name: str, **kwargs: Any) -> SlurmScheduler:
    """Factory registered as ``slurm`` in :mod:`tsm.schedulers`."""
    return SlurmScheduler(session_name, **kwargs)
