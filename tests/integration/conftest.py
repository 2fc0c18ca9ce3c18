"""Fixtures for tests against real systems; today: the single-host Slurm cluster of ``scripts/slurm-up``.

The fixture and its helpers live in :mod:`integration.slurm_cluster`, so tests outside this folder (the
conformance suite) can use the same cluster; this file makes them available here and reports the start-up.
"""

from __future__ import annotations

from typing import Any

import pytest

from .docker_engine import DockerEngine, _started as _docker_started, docker_engine
from .k8s_cluster import K8sCluster, _started as _k8s_started, k8s_cluster
from .ray_cluster import RayCluster, _started as _ray_started, ray_cluster
from .slurm_cluster import SlurmCluster, _started, in_ci, slurm_cluster, unavailable
from .ssh_server import SshServer, _started as _sshd_started, ssh_server

__all__ = ["DockerEngine", "RayCluster", "ray_cluster", "K8sCluster", "SlurmCluster", "docker_engine", "k8s_cluster", "in_ci", "slurm_cluster", "unavailable", "SshServer", "ssh_server"]


def engine_lines() -> list[str]:
    """How this process had each engine it used and how long that took."""
    lines = []
    for c in _started:
        how = "started with scripts/slurm-up" if c.started_by_us else "already running"
        lines.append(f"slurm cluster: {how} in {c.startup_seconds:.1f}s, nodes {' '.join(c.nodes)}")
    for s in _sshd_started:
        lines.append(f"test sshd (scripts/sshd-up): {s.target}, ready in {s.startup_seconds:.1f}s")
    for d in _docker_started:
        how = "started with scripts/docker-up" if d.started_by_us else "already running"
        lines.append(f"docker engine: {how} in {d.startup_seconds:.1f}s")
    for r in _ray_started:
        how = "started with scripts/ray-up" if r.started_by_us else "already running"
        lines.append(f"ray head: {how} in {r.startup_seconds:.1f}s at {r.address}")
    for k in _k8s_started:
        how = "started with scripts/k8s-up" if k.started_by_us else "already running"
        lines.append(f"kubernetes cluster: {how} in {k.startup_seconds:.1f}s")
    return lines


_from_workers: list[str] = []


def pytest_sessionfinish(session: pytest.Session) -> None:
    """In a pytest-xdist worker, hand the engine lines to the controller, which prints them."""
    output = getattr(session.config, "workeroutput", None)
    if output is not None:
        output["tsm_engine_lines"] = engine_lines()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    """(pytest-xdist, in the controller) a worker ended: keep the engine lines it handed over."""
    lines = getattr(node, "workeroutput", {}).get("tsm_engine_lines", [])
    _from_workers.extend(f"{line} (worker {node.gateway.id})" for line in lines)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Say how each engine was had and how long that took, so CI logs show it."""
    for line in engine_lines() + _from_workers:
        terminalreporter.write_line(line)
