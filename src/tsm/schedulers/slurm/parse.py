"""Reading Slurm's answers: ``squeue`` and ``sacct`` in the text columns tsm asks for, state names and host lists.

Pure functions of text: no Slurm command is run here, so all of it is tested against captured output (the
files the batch script writes are read by :mod:`.jobdir`). tsm asks ``squeue --Format`` and ``sacct -P`` for
the columns it reads and no more (:data:`SQUEUE_ARGS`, :func:`sacct_args`): cheaper for Slurm to write and for
tsm to read than the JSON of every field, and the same on every Slurm version; times come as epoch seconds
(``SLURM_TIME_FORMAT=%s``), whatever the time zone of the host that runs the command. Slurm states map as
PENDING, REQUEUED, SUSPENDED, CONFIGURING -> PENDING; RUNNING, COMPLETING -> RUNNING; COMPLETED ->
SUCCEEDED; CANCELLED -> CANCELLED; FAILED, TIMEOUT, NODE_FAIL, PREEMPTED, OUT_OF_MEMORY, BOOT_FAIL, DEADLINE
-> FAILED (:data:`STATES`).

Preemption is not failure: PREEMPTED, NODE_FAIL and BOOT_FAIL, and a requeue the batch script did not ask
for, are the cluster's decisions (:data:`PREEMPTION_STATES`, :func:`preemption_of`, with ``TSM_LAST_EXIT`` as
the job directory records it); the replica's error says so and ``ReplicaStatus.preempted`` is set.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from tsm.lifecycle import PREEMPTED_PREFIX
from tsm.schedulers.common.status import StateTable
from tsm.specs.api import AppState


def _states(value: str) -> list[str]:
    """The state names of a state column: ``RUNNING``, or ``CANCELLED`` of sacct's ``CANCELLED by 0``."""
    return [value.split()[0].upper()] if value.strip() else []


#: Slurm job states as :class:`AppState`; the flags (names after the base state in newer Slurm's list)
#: override the base state: the job is not where its base state says yet.
STATES = StateTable(
    {
        AppState.PENDING: {
            "PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "SUSPENDED", "CONFIGURING",
            "POWER_UP_NODE", "SPECIAL_EXIT_HOLD",
        },
        AppState.RUNNING: {"RUNNING", "COMPLETING", "STAGE_OUT", "SIGNALING", "RESIZING", "STOPPED", "UPDATE_DB"},
        AppState.SUCCEEDED: {"COMPLETED"},
        AppState.FAILED: {
            "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE",
            "SPECIAL_EXIT", "LAUNCH_FAILED",
        },
        AppState.CANCELLED: {"CANCELLED", "REVOKED"},
    },
    flags={
        "REQUEUED": AppState.PENDING, "REQUEUE_HOLD": AppState.PENDING, "REQUEUE_FED": AppState.PENDING,
        "CONFIGURING": AppState.PENDING, "COMPLETING": AppState.RUNNING, "STAGE_OUT": AppState.RUNNING,
        "SIGNALING": AppState.RUNNING, "RESIZING": AppState.RUNNING, "UPDATE_DB": AppState.RUNNING,
    },
)  # fmt: skip

#: Reasons a job waits for; once it has ended, sacct may still show the last one, which says nothing.
WAITING_REASONS = {
    "BeginTime", "Resources", "Priority", "Dependency", "ReqNodeNotAvail", "JobHeldUser", "JobHeldAdmin",
    "None", "Reservation", "QOSMaxJobsPerUserLimit", "AssocMaxJobsLimit", "PartitionTimeLimit",
}  # fmt: skip


def slurm_state(names: str | Iterable[str]) -> AppState:
    """Map a Slurm job state (a name, or the list of names newer Slurm gives) to an :class:`AppState`."""
    items = _states(names) if isinstance(names, str) else [str(n).split()[0].upper() for n in names if str(n)]
    return STATES.state(items)


