"""Reading Slurm's answers: ``squeue``/``sacct`` (JSON of 22.05 and newer, or text columns), state names,
host lists, and the replica status files the batch script writes.

Pure functions of text: no Slurm command is run here, so all of it is tested against captured output.
Slurm states map as PENDING, REQUEUED, SUSPENDED, CONFIGURING -> PENDING; RUNNING, COMPLETING -> RUNNING;
COMPLETED -> SUCCEEDED; CANCELLED -> CANCELLED; FAILED, TIMEOUT, NODE_FAIL, PREEMPTED, OUT_OF_MEMORY,
BOOT_FAIL, DEADLINE -> FAILED (:data:`STATES`).

Preemption is not failure (issue 25): PREEMPTED, NODE_FAIL and BOOT_FAIL, and a requeue the batch script did
not ask for, are the cluster's decisions (:data:`PREEMPTION_STATES`, :func:`preemption_of`,
:func:`read_last_exit`); the replica's error says so and ``ReplicaStatus.preempted`` is set.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from tsm.lifecycle import PREEMPTED_PREFIX
from tsm.schedulers.common.status import StateTable
from tsm.specs.api import AppState


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


def parse_squeue_json(text: str) -> dict[str, list[SlurmJob]]:
    """Parse ``squeue --json`` into ``{app id: [component records sorted by offset]}``.

    Every job in the output is kept (22.05 ignores ``-j``): callers pick theirs by app id. An array task is
    its own app, ``<array job id>_<task id>``; the row of an array's tasks not started yet
    (``array_task_string`` ``3-19%4``) gives one record per task.
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
        for r in _array_copies(rec, _num(j.get("array_job_id")), _num(j.get("array_task_id")),
                               str(j.get("array_task_string") or "")):
            out.setdefault(r.app_id, []).append(r)
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
        array = j.get("array") or {}
        array = array if isinstance(array, dict) else {}
        for r in _array_copies(rec, _num(array.get("job_id")), _num(array.get("task_id")),
                               str(array.get("task") or "")):
            runs.setdefault((r.app_id, r.offset), []).append(r)
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
        shown = f["JobID"].strip()
        job_id, _, task = shown.partition("_")  # an array task: 123_4, or 123_[5-19%4] for those not started
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
        copies = _array_copies(rec, int(job_id) if task else None, _text_int(task), task)
        for r in copies:
            out.setdefault(r.app_id, []).append(r)
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
        array_id, under, task = shown.partition("_")  # an array task: 123_4 (raw id its own), 123_[5-9]
        copies = _array_copies(rec, int(array_id) if under and array_id.isdigit() else None, _text_int(task), task)
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


def read_last_exit(job_dir: str | Path) -> str:
    """``TSM_LAST_EXIT`` of the job's current attempt, as its batch script recorded it (``job_dir/last_exit``).

    ``preempted``, ``failed:<code>``, ``time_limit`` or "" (the first attempt, or no file: not started yet,
    or the job directory is not shared).
    """
    try:
        text = Path(job_dir, "last_exit").read_text(errors="replace").strip()
    except OSError:
        return ""
    return text if re.fullmatch(r"preempted|time_limit|stalled|failed:\d+", text) else ""


#: One line of ``job_dir/excluded``: ``<node> NODE_FAIL|BOOT_FAIL[ (reason: ...)]``, ``<node> OOM (...)`` or
#: ``<node> GPU (<role>/<k>: <what was wrong>)``.
_EXCLUDED_LINE = re.compile(
    r"[A-Za-z0-9._-]+ (?:(?:NODE_FAIL|BOOT_FAIL)(?: \(reason: [^\n]{0,200}\))?"
    r"|OOM \(the kernel's OOM killer ended [^\n]{1,200}\)"
    r"|GPU \([^\n]{1,400}\))"
)


def read_excluded(job_dir: str | Path, name: str = "excluded") -> list[str]:
    """The nodes the job's batch script keeps its attempts off, and why (``node3 NODE_FAIL (reason: ...)``).

    Written by the script at the start of a restart after a node failed under an earlier attempt; [] when no
    node failed (or the job directory is not shared). Lines that are not of that form are left out. With
    ``name="oom_nodes"``: the nodes the replicas' wrapper found at fault for a replica's end (their OOM killer
    ended it, or it failed while a GPU of the node was lost or had new uncorrectable ECC errors).
    """
    try:
        text = Path(job_dir, name).read_text(errors="replace")
    except OSError:
        return []
    return [ln for ln in text.splitlines() if _EXCLUDED_LINE.fullmatch(ln)]


def read_stalled(job_dir: str | Path) -> tuple[str, int, str] | None:
    """The replica the batch script's stall watcher found stalled in this attempt, and why.

    ``(role, replica id, "stalled for 15m, last line: '...'")`` from ``job_dir/stalled``; None when none
    stalled (the file is removed as each attempt starts).
    """
    try:
        text = Path(job_dir, "stalled").read_text(errors="replace").strip()
    except OSError:
        return None
    m = re.fullmatch(r"(\S+)/(\d+) (stalled for .*)", text.splitlines()[0] if text else "")
    return (m.group(1), int(m.group(2)), m.group(3)) if m else None


def read_node_error(job_dir: str | Path) -> str:
    """Why the batch script could not keep the app off a failed node (``job_dir/node_error``, its first line,
    at most 500 characters), or "" when it never had to give up (see ``script._avoid_failed_nodes``)."""
    try:
        text = Path(job_dir, "node_error").read_text(errors="replace")
    except OSError:
        return ""
    return (text.splitlines() or [""])[0].strip()[:500]


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


def id_key(app_id: str) -> tuple[int, str]:
    """Sort key of job ids: numerically (``"9" < "10"``)."""
    if app_id.isdigit():
        return (int(app_id), "")
    m = ARRAY_APP_ID.fullmatch(app_id)
    return (int(m.group(1)), f"{int(m.group(2)):012d}") if m else (0, app_id)
