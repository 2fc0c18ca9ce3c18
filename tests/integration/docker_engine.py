"""The Docker engine of ``scripts/docker-up`` as a pytest fixture (the ``slurm_cluster`` pattern).

``docker_engine`` runs ``scripts/docker-up`` once per session as root (installs docker.io the first time,
starts dockerd, builds the test images, cached by tag: later runs only check). Without root it uses an
engine that already answers and skips when there is none; under CI (``CI=true``) it never skips.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from .slurm_cluster import in_ci

ROOT = Path(__file__).resolve().parents[2]
DOCKER_UP = ROOT / "scripts" / "docker-up"
TAG = os.environ.get("TSM_TEST_IMAGE_TAG", "3")
PYTHON_IMAGE = f"tsm-test/python:{TAG}"
TORCH_IMAGE = f"tsm-test/torch:{TAG}"


def unavailable(reason: str) -> None:
    """Skip saying how to enable the Docker tests, or fail under CI."""
    if in_ci():
        pytest.fail(f"{reason} (CI=true: integration tests must run)", pytrace=False)
    pytest.skip(f"{reason}: run scripts/docker-up as root (or run the tests as root, which runs it for you)")


def engine_up() -> bool:
    """True when a Docker engine answers and the test image is present."""
    try:
        proc = subprocess.run(["docker", "image", "inspect", PYTHON_IMAGE], capture_output=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0


@dataclass(frozen=True)
class DockerEngine:
    """The engine the tests use and how long having it took."""

    started_by_us: bool
    startup_seconds: float
    python_image: str = PYTHON_IMAGE
    torch_image: str = TORCH_IMAGE


_started: list[DockerEngine] = []


@pytest.fixture(scope="session")
def docker_engine() -> DockerEngine:
    """A running Docker engine with the test images (started with ``scripts/docker-up`` when root)."""
    try:
        import docker  # noqa: F401
    except ImportError:
        unavailable("the docker SDK is not installed (pip install 'tsm[docker]')")
    start = time.monotonic()
    started = False
    if os.geteuid() == 0:
        proc = subprocess.run(["bash", str(DOCKER_UP)], capture_output=True, text=True, timeout=1200)
        sys.stderr.write(proc.stdout + proc.stderr)
        if proc.returncode != 0:
            unavailable(f"scripts/docker-up failed (exit {proc.returncode}): {(proc.stderr or proc.stdout)[-2000:]}")
        started = True
    if not engine_up():
        unavailable(f"no Docker engine answers with the image {PYTHON_IMAGE}")
    engine = DockerEngine(started, time.monotonic() - start)
    _started.append(engine)
    return engine
