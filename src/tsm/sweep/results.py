"""A sweep's results table: one row per trial with its parameters, state, duration and recorded metrics.

Metrics are what each trial recorded through the tracker (``AppRun.run_from_env().add_metadata(loss=...)``);
the tracker keys a run by its app handle (``TSM_JOB_ID``), which is the trial's handle. Rows are sorted by a
metric, best first: ``loss`` ascending, ``-acc`` descending (the larger the better); a trial without the
metric goes last. Reading 1,000 trials takes one query of the sweep's state and one tracker read per trial that has a
handle.
"""

from __future__ import annotations

import functools
import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from tsm.sweep.state import Trial


@dataclass
class TrialRow:
    """One trial in the results: what it ran with, how it ended, and what it recorded."""

    trial: int
    params: dict[str, str]
    state: str
    handle: str | None
    duration: float | None
    metrics: dict[str, object]
    msg: str


def _scalar(value: object) -> bool:
    return isinstance(value, (int, float, str, bool)) or value is None


def read_metrics(handles: Sequence[str], config: Any = None) -> dict[str, dict[str, object]]:
    """``{handle: metadata}`` of the first configured tracker (empty when tracking is off)."""
    from tsm.tracker.api import build_trackers, configured_trackers

    trackers = build_trackers(configured_trackers(config))
    if not trackers or not handles:
        return {}
    first = trackers[0]
    return {h: dict(first.metadata(h)) for h in handles}


def rows(trials: Sequence[Trial], metrics: Mapping[str, Mapping[str, object]], now: float | None = None) -> list[TrialRow]:
    """The table's rows, in trial order."""
    now = time.time() if now is None else now
    out = []
    for t in trials:
        duration = None
        if t.launched is not None:
            duration = (t.ended if t.ended is not None else now) - t.launched
        recorded = metrics.get(t.handle or "", {})
        out.append(TrialRow(t.idx, dict(t.params), t.state, t.handle, duration,
                            {k: v for k, v in recorded.items() if _scalar(v)}, t.msg))
    return out


def sort_rows(table: list[TrialRow], key: str | None) -> list[TrialRow]:
    """Best first by metric ``key`` (``-key``: descending); rows without it last, then by trial."""
    if not key:
        return sorted(table, key=lambda r: r.trial)
    descending = key.startswith("-")
    name = key.lstrip("-+")

    def order(r: TrialRow) -> tuple[int, float, int]:
        v = r.metrics.get(name, r.params.get(name))
        try:
            x = float(v)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return (1, 0.0, r.trial)
        if math.isnan(x):
            return (1, 0.0, r.trial)
        return (0, -x if descending else x, r.trial)

    return sorted(table, key=order)


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f}s"
    m, s = divmod(int(seconds), 60)
    return f"{m}m{s:02d}s" if m < 60 else f"{m // 60}h{m % 60:02d}m"


def render(table: Sequence[TrialRow]) -> str:
    """The plain-text table: TRIAL, the parameters, STATE, DURATION, the metrics, HANDLE."""
    params: list[str] = []
    metrics: list[str] = []
    for r in table:
        params += [k for k in r.params if k not in params]
        metrics += [k for k in r.metrics if k not in metrics and k not in r.params]
    head = ["TRIAL", *params, "STATE", "DURATION", *metrics, "HANDLE"]
    lines = [head]
    for r in table:
        lines.append([str(r.trial), *(r.params.get(p, "-") for p in params), r.state, _duration(r.duration),
                      *(_cell(r.metrics.get(m)) for m in metrics), r.handle or "-"])
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in lines) + "\n"


def param_types(component: str) -> dict[str, Callable[[str], object]]:
    """How each parameter's command-line text becomes the value ``component`` was called with (its annotation's
    type: ``"0.1"`` is ``0.1`` for a ``float``, stays ``"0.1"`` for a ``str``); {} when it cannot be read now."""
    import typing

    from tsm.components import get_component
    from tsm.components.cmdline import param_type, parse_value

    try:
        hints = typing.get_type_hints(get_component(component).fn)
    except Exception:  # noqa: BLE001 - a component moved or broken since the sweep: its parameters stay text
        return {}
    out: dict[str, Callable[[str], object]] = {}
    for name, annotation in hints.items():
        ptype = param_type(annotation)
        if ptype is not None and name != "return":
            out[name] = functools.partial(parse_value, ptype=ptype)
    return out


def _typed(params: Mapping[str, str], types: Mapping[str, Callable[[str], object]]) -> dict[str, object]:
    out: dict[str, object] = {}
    for name, text in params.items():
        parse = types.get(name.replace("-", "_"))
        try:
            out[name] = text if parse is None else parse(text)
        except ValueError:  # what the component was given cannot be typed: shown as it was given
            out[name] = text
    return out


def to_json(table: Sequence[TrialRow], types: Mapping[str, Callable[[str], object]] | None = None) -> str:
    """The rows as a JSON list (``tsm sweep show --json``); with ``types`` (:func:`param_types`) each parameter
    is the value of its type (``0.1``, ``32``, ``true``), else the text the trial was given."""
    return json.dumps([{**asdict(r), "params": _typed(r.params, types or {})} for r in table], indent=1)