#: ``slurm_state`` of the state lists seen (a queue of 1,000 jobs holds a handful of distinct ones).
_STATE_OF: dict[tuple[str, ...], AppState] = {}


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
        """The record's state as an :class:`AppState` (memoized per distinct state list: status of a whole
        queue asks it for every job)."""
        key = tuple(self.states)
        found = _STATE_OF.get(key)
        if found is None:
            found = _STATE_OF[key] = slurm_state(self.states)
        return found

    @property
    def state_name(self) -> str:
        """The Slurm state as people read it (``RUNNING``, ``PENDING,REQUEUED``)."""
        return ",".join(self.states) or "UNKNOWN"

    @property
    def preempted(self) -> bool:
        """The record ended (or was requeued) by the cluster's decision, not the program: see :func:`preemption_of`."""
        return bool(preemption_of(self))


def _exit_status(raw: str) -> tuple[int | None, int | None]:
    """``squeue``'s ``exit_code``, a wait status (``36608`` is exit code 143): ``(code, None)`` or ``(None, signal)``."""
    status = _text_int(raw)
    if status is None:
        return None, None
    if status & 0x7F:
        return None, status & 0x7F
    return (status >> 8) & 0xFF, None


#: An array task's app id: ``<array job id>_<task id>`` (what squeue and sacct show as its JobID).
ARRAY_APP_ID = re.compile(r"(\d+)_(\d+)")
#: The ids a Slurm app can have: a job id, or an array task's ``<array job id>_<task id>``.
APP_ID = re.compile(r"\d+(?:_\d+)?")


def array_tasks(spec: str) -> list[int]:
    """The task ids of a pending array row's task string: ``2-5%2`` or ``[0,3-9:2%4]`` -> every id it covers.

    squeue shows the tasks that have not started as one row (``123_[3-19%4]``); each is a trial of its own,
    so the row is expanded. Anything unreadable gives no ids (the row is then left out, not guessed at).
    """
    body = spec.strip().strip("[]").partition("%")[0]
    out: list[int] = []
    for part in body.split(","):
        rng, _, step_text = part.partition(":")
        lo, dash, hi = rng.partition("-")
        step = int(step_text) if step_text.isdigit() and int(step_text) > 0 else 1
        if lo.isdigit() and (not dash or hi.isdigit()):
            out += range(int(lo), (int(hi) if dash else int(lo)) + 1, step)
        elif part.strip():
            return []
    return out


def _not_started(rec: SlurmJob) -> SlurmJob:
    """``rec`` without start and end times while it is pending: Slurm's ``StartTime`` of a pending job is when
    it expects to start it (a ``--begin`` time, the backfill's estimate), not a start."""
    if rec.state == AppState.PENDING:
        rec.start_time = rec.end_time = None
    return rec


def _array_copies(rec: SlurmJob, array_id: int | None, task: int | None, spec: str) -> list[SlurmJob]:
    """``rec`` as the array task(s) it stands for (itself when it is no array task), app id ``A_T`` each.

    A row of the array with neither a task id nor a task string is the array itself (app id ``A``): once
    the array is cancelled, Slurm keeps the tasks that never started only as that one record.
    """
    if not array_id:
        return [rec]
    if task is not None:
        rec.app_id = f"{array_id}_{task}"
        return [rec]
    if not spec.strip():  # the array's own record: after a cancel, the tasks that never started, ended with it
        rec.app_id = str(array_id)
        return [rec]
    return [dataclasses.replace(rec, app_id=f"{array_id}_{t}") for t in array_tasks(spec)]


#: The separator of the columns tsm asks for (the ASCII unit separator: no job name or path holds it).
SEP = "\x1f"

#: The environment of every ``squeue``/``sacct`` tsm runs: times as epoch seconds (see the module docstring).
TIME_FORMAT = ["env", "SLURM_TIME_FORMAT=%s"]

#: ``squeue --Format`` columns tsm reads, each followed by :data:`SEP`; the free-text ones last. ``JobID`` is
#: the job's own id; ``JobArrayID`` names an array task ``<array id>_<task>`` (``<array id>_[3-19%4]`` for
#: the tasks not started yet), a het-job component ``<leader>+<offset>``, any other job by its id.
SQUEUE_FIELDS = [
    "JobID", "JobArrayID", "HetJobID", "HetJobOffset", "State", "Reason", "exit_code", "NodeList", "NumTasks", "RestartCnt",
    "SubmitTime", "StartTime", "EndTime", "UserName", "Name", "WorkDir",
]  # fmt: skip
#: This user's jobs the controller holds, in every state (it keeps ended ones ``MinJobAge`` seconds).
SQUEUE_ARGS = [*TIME_FORMAT, "squeue", "--me", "-t", "all", "-h", "-O", ",".join(f + ":" + SEP for f in SQUEUE_FIELDS)]
#: ``sacct -P`` columns tsm reads (one job allocation per line, ``-X``).
SACCT_FIELDS = ["JobIDRaw", "JobID", "State", "ExitCode", "Reason", "NodeList", "NTasks", "Submit", "Start",
                "End", "User", "JobName", "WorkDir"]  # fmt: skip


