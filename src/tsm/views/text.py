"""The plain-text face of a :class:`~tsm.views.snapshot.Snapshot`: what ``tsm top`` prints when not on a TTY.

Also the shared formatting (durations, used/requested figures, filters) of the terminal view.
"""

from __future__ import annotations

import functools

from tsm.schedulers.common.viewmodel import AppSummary, ReplicaSummary
from tsm.views.snapshot import Snapshot

_BARS = "▁▂▃▄▅▆▇█"


def fmt_duration(seconds: float | None) -> str:
    """``42s``, ``3m07s``, ``2h05m``; empty when unknown."""
    if seconds is None:
        return ""
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def used_req(used: float | None, req: float | None, digits: int) -> str:
    """``0.47/2`` (used / requested); ``n/a`` where usage cannot be measured, ``-`` where nothing was asked."""
    u = "n/a" if used is None else f"{used:.{digits}f}"
    r = "-" if req is None else f"{req:g}"
    return f"{u}/{r}"


def sparkline(values: list[float], width: int = 12) -> str:
    """The last ``width`` values as block characters scaled to their maximum."""
    vals = values[-width:]
    if not vals:
        return ""
    top = max(max(vals), 1e-9)
    return "".join(_BARS[min(len(_BARS) - 1, int(v / top * (len(_BARS) - 1) + 0.5))] for v in vals)


@functools.lru_cache(maxsize=8192)
def printable(text: str) -> str:
    """``text`` on one line with what a terminal would act on (escapes, CR, ...) written as escapes.

    Cached: a view shows the same names, handles and errors tick after tick.
    """
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in " ".join(text.split()))


def matches(app: AppSummary, query: str) -> bool:
    """Whether ``app`` passes a filter such as ``state:RUNNING scheduler:local train``.

    Words ``state:X`` and ``scheduler:X`` (``sched:``) must match exactly (case-insensitive; several values
    with commas: ``state:FAILED,CANCELLED``); any other word must appear in the name or the handle.
    """
    for word in query.split():
        key, sep, value = word.partition(":")
        if sep and key.lower() in ("state", "scheduler", "sched"):
            field = app.state if key.lower() == "state" else app.scheduler
            if field.lower() not in {v.lower() for v in value.split(",") if v}:
                return False
        elif word.lower() not in app.name.lower() and word.lower() not in app.handle.lower():
            return False
    return True


def replica_cells(r: ReplicaSummary) -> list[str]:
    """One replica as the columns of :data:`REPLICA_COLUMNS`."""
    return [
        f"{r.role}/{r.idx}", r.state, r.host, str(r.attempt), "" if r.exit_code is None else str(r.exit_code),
        used_req(r.cpu_used, r.cpu_req, 2), used_req(r.mem_used_mb, r.mem_req_mb, 0),
        used_req(r.gpu_mem_mb, r.gpu_req, 0), r.error, r.last_line,
    ]


APP_COLUMNS = ("APP", "HANDLE", "SCHED", "STATE", "AGE", "DURATION", "RESTARTS", "LAST ERROR")
REPLICA_COLUMNS = ("REPLICA", "STATE", "HOST", "ATTEMPT", "EXIT", "CPU", "MEM MiB", "GPU MiB", "ERROR", "LAST LINE")


def app_cells(a: AppSummary, now: float) -> list[str]:
    """One app as the columns of :data:`APP_COLUMNS`."""
    return [a.name, a.handle, a.scheduler, a.state, fmt_duration(a.age(now)), fmt_duration(a.duration(now)),
            str(a.restarts), a.last_error]


def _table(header: tuple[str, ...], rows: list[list[str]], indent: str = "") -> list[str]:
    clean = [[printable(c) for c in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in clean]) for i, h in enumerate(header)]
    out = [indent + "  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip()]
    out += [indent + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in clean]
    return out


def render_text(snap: Snapshot, query: str = "", replicas: bool = True) -> str:
    """The apps passing ``query`` as a text table, each followed by its replicas (indented)."""
    apps = [a for a in snap.apps if matches(a, query)]
    if not apps:
        return "no apps" + (f" match {query!r}" if query else "") + "\n"
    lines: list[str] = []
    for i, line in enumerate(_table(APP_COLUMNS, [app_cells(a, snap.taken) for a in apps])):
        lines.append(line)
        if i and replicas and apps[i - 1].replicas:
            lines += _table(REPLICA_COLUMNS, [replica_cells(r) for r in apps[i - 1].replicas], indent="    ")
    for name, err in snap.errors.items():
        lines.append(f"{name}: {err}")
    return "\n".join(lines) + "\n"
