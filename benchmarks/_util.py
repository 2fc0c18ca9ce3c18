"""Shared helpers for the benchmark scripts: timing, medians, JSON output, a private TSM_HOME."""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any


def private_home() -> str:
    """Point TSM_HOME at a fresh temporary directory (so figures don't depend on old state)."""
    home = tempfile.mkdtemp(prefix="tsm-bench-")
    os.environ["TSM_HOME"] = home
    return home


def median_of(fn: Callable[[], float], runs: int) -> dict[str, float]:
    """Run ``fn`` (which returns seconds) ``runs`` times; median/min/max in milliseconds."""
    samples = [fn() for _ in range(runs)]
    return {
        "median_ms": round(statistics.median(samples) * 1000, 2),
        "min_ms": round(min(samples) * 1000, 2),
        "max_ms": round(max(samples) * 1000, 2),
        "runs": runs,
    }


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def emit(name: str, target: str | None = None, **figures: Any) -> None:
    """Print one JSON line: the benchmark's name, its figures and the target it is held to."""
    row: dict[str, Any] = {"benchmark": name, **figures}
    if target:
        row["target"] = target
    sys.stdout.write(json.dumps(row) + "\n")
    sys.stdout.flush()
