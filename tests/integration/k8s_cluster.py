"""The Kubernetes cluster of ``scripts/k8s-up`` as a pytest fixture (the ``slurm_cluster`` pattern).

``k8s_cluster`` runs ``scripts/k8s-up`` once per session as root (builds Kubernetes the first time, about
10 minutes, cached in ``~/.cache/tsm/k8s``; starts etcd, the control plane and a kubelet on the machine's
Docker engine, whose ``tsm-test/python`` image the pods run). Without root it uses a cluster that already
answers at ``$KUBECONFIG`` and skips when there is none; under CI (``CI=true``) it never skips.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from .docker_engine import DOCKER_UP, PYTHON_IMAGE, TORCH_IMAGE
from .slurm_cluster import in_ci

ROOT = Path(__file__).resolve().parents[2]
K8S_UP = ROOT / "scripts" / "k8s-up"
STATE = Path(os.environ.get("TSM_K8S_STATE", "/var/lib/tsm-k8s"))


def unavailable(reason: str) -> None:
    """Skip saying how to enable the Kubernetes tests, or fail under CI."""
    if in_ci():
        pytest.fail(f"{reason} (CI=true: integration tests must run)", pytrace=False)
    pytest.skip(f"{reason}: run scripts/k8s-up as root (or run the tests as root, which runs it for you)")


def kubectl(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``kubectl ARGS`` against the test cluster."""
    return subprocess.run(["kubectl", *args], capture_output=True, text=True, timeout=timeout, check=False)


@dataclass(frozen=True)
class K8sCluster:
    """The cluster the tests use and how long having it took."""

    kubeconfig: str
    started_by_us: bool
    startup_seconds: float
    python_image: str = PYTHON_IMAGE
    torch_image: str = TORCH_IMAGE


_started: list[K8sCluster] = []


@pytest.fixture(scope="session")
def k8s_cluster() -> K8sCluster:
    """A ready single-node cluster (started with ``scripts/k8s-up`` when root); sets ``$KUBECONFIG``."""
    try:
        import kubernetes  # noqa: F401
    except ImportError:
        unavailable("the kubernetes client is not installed (pip install 'tsm[kubernetes]')")
    start = time.monotonic()
    started = False
    if os.geteuid() == 0:
        env = {**os.environ, "WITH_TORCH": os.environ.get("WITH_TORCH", "1")}
        proc = subprocess.run(["bash", str(DOCKER_UP)], capture_output=True, text=True, timeout=1200, env=env)
        sys.stderr.write(proc.stdout + proc.stderr)
        if proc.returncode != 0:
            unavailable(f"scripts/docker-up failed (exit {proc.returncode}): {(proc.stderr or proc.stdout)[-2000:]}")
        # k8s-up waits for a first build still running in the background (make k8s-build-bg), which on a busy
        # machine may take well over half an hour: the limit is CI's own (90 min) less the time to report
        proc = subprocess.run(["bash", str(K8S_UP)], capture_output=True, text=True, timeout=4800)
        sys.stderr.write(proc.stdout + proc.stderr)
        if proc.returncode != 0:
            unavailable(f"scripts/k8s-up failed (exit {proc.returncode}): {(proc.stderr or proc.stdout)[-2000:]}")
        started = True
    kubeconfig = str(STATE / "kubeconfig") if (STATE / "kubeconfig").exists() else os.environ.get("KUBECONFIG", "")
    if not kubeconfig:
        unavailable("no Kubernetes cluster (no kubeconfig)")
    os.environ["KUBECONFIG"] = kubeconfig
    # a node that k8s-up saw Ready may report NotReady for a while on a loaded machine (its kubelet's status
    # update came late): wait for the condition, as a user's `kubectl wait` would, before giving up
    ready = kubectl("wait", "--for=condition=Ready", "node/node1", "--timeout=180s", timeout=200)
    if ready.returncode != 0:
        state = kubectl("get", "node", "node1", "-o", "jsonpath={.status.conditions[?(@.type==\"Ready\")].message}")
        unavailable(f"the Kubernetes node is not Ready ({ready.stderr.strip() or state.stdout.strip()})")
    cluster = K8sCluster(kubeconfig, started, time.monotonic() - start)
    _started.append(cluster)
    return cluster
