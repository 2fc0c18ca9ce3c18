"""Run tracking across a Kubernetes eviction, on the real single-node cluster of ``scripts/k8s-up``.

A replica logs to MLflow and W&B (offline), is evicted through the eviction API, and tsm's controller
restarts it as a preemption: both attempts write into **one** MLflow run and carry the same ``WANDB_RUN_ID``.
The pods run this machine's Python from the ``tsm-test/python`` image with the test's virtualenv mounted
read-only (its packages, the shared libraries they link), so the real ``mlflow`` and ``wandb`` clients run in
them; the MLflow store is an SQLite database in a folder both the test and the pods mount.
"""

from __future__ import annotations

import sysconfig
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import tsm
from integration.k8s_cluster import K8sCluster
from integration.test_kubernetes_long_runs import evict
from integration.tracker_attempts import PREEMPTED, assert_one_run_across_attempts, offline_wandb_env
from tsm.runner.api import Runner, get_runner
from tsm.schedulers.kubernetes.status import from_json
from tsm.specs.api import AppDef, AppState, Resource, Role
from tsm.specs.mounts import BindMount

pytestmark = [pytest.mark.integration, pytest.mark.kubernetes]

HANG = 400.0  # seconds: a guard against a hang, never a performance claim
LIBS = "/usr/lib/x86_64-linux-gnu"  # the libraries the virtualenv's compiled packages link (the image has Python's)

@pytest.fixture
def runner(k8s_cluster: K8sCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Runner]:
    for k in ("TSM_JOB_ID", "TORCHX_JOB_ID", "TSM_TRACKERS", "TORCHX_TRACKERS", "TSM_PARENT_RUN_ID", "TORCHX_PARENT_RUN_ID"):
        monkeypatch.delenv(k, raising=False)
    with get_runner("k8strack") as r:
        yield r
    from tsm.schedulers.kubernetes.scheduler import KubernetesScheduler

    s = KubernetesScheduler("k8strack")
    s.cleanup(include_running=True)
    s.close()


def test_an_evicted_pod_is_one_mlflow_run_and_one_wandb_id(
    runner: Runner, k8s_cluster: K8sCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("mlflow")
    pytest.importorskip("wandb")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("TSM_TRACKERS", "tsm,mlflow,wandb")
    monkeypatch.setenv("TSM_TRACKER_MLFLOW_CONFIG", uri)
    out, wdir = tmp_path / "out", tmp_path / "wandb"
    out.mkdir()
    wdir.mkdir()
    site, src = sysconfig.get_paths()["purelib"], str(Path(tsm.__file__).parents[1])
    env = {"OUT": str(out), "PYTHONPATH": f"{src}:{site}", "HOME": str(tmp_path), "GIT_PYTHON_REFRESH": "quiet",
           **offline_wandb_env(wdir)}
    mounts = [BindMount(LIBS, LIBS, read_only=True), BindMount(site, site, read_only=True),
              BindMount(src, src, read_only=True), BindMount(str(tmp_path), str(tmp_path))]
    role = Role("w", image=k8s_cluster.python_image, entrypoint="python3", args=["-c", PREEMPTED], env=env,
                mounts=mounts, resource=Resource(cpu=1, memMB=1024))  # max_retries=0: the eviction is not a failure
    handle = runner.run(AppDef("ktrack", [role]), "kubernetes", cfg={"request_fraction": 0.1, "grace_period": 2})
    app_id = handle.rsplit("/", 1)[1]
    sched = runner.scheduler("kubernetes")
    deadline = time.monotonic() + HANG
    while not (out / "attempt-0").exists():
        st = runner.status(handle)
        assert st is not None and not st.state.is_terminal, st
        assert time.monotonic() < deadline, "the first attempt never logged"
        time.sleep(0.2)
    pod = next(p.name for p in map(from_json, sched.client.list_pods(app_id)) if p.attempt == 0)
    evict(sched, pod)
    status = runner.wait(handle, timeout=HANG)
    assert status is not None and status.state == AppState.SUCCEEDED, status
    assert status.num_restarts == 1, status
    assert_one_run_across_attempts(uri, handle, out, wdir, recreated=True)  # the Job may remake the evicted pod
