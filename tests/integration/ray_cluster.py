"""The Ray head of ``scripts/ray-up`` as a pytest fixture (the ``slurm_cluster`` pattern).

``ray_cluster`` starts a single-node head once per session (8 logical CPUs, job API on 127.0.0.1:8265)
unless one already answers, and stops it at the end if it started it. Without ``ray`` installed or when
the head cannot start it skips saying why -- except under CI (``CI=true``), where it fails.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from .slurm_cluster import in_ci

ROOT = Path(__file__).resolve().parents[2]
ADDRESS = os.environ.get("TSM_TEST_RAY_ADDRESS", "http://127.0.0.1:8265")


def unavailable(reason: str) -> None:
    """Skip saying how to enable the Ray tests, or fail under CI."""
    if in_ci():
        pytest.fail(f"{reason} (CI=true: integration tests must run)", pytrace=False)
    pytest.skip(f"{reason}: `make ray-up` (pip install 'tsm[ray]' first)")


def head_up() -> bool:
    """Whether the head answers and its node is alive: a dashboard can outlive a dead raylet (then the
    jobs API answers while nothing can run)."""
    import json
    import urllib.request

    try:
        urllib.request.urlopen(f"{ADDRESS}/api/jobs/", timeout=5)
        with urllib.request.urlopen(f"{ADDRESS}/api/v0/nodes?detail=1&limit=10000", timeout=30) as resp:
            nodes = json.load(resp)["data"]["result"]["result"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return any(n.get("is_head_node") and n.get("state") == "ALIVE" for n in nodes)


@contextlib.contextmanager
def bringup_lock() -> Iterator[None]:
    """Held while a session looks for the head and starts it: another session doing the same (a test run beside
    this one) waits, then finds the head up, instead of its ``ray-down`` stopping the head just started."""
    path = Path(tempfile.gettempdir()) / "tsm-ray-up.lock"
    try:
        f = open(path, "a")  # noqa: SIM115 (held for the block below)
    except OSError:  # another user's lock file: go on without it
        yield
        return
    with f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


@dataclass(frozen=True)
class RayCluster:
    """The head the tests use and how long having it took."""

    address: str
    started_by_us: bool
    startup_seconds: float


_started: list[RayCluster] = []


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[RayCluster]:
    """A running Ray head (started with ``scripts/ray-up`` when none answers; stopped after if so)."""
    try:
        import ray  # noqa: F401
    except ImportError:
        unavailable("ray is not installed (pip install 'tsm[ray]')")
    start = time.monotonic()
    started = False
    with bringup_lock():
        if not head_up():
            # what is left of a head that died (a GCS without its raylet) would refuse a new one: stop it first
            subprocess.run(["bash", str(ROOT / "scripts" / "ray-down")], capture_output=True, timeout=120)
            proc = subprocess.run(["bash", str(ROOT / "scripts" / "ray-up")], capture_output=True, text=True,
                                  timeout=300)
            sys.stderr.write(proc.stdout + proc.stderr)
            if proc.returncode != 0 or not head_up():
                unavailable(f"scripts/ray-up failed (exit {proc.returncode}): {(proc.stderr or proc.stdout)[-2000:]}")
            started = True
    cluster = RayCluster(ADDRESS, started, time.monotonic() - start)
    _started.append(cluster)
    yield cluster
    if started:
        subprocess.run(["bash", str(ROOT / "scripts" / "ray-down")], capture_output=True, timeout=120)
