"""Kubernetes scheduler figures on the cluster of ``scripts/k8s-up``, one JSON object per line.

    sudo scripts/k8s-up && .venv/bin/python benchmarks/k8s_bench.py

Lines:

* ``k8s_latency`` (replicas 1 and 32): seconds from ``submit`` to every replica seen RUNNING, and from the
  last replica's exit (``finishedAt`` Kubernetes recorded) to ``wait`` returning SUCCEEDED, for a role
  running ``sleep 3`` with a tenth of a CPU requested per replica.
* ``k8s_api_calls``: API calls one status refresh makes for an app of 1 and of 32 replicas (it is one label-
  selected pod list whatever the size), and those of one views refresh (``view_snapshot``: the same pod list,
  plus one metrics list where the cluster serves ``metrics.k8s.io``; asked once, then not while it does not).
* ``k8s_floor`` (issue 26): submit to all 32 replicas RUNNING through tsm, beside its floor in the same run,
  interleaved (``--rounds``, median): 32 bare pods of the same image, command and resources created
  concurrently through the API, until all are Running (or have ended). Target: tsm within 1.2 x the floor.

The cluster is not started here (the first build takes about 10 minutes): without a ready cluster this
prints a single ``skipped`` line and exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
IMAGE = f"tsm-test/python:{os.environ.get('TSM_TEST_IMAGE_TAG', '3')}"
KUBECONFIG = Path(os.environ.get("TSM_K8S_STATE", "/var/lib/tsm-k8s")) / "kubeconfig"


def emit(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


def cluster_ready() -> str | None:
    """None when a cluster answers (``$KUBECONFIG`` set to it), else why not."""
    try:
        import kubernetes  # noqa: F401
    except ImportError:
        return "the kubernetes client is not installed (pip install 'tsm[kubernetes]')"
    if "KUBECONFIG" not in os.environ and KUBECONFIG.exists():
        os.environ["KUBECONFIG"] = str(KUBECONFIG)
    try:
        out = subprocess.run(["kubectl", "get", "node", "-o", "name"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"kubectl: {e}"
    return None if out.returncode == 0 and out.stdout.strip() else "no Kubernetes cluster answers (sudo scripts/k8s-up)"


def bare_pods_until_running(n: int, resources: dict[str, Any], namespace: str = "default") -> float:
    """Seconds from creating ``n`` bare pods concurrently (one thread each) to all Running or ended; they are
    deleted afterwards. The floor issue 26 compares tsm's submit with: no Service, Job or tsm in between."""
    from kubernetes import client as kc, config as kconfig

    connect: Any = kconfig.new_client_from_config
    api: Any = kc.CoreV1Api(connect(str(KUBECONFIG)))
    label = f"floor-{os.getpid()}-{time.monotonic_ns()}"

    def create(i: int) -> None:
        api.create_namespaced_pod(namespace, {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{label}-{i}", "labels": {"tsm-bench-floor": label}},
            "spec": {"restartPolicy": "Never", "containers": [{
                "name": "c", "image": IMAGE, "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", "sleep 3"], "resources": resources}]},
        })

    t0 = time.monotonic()
    try:
        with ThreadPoolExecutor(n) as pool:
            list(pool.map(create, range(n)))
        while True:
            pods = api.list_namespaced_pod(namespace, label_selector=f"tsm-bench-floor={label}").items
            if len(pods) == n and all(p.status.phase in ("Running", "Succeeded") for p in pods):
                return time.monotonic() - t0
            time.sleep(0.05)
    finally:
        api.delete_collection_namespaced_pod(namespace, label_selector=f"tsm-bench-floor={label}",
                                             grace_period_seconds=0)


def tsm_until_running(s: Any, app: Any, cfg: dict[str, Any]) -> float:
    """Seconds from ``submit`` to every replica of ``app`` RUNNING (or ended), by ``describe``; then waits for its end."""
    from tsm.specs.api import AppState

    t0 = time.monotonic()
    app_id = s.submit(app, cfg)
    took = None
    while True:
        d = s.describe(app_id)
        reps = [r for rs in d.roles_statuses for r in rs.replicas] if d is not None else []
        if took is None and reps and all(r.state in (AppState.RUNNING, AppState.SUCCEEDED) for r in reps):
            took = time.monotonic() - t0
        if d is not None and d.state.is_terminal:
            return took if took is not None else -1.0
        time.sleep(0.05)


