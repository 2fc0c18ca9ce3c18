"""Kubernetes scheduler figures on the cluster of ``scripts/k8s-up``, one JSON object per line.

    sudo scripts/k8s-up && .venv/bin/python benchmarks/k8s_bench.py

Lines:

* ``k8s_latency`` (replicas 1 and 32): seconds from ``submit`` to every replica seen RUNNING, and from the
  last replica's exit (``finishedAt`` Kubernetes recorded) to ``wait`` returning SUCCEEDED, for a role
  running ``sleep 3`` with a tenth of a CPU requested per replica.
* ``k8s_api_calls``: API calls one status refresh makes for an app of 1 and of 32 replicas (it is one label-
  selected pod list whatever the size), and those of one views refresh (``view_snapshot``: the same pod list,
  plus one metrics list where the cluster serves ``metrics.k8s.io``; asked once, then not while it does not).

The cluster is not started here (the first build takes about 10 minutes): without a ready cluster this
prints a single ``skipped`` line and exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", "--smoke", action="store_true", help="tiny sizes; never starts the engine (smoke)")
    tiny = ap.parse_args().tiny
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
                s._watcher.invalidate()
                s.describe(app_id)
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
    s.close()


if __name__ == "__main__":
    main()
