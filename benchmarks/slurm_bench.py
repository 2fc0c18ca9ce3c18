"""Slurm scheduler figures on the local test cluster, one JSON object per line.

    .venv/bin/python benchmarks/slurm_bench.py          # as root it starts the cluster (scripts/slurm-up)

Lines:

* ``slurm_latency``: for a trivial two-role app (trainer x2, ps x1, each ``true``), the seconds from
  submission to the first replica seen running and to the app seen SUCCEEDED (median of 3 runs; the app
  is watched with ``describe`` every 50 ms, so figures are within about 50 ms).
* ``slurm_wait_load``: the Slurm commands this process ran while 20 threads each ``wait`` on their own
  app for 30 s, against the number of ``describe`` polls those waits made: the shared
  :class:`tsm.schedulers.slurm.SlurmQueries` turns many polls into few ``squeue`` calls.

Without a cluster and without root to start one, prints a single ``skipped`` line and exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def emit(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


def cluster_ready(start: bool = True) -> str | None:
    """None when a cluster answers (starting it if we are root and ``start``), else why not."""
    if start and os.geteuid() == 0:
        proc = subprocess.run(["bash", str(ROOT / "scripts" / "slurm-up")], capture_output=True, text=True)
        if proc.returncode != 0:
            return f"scripts/slurm-up failed: {proc.stderr.strip()[-300:]}"
    if shutil.which("sinfo") is None:
        return "no Slurm here: run scripts/slurm-up as root"
    proc = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True)
    if proc.returncode != 0 or not proc.stdout.strip():
        return "the Slurm controller does not answer: run scripts/slurm-up as root"
    return None


def latency(runs: int = 3) -> None:
    from tsm.schedulers.slurm import create_scheduler
    from tsm.specs.api import AppDef, AppState, Resource, Role

    sched = create_scheduler("bench")
    res = Resource(cpu=1, memMB=100)
    app = AppDef("bench", [Role("trainer", entrypoint="true", num_replicas=2, resource=res),
                           Role("ps", entrypoint="true", resource=res)])  # fmt: skip
    to_running: list[float] = []
    to_done: list[float] = []
    submit: list[float] = []
    for _ in range(runs):
        info = sched.submit_dryrun(app)
        t0 = time.monotonic()
        app_id = sched.schedule(info)
        submit.append(time.monotonic() - t0)
        first = None
        while True:
            d = sched.describe(app_id, max_age=0.0)
            now = time.monotonic() - t0
            started = d is not None and any(
                r.state in (AppState.RUNNING, AppState.SUCCEEDED) or r.exit_code is not None
                for rs in d.roles_statuses
                for r in rs.replicas
            )
            if first is None and started:
                first = now
            if d is not None and d.state.is_terminal:
                assert d.state == AppState.SUCCEEDED, d
                to_done.append(now)
                to_running.append(first if first is not None else now)
                break
            time.sleep(0.05)
    emit(
        bench="slurm_latency",
        app="trainer x2 + ps x1, each 'true'",
        runs=runs,
        sbatch_s=round(statistics.median(submit), 3),
        submit_to_first_replica_running_s=round(statistics.median(to_running), 3),
        submit_to_succeeded_s=round(statistics.median(to_done), 3),
        all_to_succeeded_s=[round(x, 3) for x in to_done],
    )


def wait_load(apps: int = 20, seconds: float = 30.0) -> None:
    from tsm.schedulers import slurm
    from tsm.specs.api import AppDef, Resource, Role

    sched = slurm.create_scheduler("bench")
    app = AppDef("waitload", [Role("w", entrypoint="sleep", args=["120"], resource=Resource(cpu=1, memMB=50))])
    ids = [sched.submit(app) for _ in range(apps)]
    polls = 0
    lock = threading.Lock()
    real_describe = sched.describe

    def counting_describe(app_id: str, max_age: float = 1.0) -> object:
        nonlocal polls
        with lock:
            polls += 1
        return real_describe(app_id, max_age=max_age)

    sched.describe = counting_describe  # type: ignore[method-assign,assignment]
    before = slurm.command_counts()
    threads = [threading.Thread(target=sched.wait, args=(i, seconds)) for i in ids]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - t0
    after = slurm.command_counts()
    used = {k: after.get(k, 0) - before.get(k, 0) for k in after if after.get(k, 0) - before.get(k, 0)}
    for app_id in ids:
        sched.cancel(app_id)
    emit(
        bench="slurm_wait_load",
        apps=apps,
        wait_s=round(elapsed, 1),
        describe_polls=polls,
        slurm_commands=used,
        slurm_commands_total=sum(used.values()),
        commands_per_second=round(sum(used.values()) / elapsed, 2),
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", "--smoke", action="store_true", help="tiny sizes; never starts the engine (smoke)")
    tiny = ap.parse_args().tiny
    why = cluster_ready(start=not tiny)
    if why is not None:
        emit(bench="slurm", skipped=why)
        return 0
    os.environ["TSM_HOME"] = tempfile.mkdtemp(prefix="tsm-slurm-bench-")
    try:
        latency(1 if tiny else 3)
        wait_load(*((2, 5.0) if tiny else (20, 30.0)))
    finally:
        shutil.rmtree(os.environ["TSM_HOME"], ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
