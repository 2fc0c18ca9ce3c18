"""The plain-text face of a :class:`~tsm.views.snapshot.Snapshot`: what ``tsm top`` prints when not on a TTY.

Also the shared formatting (durations, used/requested figures, filters) of the terminal view.
"""

from __future__ import annotations

import functools
from collections.abc import Collection
from dataclasses import dataclass

from tsm.schedulers.common.viewmodel import AppSummary, ReplicaSummary
from tsm.views.snapshot import Snapshot
from tsm.views.sweeps import SWEEP_ENDED, SweepGroup, sweep_duration, sweep_error

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
    """:func:`tsm.util.text.printable`, cached: a view shows the same names, handles and errors tick after tick."""
    from tsm.util.text import printable as shown

    return shown(text)


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


#: what a sweep's line starts with, folded and expanded, and what its trials start with under it (not spaces:
#: :func:`printable` folds runs of blanks)
FOLDED, EXPANDED, TRIAL_INDENT = "▸ ", "▾ ", "└ "


@dataclass
class Row:
    """One line of an app table: an app (``depth`` 1 under its sweep) or a sweep folding its trials."""

    key: str  #: the app's or the sweep's handle
    app: AppSummary | None = None
    sweep: SweepGroup | None = None
    trials: tuple[AppSummary, ...] = ()  #: a sweep's trials in the snapshot (every one, matching or not)
    depth: int = 0


def fold_rows(snap: Snapshot, query: str = "", expanded: Collection[str] = ()) -> list[Row]:
    """The apps passing ``query``, each sweep's trials folded under one line where its newest trial was.

    A sweep's line is shown when one of its trials passes ``query`` (or, with no state word in the query,
    its name does); the trials follow it, indented, when its handle is in ``expanded`` (those passing
    ``query``). Apps that are no sweep's trial are rows as before; a sweep that has launched no trial yet
    is a line at the top.
    """
    of: dict[str, SweepGroup] = {h: g for g in snap.sweeps for h in g.trials}
    trials_of: dict[str, list[AppSummary]] = {}
    for a in snap.apps:
        if a.handle in of:
            trials_of.setdefault(of[a.handle].handle, []).append(a)
    # a sweep still starting (no trial launched yet) comes first, so it is seen at once
    rows: list[Row] = [Row(g.handle, sweep=g) for g in snap.sweeps
                       if g.handle not in trials_of and g.state not in SWEEP_ENDED and _sweep_matches(g, query)]
    placed: set[str] = set()
    for a in snap.apps:
        g = of.get(a.handle)
        if g is None:
            if matches(a, query):
                rows.append(Row(a.handle, app=a))
            continue
        if g.handle in placed:
            continue
        placed.add(g.handle)
        trials = trials_of[g.handle]
        shown = [t for t in trials if matches(t, query)]
        if not shown and not _sweep_matches(g, query):
            continue
        rows.append(Row(g.handle, sweep=g, trials=tuple(trials)))
        if g.handle in expanded:
            rows += [Row(t.handle, app=t, depth=1) for t in shown]
    return rows


def _sweep_matches(g: SweepGroup, query: str) -> bool:
    words = query.split()
    if any(w.partition(":")[0].lower() in ("state", "scheduler", "sched") and ":" in w for w in words):
        return False
    return all(w.lower() in g.name.lower() or w.lower() in g.handle.lower() for w in words)


def sweep_cells(g: SweepGroup, trials: Collection[AppSummary], now: float, expanded: bool) -> list[str]:
    """A sweep's line as the columns of :data:`APP_COLUMNS`: its trials counted by state, its age, how long it
    ran and why it failed (:func:`~tsm.views.sweeps.sweep_duration`, :func:`~tsm.views.sweeps.sweep_error`)."""
    scheds = sorted({t.scheduler for t in trials})
    return [f"{EXPANDED if expanded else FOLDED}{g.name} (sweep: {g.summary})", g.handle, ",".join(scheds), g.state,
            fmt_duration(max(now - g.created, 0.0)) if g.created else "", fmt_duration(sweep_duration(g, trials, now)),
            str(sum(t.restarts for t in trials)), sweep_error(g, trials)]


def row_cells(row: Row, now: float, expanded: Collection[str] = ()) -> list[str]:
    """One :class:`Row` as the columns of :data:`APP_COLUMNS` (a trial's name indented under its sweep)."""
    if row.sweep is not None:
        return sweep_cells(row.sweep, row.trials, now, row.key in expanded)
    assert row.app is not None
    cells = app_cells(row.app, now)
    if row.depth:
        cells[0] = TRIAL_INDENT + cells[0]
    return cells


def _table(header: tuple[str, ...], rows: list[list[str]], indent: str = "") -> list[str]:
    clean = [[printable(c) for c in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in clean]) for i, h in enumerate(header)]
    out = [indent + "  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip()]
    out += [indent + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in clean]
    return out


def render_text(snap: Snapshot, query: str = "", replicas: bool = True, expanded: Collection[str] = ()) -> str:
    """The apps passing ``query`` as a text table, each followed by its replicas (indented).

    A sweep's trials are folded under one line (``▸ NAME (sweep: 3 succeeded, 1 running)``), expanded for
    the sweep handles in ``expanded`` (see :func:`fold_rows`).
    """
    rows = fold_rows(snap, query, expanded)
    if not rows:
        return "no apps" + (f" match {query!r}" if query else "") + "\n"
    lines: list[str] = []
    for i, line in enumerate(_table(APP_COLUMNS, [row_cells(r, snap.taken, expanded) for r in rows])):
        lines.append(line)
        app = rows[i - 1].app if i else None
        if app is not None and replicas and app.replicas:
            lines += _table(REPLICA_COLUMNS, [replica_cells(r) for r in app.replicas], indent="    ")
    for name, err in snap.errors.items():
        lines.append(f"{name}: {err}")
    return "\n".join(lines) + "\n"