def sacct_args(*args: str) -> list[str]:
    """``sacct`` of the jobs ``args`` select (``-j <ids>``, ``-S <since>``, ``-D``) in :data:`SACCT_FIELDS`."""
    return [*TIME_FORMAT, "sacct", "-P", "-n", "-X", f"--delimiter={SEP}", "-o", ",".join(SACCT_FIELDS), *args]


def _text_time(value: str) -> float | None:
    """A time column as epoch seconds (``SLURM_TIME_FORMAT=%s``); None for ``Unknown``, ``N/A``, ``None``, 0."""
    if value.isdigit():
        return float(value) or None
    value = value.strip()
    if value.isdigit():
        return float(value) or None
    if value in ("N/A", "Unknown", "None", "NONE", ""):
        return None
    try:  # a Slurm that ignored SLURM_TIME_FORMAT: its local time
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        return None


def _text_int(value: str) -> int | None:
    if value.isdigit():
        return int(value)
    value = value.strip()
    return int(value) if value.isdigit() else None


def parse_squeue_text(text: str) -> dict[str, list[SlurmJob]]:
    """Parse the output of :data:`SQUEUE_ARGS` into ``{app id: [component records sorted by offset]}``.

    Every job of the output is kept: callers pick theirs by app id. An array task is its own app,
    ``<array job id>_<task id>``; the row of an array's tasks not started yet (``123_[3-19%4]``) gives one
    record per task.
    """
    out: dict[str, list[SlurmJob]] = {}
    n = len(SQUEUE_FIELDS)
    for line in text.splitlines():
        parts = line.removesuffix(SEP).split(SEP, n - 1)
        if len(parts) < n or not parts[0].isdigit():
            continue
        # in the order of SQUEUE_FIELDS (squeue pads nothing between separators)
        (job_id, shown, het, het_offset, state, reason, status, nodes, tasks, restarts, submitted, started,
         ended, user, name, work_dir) = parts  # fmt: skip
        array_id, under, task = shown.partition("_")  # 123_4, or 123_[5-19%4]
        het_id = _text_int(het) or 0
        code, sig = _exit_status(status)
        rec = SlurmJob(
            job_id=job_id,
            app_id=str(het_id or job_id),
            offset=(_text_int(het_offset) or 0) if het_id else 0,
            name=name,
            states=_states(state),
            reason=reason,
            exit_code=code,
            signal=sig,
            nodes=nodes if nodes != "(null)" else "",
            num_tasks=_text_int(tasks),
            restarts=_text_int(restarts) or 0,
            submit_time=_text_time(submitted),
            start_time=_text_time(started),
            end_time=_text_time(ended),
            work_dir=work_dir,
            user=user,
            source="squeue",
        )
        array = int(array_id) if under and array_id.isdigit() else None
        for r in _array_copies(_not_started(rec), array, _text_int(task), task):
            out.setdefault(r.app_id, []).append(r)
    for recs in out.values():
        if len(recs) > 1:
            recs.sort(key=lambda r: r.offset)
    return out


