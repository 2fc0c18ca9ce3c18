"""A sweep's status (:class:`SweepStatus`) and ``tsm list``'s folding of sweeps, from the state alone.

Kept apart from :mod:`tsm.sweep.api` so ``tsm list`` imports neither the controller nor the component
machinery: folding reads each sweep's state file and nothing else.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tsm.sweep.state import SWEEP_TERMINAL, SweepState, all_sweeps


@dataclass
class SweepStatus:
    """A sweep's state, why it ended (``reason``), and its trials counted by state."""

    handle: str
    state: str
    reason: str
    component: str
    scheduler: str
    parallel: int
    total: int
    counts: dict[str, int] = field(default_factory=dict)
    created: float = 0.0
    ended: float | None = None
    controller_alive: bool = False

    @property
    def is_terminal(self) -> bool:
        return self.state in SWEEP_TERMINAL

    def summary(self) -> str:
        """One line: state, counts, and the reason once it ended."""
        parts = [f"{self.counts.get(s, 0)} {s.lower()}" for s in
                 ("SUCCEEDED", "FAILED", "CANCELLED", "RUNNING", "SUBMITTED", "LAUNCHING", "PENDING", "SKIPPED")
                 if self.counts.get(s)]
        other = sum(n for s, n in self.counts.items() if s not in
                    ("SUCCEEDED", "FAILED", "CANCELLED", "RUNNING", "SUBMITTED", "LAUNCHING", "PENDING", "SKIPPED"))
        if other:
            parts.append(f"{other} other")
        tail = f": {self.reason}" if self.is_terminal and self.reason else ""
        return f"{self.state} ({self.total} trials: {', '.join(parts) or 'none'}){tail}"


def status_of(handle: str, state: SweepState, alive: bool) -> SweepStatus:
    """The status of the sweep whose state is open in ``state`` (``alive``: whether its controller runs)."""
    meta = state.meta()
    return SweepStatus(
        handle=handle, state=meta.get("state", "PENDING"), reason=meta.get("reason", ""),
        component=meta.get("component", ""), scheduler=meta.get("scheduler", ""),
        parallel=int(meta.get("parallel", 1)), total=int(meta.get("total", 0)), counts=state.counts(),
        created=float(meta.get("created", 0.0)), ended=meta.get("ended"),
        controller_alive=alive,
    )


def fold_list(apps: Sequence[Any], session: str | None = None, complete: bool = True) -> list[Any]:
    """``tsm list``'s rows with each sweep as one row (its trials folded into it), newest first.

    ``apps`` are the newest apps of the history, newest first; unless ``complete`` (they are all of them), a
    sweep older than the oldest of them is left out: apps not read yet may be newer than it.
    """
    from tsm.schedulers.api import ListAppResponse
    from tsm.specs.api import AppState

    sweeps = all_sweeps(session)
    if not sweeps:
        return list(apps)
    trial_handles: set[str] = set()
    folded = []
    for h in sweeps:
        try:
            state = SweepState.open(h)
        except Exception:  # noqa: BLE001 - being created or removed right now
            continue
        try:
            st = status_of(str(h), state, alive=False)
            trial_handles.update(t.handle for t in state.trials() if t.handle)
            name = state.meta().get("name", "sweep")
        finally:
            state.close()
        app_state = AppState[st.state] if st.state in AppState.__members__ else AppState.UNKNOWN
        label = f"{name} (sweep: {st.summary().partition('(')[2].partition(')')[0]})"
        folded.append(ListAppResponse(app_id=h.sweep_id, state=app_state, app_handle=str(h), name=label,
                                      created=st.created))
    if not complete and apps:
        oldest = min(a.created or 0.0 for a in apps)
        folded = [f for f in folded if (f.created or 0.0) >= oldest]
    out = [a for a in apps if a.app_handle not in trial_handles] + folded
    out.sort(key=lambda a: a.created or 0.0, reverse=True)
    return out
