"""The single-host Slurm cluster of ``scripts/slurm-up`` as a pytest fixture, for any test module that needs it.

Imported by ``tests/integration/conftest.py`` and by the conformance suite (``tests/schedulers``), which
runs the same contract against the real cluster.

The ``slurm_cluster`` fixture starts the cluster once per test session by running ``scripts/slurm-up``
(as root: it installs Debian's Slurm packages the first time, about 20 s, and about 2 s when they are
there; when the cluster already runs it only checks, well under a second). Without root, tests use a
cluster that is already up and skip when there is none, saying how to enable them. Under CI
(``CI=true``) they never skip: anything missing is a failure.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SLURM_UP = ROOT / "scripts" / "slurm-up"
ENABLE = "run scripts/slurm-up as root (or run the tests as root, which runs it for you)"


def in_ci() -> bool:
    """True under CI (``CI=true``), where integration tests must run rather than skip."""
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def unavailable(reason: str) -> None:
    """Skip with ``reason`` and how to enable the tests, or fail under CI, where skipping is not allowed."""
    if in_ci():
        pytest.fail(f"{reason} (CI=true: integration tests must run)", pytrace=False)
    pytest.skip(f"{reason}: {ENABLE}")


def cluster_up() -> bool:
    """True when this host's Slurm controller answers and has an idle or busy node."""
    if shutil.which("sinfo") is None:
        return False
    try:
        proc = subprocess.run(["sinfo", "-h", "-o", "%D %t"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0 and any(
        state in line for line in proc.stdout.splitlines() for state in ("idle", "mix", "alloc")
    )


@dataclass(frozen=True)
class SlurmCluster:
    """The cluster the tests use: how it was started and how long that took."""

    started_by_us: bool
    startup_seconds: float
    nodes: list[str]


_started: list[SlurmCluster] = []


@pytest.fixture(scope="session")
def slurm_cluster() -> SlurmCluster:
    """A running Slurm cluster (started with ``scripts/slurm-up`` when we are root)."""
    start = time.monotonic()
    started = False
    if os.geteuid() == 0:
        proc = subprocess.run(["bash", str(SLURM_UP)], capture_output=True, text=True, timeout=900)
        sys.stderr.write(proc.stdout + proc.stderr)
        if proc.returncode != 0:
            unavailable(
                f"scripts/slurm-up failed (exit {proc.returncode}): {(proc.stderr or proc.stdout)[-2000:]}"
            )
        started = True
    elif not cluster_up():
        unavailable("no Slurm cluster is running and only root can start one")
    if not cluster_up():
        unavailable("the Slurm cluster does not answer (sinfo)")
    nodes = subprocess.run(
        ["sinfo", "-h", "-N", "-o", "%N"], capture_output=True, text=True, check=True
    ).stdout.split()
    cluster = SlurmCluster(
        started_by_us=started, startup_seconds=time.monotonic() - start, nodes=sorted(set(nodes))
    )
    _started.append(cluster)
    return cluster