def parse_sacct_text(text: str) -> dict[str, list[SlurmJob]]:
    """Parse the output of :func:`sacct_args` into ``{app id: [latest record per component]}``.

    With ``-D`` a requeued job has a ``REQUEUED`` record per earlier run; those are counted into ``restarts``
    of the current record and dropped. An array task is named ``<array job id>_<task id>``.
    """
    runs: dict[tuple[str, int], list[SlurmJob]] = {}
    n = len(SACCT_FIELDS)
    for line in text.splitlines():
        parts = line.split(SEP, n - 1)
        if len(parts) < n:
            continue
        # in the order of SACCT_FIELDS
        raw, shown, state, exit_code, reason, nodes, tasks, submitted, started, ended, user, name, work_dir = parts
        if not raw.isdigit() or "." in shown:
            continue  # steps (123.batch, 123+0.1) are not jobs
        leader, plus, off = shown.partition("+")
        code, _, sig = exit_code.partition(":")
        rec = SlurmJob(
            job_id=raw,
            app_id=leader if plus else raw,
            offset=int(off) if plus and off.isdigit() else 0,
            name=name,
            states=_states(state),
            reason=reason,
            exit_code=_text_int(code),
            signal=_text_int(sig) or None,
            nodes=nodes if nodes != "None assigned" else "",
            num_tasks=_text_int(tasks),
            submit_time=_text_time(submitted),
            start_time=_text_time(started),
            end_time=_text_time(ended),
            work_dir=work_dir,
            user=user,
            source="sacct",
        )
        array_id, under, task = shown.partition("_")  # an array task: 123_4 (raw id its own), 123_[5-9]
        copies = _array_copies(_not_started(rec), int(array_id) if under and array_id.isdigit() else None,
                               _text_int(task), task)
        for r in copies:
            runs.setdefault((r.app_id, r.offset), []).append(r)
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


def job_state(recs: list[SlurmJob]) -> AppState:
    """The state of a job as a whole from its records (one per het-job component, the leader first).

    The leader's state, except that a job has not ended while a component still runs: Slurm ends a cancelled
    heterogeneous job's components one by one, and the leader may be CANCELLED while another component's
    tasks are still being stopped. Until the last has ended, the job is as live as that component.
    """
    state = recs[0].state
    if state.is_terminal:
        for r in recs[1:]:
            if r.state == AppState.RUNNING:
                return AppState.RUNNING
    return state


def stranded(recs: list[SlurmJob]) -> bool:
    """Whether Slurm requeued a heterogeneous job in part only, so that it would wait for ever.

    A node failing under one component requeues that component (the leader, pending again with one more
    restart) while the others end in the earlier attempt (FAILED, reason ``JobLaunchFailure``; seen on Slurm
    22.05); the job then never starts, as Slurm starts a heterogeneous job only once every component is
    pending. ``scontrol requeue <leader>`` requeues the components that ended.
    """
    if len(recs) < 2 or recs[0].state != AppState.PENDING:
        return False
    return any(r.state.is_terminal and r.restarts < recs[0].restarts for r in recs[1:])


#: Job states that are the cluster's decision, not the program's failure: a higher-priority job took the
#: nodes, a node died under the job, or a node failed to boot for it. Their restarts spend
#: ``max_preemptions``, never ``max_retries``.
PREEMPTION_STATES = frozenset({"PREEMPTED", "NODE_FAIL", "BOOT_FAIL"})

#: What :func:`preemption_of` says for each, after ``preempted: ``.
_PREEMPTION_WORDS = {
    "PREEMPTED": "Slurm preempted the job (PREEMPTED)",
    "NODE_FAIL": "a node of the job failed (NODE_FAIL)",
    "BOOT_FAIL": "a node failed to boot for the job (BOOT_FAIL)",
}


def preemption_of(job: SlurmJob, last_exit: str = "") -> str:
    """Why ``job`` was ended by the cluster, as a replica's error (``preempted: ...``); "" when it was not.

    A final state in :data:`PREEMPTION_STATES` says so itself. A job that Slurm requeued (pending again, or
    running its next attempt) was preempted when its batch script recorded no cause of its own for the requeue:
    ``last_exit`` is what :func:`read_last_exit` read (``preempted`` then; ``failed:<code>`` or
    ``time_limit`` for the script's own requeues).
    """
    for name in job.states:
        if name in PREEMPTION_STATES:
            reason = job.reason if job.reason and job.reason != "None" and job.reason not in WAITING_REASONS else ""
            return PREEMPTED_PREFIX + _PREEMPTION_WORDS[name] + (f"; reason: {reason}" if reason else "")
    if last_exit == "preempted" and job.restarts > 0:
        return f"{PREEMPTED_PREFIX}Slurm requeued the job (restart {job.restarts})"
    return ""


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


def id_key(app_id: str) -> tuple[int, str]:
    """Sort key of job ids: numerically (``"9" < "10"``)."""
    if app_id.isdigit():
        return (int(app_id), "")
    m = ARRAY_APP_ID.fullmatch(app_id)
    return (int(m.group(1)), f"{int(m.group(2)):012d}") if m else (0, app_id)