def floor_rows(s: Any, n: int, rounds: int, cfg: dict[str, Any]) -> None:
    from tsm.schedulers.kubernetes.request import _resources
    from tsm.specs.api import AppDef, Resource, Role

    role = Role("r", IMAGE, "sh", ["-c", "sleep 3"], num_replicas=n, resource=Resource(cpu=1, memMB=64))
    resources = _resources(role, float(cfg["request_fraction"]))[0]  # what tsm's pods ask for
    ours, floor = [], []
    for i in range(rounds):
        ours.append(tsm_until_running(s, AppDef(f"floor{n}x{i}", [role]), cfg))
        floor.append(bare_pods_until_running(n, resources))
    o, f = statistics.median(ours), statistics.median(floor)
    emit(bench="k8s_floor", replicas=n, unit="s to all Running, median", tsm=round(o, 2), floor=round(f, 2),
         ratio=round(o / f, 2), target="<= 1.2 x floor", met=o <= 1.2 * f, rounds=rounds,
         tsm_runs=[round(x, 2) for x in ours], floor_runs=[round(x, 2) for x in floor],
         floor_is="bare pods of the same image, command and resources, created concurrently through the API")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", "--smoke", action="store_true", help="tiny sizes; never starts the engine (smoke)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds of the k8s_floor row")
    args = ap.parse_args()
    tiny = args.tiny
    why = cluster_ready()
    if why:
        emit(bench="k8s", skipped=why)
        return
    os.environ.setdefault("TSM_HOME", tempfile.mkdtemp(prefix="tsm-k8s-bench-"))
    sys.path.insert(0, str(ROOT / "src"))
    from tsm.schedulers.kubernetes.scheduler import KubernetesScheduler
    from tsm.schedulers.kubernetes.status import parse_time
    from tsm.specs.api import AppDef, AppState, Resource, Role

    s = KubernetesScheduler("bench")
    cfg = {"request_fraction": 0.05, "gang_timeout": 600.0, "grace_period": 0}
    for n in (1,) if tiny else (1, 32):
        role = Role("r", IMAGE, "sh", ["-c", "sleep 3"], num_replicas=n, resource=Resource(cpu=1, memMB=64))
        t0 = time.monotonic()
        app_id = s.submit(AppDef(f"bench{n}", [role]), cfg)
        running = None
        calls_per_refresh = None
        view_calls: dict[str, int] = {}
        pods: list[dict[str, object]] = []
        while True:
            d = s.describe(app_id)
            assert d is not None
            reps = [r for rs in d.roles_statuses for r in rs.replicas]
            if running is None and reps and all(r.state in (AppState.RUNNING, AppState.SUCCEEDED) for r in reps):
                running = time.monotonic() - t0
                before = sum(s.client.calls.values())
                s.live_statuses(max_age=0.0)  # one refresh, however recent the last one was
                calls_per_refresh = sum(s.client.calls.values()) - before
                before_view = dict(s.client.calls)
                s.view_snapshot([app_id])  # the views' batched refresh (tsm top / tsm serve)
                view_calls = {k: v - before_view.get(k, 0) for k, v in s.client.calls.items()
                              if v != before_view.get(k, 0)}
            if d.state.is_terminal:
                break
            if running is not None:  # the pods' end times (tsm deletes the pods once the app has ended)
                pods = s.client.list_pods(app_id) or pods
            time.sleep(0.05)
        done = time.time()
        ends = [parse_time(c["state"]["terminated"].get("finishedAt")) for p in pods
                for c in p.get("status", {}).get("containerStatuses", [])  # type: ignore[attr-defined]
                if "terminated" in c.get("state", {})]
        emit(bench="k8s_latency", replicas=n, state=d.state.name, submit_to_running_s=round(running or -1, 2),
             exit_to_wait_s=round(done - max(ends), 2) if ends else None)
        emit(bench="k8s_api_calls", replicas=n, calls_per_refresh=calls_per_refresh, view_snapshot_calls=view_calls)
    floor_rows(s, 2 if tiny else 32, 1 if tiny else args.rounds, cfg)
    s.close()


if __name__ == "__main__":
    main()
