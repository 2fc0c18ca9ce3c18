"""Sweeps in the views: which apps of a snapshot are one sweep's trials, folded under one line.

A sweep's trials are ordinary apps; the link is the sweep's own state (``$TSM_HOME/sweeps/...``), which
records each trial's handle (see :mod:`tsm.sweep.state`), the same source ``tsm list`` folds by
(:func:`tsm.sweep.status.fold_list`). Reading it costs one small SQLite read per sweep per refresh, and
nothing at all when no sweep was ever started here (the sweeps folder is listed, not opened).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from tsm.schedulers.common.viewmodel import AppSummary

#: a sweep's states once it ended (tsm.sweep.state.SWEEP_TERMINAL, spelled out: the views stay light)
SWEEP_ENDED = ("SUCCEEDED", "FAILED", "CANCELLED")


@dataclass
class SweepGroup:
    """One sweep as a view shows it: its line, and the handles of its trials (index order)."""

    handle: str
    name: str
    state: str
    summary: str
    created: float
    reason: str = ""
    #: when the sweep ended (None while it runs, or for a state written before this was recorded)
    ended: float | None = None
    metric: str | None = None
    trials: list[str] = field(default_factory=list)
    #: per trial handle: its index and parameters (``{"lr": "0.1"}``), for the sweep page
    params: dict[str, dict[str, str]] = field(default_factory=dict)
    #: the axes of the space, in order
    axes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"handle": self.handle, "name": self.name, "state": self.state, "summary": self.summary,
                "created": self.created, "ended": self.ended, "reason": self.reason, "metric": self.metric,
                "trials": list(self.trials),
                "params": {h: dict(p) for h, p in self.params.items()}, "axes": list(self.axes)}


def sweep_duration(g: SweepGroup, trials: Collection[AppSummary], now: float) -> float | None:
    """Seconds from the sweep's creation to its end (now while it runs); an ended sweep that did not record
    when it ended counts to its last trial's end."""
    if not g.created:
        return None
    end = g.ended
    if end is None and g.state in SWEEP_ENDED:
        ends = [t.ended for t in trials if t.ended is not None]
        if not ends:
            return None
        end = max(ends)
    return max((now if end is None else end) - g.created, 0.0)


def sweep_error(g: SweepGroup, trials: Collection[AppSummary]) -> str:
    """A sweep's last error: why it failed (with its first trial's error), or a trial's error while it runs.

    A sweep that succeeded has none: its reason ("N trial(s) succeeded") is no error.
    """
    errors = [t.last_error for t in trials if t.last_error]
    if g.state == "SUCCEEDED":
        return ""
    if g.state in SWEEP_ENDED and g.reason:
        return f"{g.reason}: {errors[0]}" if errors and errors[0] not in g.reason else g.reason
    return errors[0] if errors else ""


def sweep_groups(session: str | None = None) -> list[SweepGroup]:
    """Every sweep recorded here (one session's when given), newest first; unreadable ones are skipped."""
    from tsm.sweep.state import SweepState, all_sweeps
    from tsm.sweep.status import status_of

    out: list[SweepGroup] = []
    for h in all_sweeps(session):
        try:
            state = SweepState.open(h)
        except Exception:  # noqa: BLE001 - being created or removed right now
            continue
        try:
            if state.meta().get("native"):  # a Slurm array: no controller moves its trials; one squeue does
                from tsm.sweep.native import refresh

                refresh(state)
            st = status_of(str(h), state, alive=False)
            meta = state.meta()
            trials = state.trials()
        except Exception:  # noqa: BLE001 - a sweep half-written or removed meanwhile: shown next tick
            continue
        finally:
            state.close()
        handles = [t.handle for t in trials if t.handle]
        params = {t.handle: {"trial": str(t.idx), **{k: str(v) for k, v in t.params.items()}}
                  for t in trials if t.handle}
        out.append(SweepGroup(
            handle=str(h), name=str(meta.get("name", "sweep")), state=st.state,
            summary=st.summary().partition("(")[2].partition(")")[0], created=st.created, reason=st.reason,
            ended=None if st.ended is None else float(st.ended),
            metric=meta.get("metric"), trials=handles, params=params, axes=list((meta.get("space") or {}).keys()),
        ))
    out.sort(key=lambda g: g.created, reverse=True)
    return out


def sweep_page(handle: str) -> dict[str, Any] | None:
    """What the ``tsm serve`` sweep page shows: the sweep, its trials table and the metrics' names.

    ``{"sweep": {...}, "axes": [...], "metrics": [...], "trials": [{"trial", "params", "state", "handle",
    "duration", "metrics", "msg"}]}``; None when ``handle`` names no sweep recorded here (or is malformed).
    Metrics are what each trial recorded through the tracker (:func:`tsm.sweep.results.read_metrics`): the
    scalar ones only, so every value is a number, a string, a boolean or null.
    """
    from tsm.errors import TsmError
    from tsm.sweep.results import read_metrics, rows
    from tsm.sweep.state import SweepState, parse_sweep_handle
    from tsm.sweep.status import status_of

    try:
        state = SweepState.open(parse_sweep_handle(handle))
    except TsmError:
        return None
    try:
        if state.meta().get("native"):  # a Slurm array: refresh its trials' states from the engine
            from tsm.sweep.native import refresh

            refresh(state)
        meta = state.meta()
        st = status_of(handle, state, alive=False)
        trials = state.trials()
    finally:
        state.close()
    table = rows(trials, read_metrics([t.handle for t in trials if t.handle]))
    metrics = sorted({k for r in table for k in r.metrics})
    return {
        "sweep": {"handle": handle, "name": meta.get("name", "sweep"), "state": st.state, "summary": st.summary(),
                  "metric": meta.get("metric"), "component": meta.get("component", ""),
                  "scheduler": meta.get("scheduler", ""), "parallel": st.parallel, "total": st.total},
        "axes": list((meta.get("space") or {}).keys()),
        "metrics": metrics,
        "trials": [{"trial": r.trial, "params": r.params, "state": r.state, "handle": r.handle,
                    "duration": r.duration, "metrics": r.metrics, "msg": r.msg} for r in table],
    }
