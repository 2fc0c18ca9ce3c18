"""``tsm stack``'s report: replicas' py-spy dumps grouped so that the one replica that differs stands out.

Many ranks of a healthy job sit in the same place (the same all-reduce, the same data loader wait); the rank
worth looking at is the one that is somewhere else. :func:`group_stacks` folds replicas whose Python stacks
are the same (frame names and files, thread by thread, process by process, line numbers left out so a loop
in progress does not split a group) into one group, largest first, and marks the groups smaller than the
largest as ``outlier``. Pure functions of the dumps: the CLI prints them, the dashboard serves them as JSON.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from tsm.schedulers.api import ReplicaStack


@dataclass
class StackGroup:
    """Replicas (``role/k`` names) whose stacks are the same, and those stacks (one replica's, as dumped)."""

    replicas: list[str]
    processes: list[dict[str, Any]]
    outlier: bool = False


@dataclass
class StackReport:
    """What ``Runner.replica_stacks`` returns: the app, each replica's dump (or why none), and the groups."""

    handle: str
    replicas: list[ReplicaStack] = field(default_factory=list)
    groups: list[StackGroup] = field(default_factory=list)

    @property
    def errors(self) -> list[tuple[str, str]]:
        """``(role/k, why)`` for every replica that could not be dumped."""
        return [(f"{r.role}/{r.k}", r.error) for r in self.replicas if r.error]

    def to_json(self) -> dict[str, Any]:
        """The report as plain JSON values (``tsm stack --json``, the dashboard's ``/api/apps/{id}/stack``)."""
        return {"handle": self.handle, "replicas": [asdict(r) for r in self.replicas],
                "groups": [asdict(g) for g in self.groups]}


def frame_text(frame: dict[str, Any]) -> str:
    """One frame as ``name (file:line)``, as py-spy prints it."""
    where = frame.get("short_filename") or frame.get("filename") or "?"
    line = frame.get("line")
    return f"{frame.get('name', '?')} ({where}{':' + str(line) if line else ''})"


def _signature(stack: ReplicaStack) -> tuple[Any, ...]:
    """What two replicas must share to be folded together: per process, per thread, the frames' names and files."""
    return tuple(
        tuple(
            tuple((f.get("name"), f.get("short_filename") or f.get("filename")) for f in t.get("frames", []))
            for t in p.threads
        )
        for p in stack.processes
    )


def group_stacks(replicas: Sequence[ReplicaStack]) -> list[StackGroup]:
    """Replicas with the same stacks as one group each, the largest group first (then in replica order);
    groups smaller than the largest are outliers when there are several groups. Undumped replicas are left out."""
    order: list[tuple[Any, ...]] = []
    members: dict[tuple[Any, ...], list[ReplicaStack]] = {}
    for r in replicas:
        if r.error:
            continue
        sig = _signature(r)
        if sig not in members:
            order.append(sig)
            members[sig] = []
        members[sig].append(r)
    sigs = sorted(order, key=lambda s: -len(members[s]))  # stable: equal sizes keep replica order
    biggest = len(members[sigs[0]]) if sigs else 0
    return [
        StackGroup(
            replicas=[f"{r.role}/{r.k}" for r in members[s]],
            processes=[asdict(p) for p in members[s][0].processes],
            outlier=len(sigs) > 1 and len(members[s]) < biggest,
        )
        for s in sigs
    ]


def ranges(names: Sequence[str]) -> str:
    """``trainer/0, trainer/2-7``: replica names of one role with consecutive indices joined."""
    out: list[str] = []
    runs: list[tuple[str, int, int]] = []
    for name in names:
        role, _, k = name.rpartition("/")
        i = int(k)
        if runs and runs[-1][0] == role and runs[-1][2] == i - 1:
            runs[-1] = (role, runs[-1][1], i)
        else:
            runs.append((role, i, i))
    for role, a, b in runs:
        out.append(f"{role}/{a}" if a == b else f"{role}/{a}-{b}")
    return ", ".join(out)


def render(report: StackReport) -> str:
    """The report as ``tsm stack`` prints it: each group's replicas, then its processes' threads and frames."""
    lines: list[str] = []
    several = len(report.groups) > 1
    for g in report.groups:
        n = len(g.replicas)
        mark = "  <-- differs" if g.outlier else ""
        what = f"{n} replicas with the same stacks" if n > 1 else "1 replica"
        lines.append(f"== {ranges(g.replicas)} ({what}){mark}" if several or n > 1 else f"== {g.replicas[0]}")
        for p in g.processes:
            lines.append(f"  process {p['pid']}: {p['cmdline']}")
            for t in p["threads"]:
                name = t.get("thread_name") or ""
                state = "active" if t.get("active") else "idle"
                lines.append(f"    thread {t.get('os_thread_id') or t.get('thread_id')}{' ' + name if name else ''} ({state})")
                lines.extend(f"      {frame_text(f)}" for f in t.get("frames", []))
        lines.append("")
    return "\n".join(lines)
