"""Ray scheduler figures on the head of ``scripts/ray-up``, one JSON object per line.

    .venv/bin/python benchmarks/ray_bench.py [--replicas 1,32] [--repeat 3] [--cpu 0.05]

Line ``ray_latency`` per replica count, the median of ``--repeat`` interleaved rounds (tsm, then the floor,
then tsm again...), each round's figures listed too:

* ``tsm.submit_to_running_s``: seconds from ``submit`` to ``describe`` showing the app RUNNING with every
  replica RUNNING, for a role running a short Python sleep with ``cpu=--cpu`` and no memory (tiny, so 32
  replicas fit on the 8-CPU head beside other work); ``exit_to_wait_s``: from the replicas' exit (the latest
  exit time they print) to ``wait`` returning SUCCEEDED. Phases, from the submit: ``submit_s``
  (``submit`` returned: packaging, upload, job creation) and, on a head running on this machine,
  ``driver_s`` (the driver's status record appeared: the job started, the driver ran ``ray.init``); the
  rest is placing the group, starting the actors, starting the replicas and ``describe`` seeing it.
* ``floor.submit_to_running_s``: the floor issue 26 names -- a plain ``ray job submit`` (``JobSubmissionClient``,
  a one-file ``working_dir``) whose driver creates one placement group of N bundles of the same size and N
  plain actors at once, each pinned to its bundle, and waits until every one answers; seconds from the
  submit to the driver's ``ALIVE`` time; ``driver_s`` (the driver's ``ray.init`` returned) and ``pg_s``
  (the group placed), from the submit.

Both run from a scratch directory holding one file (tsm ships it as the implicit working directory, as a
user launching from a small project would). Starts the head when none answers (and stops it after);
without ``ray`` installed prints one ``skipped`` line.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
ADDRESS = os.environ.get("RAY_ADDRESS", "http://127.0.0.1:8265")
#: The head's log directory when it runs here (scripts/ray-up): where the tsm driver writes its status record.
LOCAL_LOGS = Path(os.environ.get("RAY_TMPDIR", "/tmp/ray")) / "session_latest" / "logs"
REPLICA = "import time; time.sleep(2); print(f'exit {time.time():.6f}', flush=True)"
FLOOR = '''
import sys, time, ray
from ray.util.placement_group import placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
ray.init(logging_level=30, log_to_driver=False)
print("DRIVER", time.time(), flush=True)
n, cpu = int(sys.argv[1]), float(sys.argv[2])
pg = placement_group([{"CPU": cpu}] * n, strategy="SPREAD")
ray.get(pg.ready())
print("PG", time.time(), flush=True)
@ray.remote(num_cpus=0)
class A:
    def ping(self):
        return 1
actors = [A.options(num_cpus=cpu, scheduling_strategy=PlacementGroupSchedulingStrategy(
    pg, placement_group_bundle_index=i)).remote() for i in range(n)]
ray.get([a.ping.remote() for a in actors])
print("ALIVE", time.time(), flush=True)
'''


def head_up() -> bool:
    import urllib.request

    try:
        urllib.request.urlopen(f"{ADDRESS}/api/jobs/", timeout=5)
    except OSError:
        return False
    return True


def tsm_once(n: int, cpu: float) -> dict[str, float]:
    from tsm.schedulers.ray import create_scheduler
    from tsm.specs.api import AppDef, AppState, Resource, Role

    s = create_scheduler("bench", address=ADDRESS)
    app = AppDef("bench", [Role("r", entrypoint=sys.executable, args=["-c", REPLICA], num_replicas=n,
                                resource=Resource(cpu=cpu, memMB=0))])
    t0 = time.time()
    app_id = s.submit(app)
    marks: dict[str, float] = {"submit_s": time.time() - t0}
    record = LOCAL_LOGS / "tsm" / app_id / "status.json"  # the driver's status record, on a local head
    while True:
        d = s.describe(app_id)
        now = time.time() - t0
        reps = [r for rs in (d.roles_statuses if d else []) for r in rs.replicas]
        if "driver_s" not in marks and record.exists():
            marks["driver_s"] = now
        if d is not None and (d.state.is_terminal or (d.state == AppState.RUNNING and len(reps) == n and all(
                r.state == AppState.RUNNING for r in reps))):
            break
        time.sleep(0.05)
    running = time.time() - t0
    d = s.wait(app_id)
    t_wait = time.time()
    assert d is not None and d.state == AppState.SUCCEEDED, d
    exits = [float(line.split()[1]) for k in range(n) for line in s.log_iter(app_id, "r", k) if line.startswith("exit")]
    s.close()
    return {"submit_to_running_s": round(running, 3), "exit_to_wait_s": round(t_wait - max(exits), 3),
            **{k: round(v, 3) for k, v in marks.items()}}


def floor_once(n: int, cpu: float, workdir: str) -> dict[str, float]:
    from ray.job_submission import JobStatus, JobSubmissionClient

    c = JobSubmissionClient(ADDRESS)
    t0 = time.time()
    jid = c.submit_job(entrypoint=f"python floor.py {n} {cpu}", runtime_env={"working_dir": workdir})
    while not c.get_job_status(jid).is_terminal():
        time.sleep(0.1)
    logs = c.get_job_logs(jid)
    assert c.get_job_status(jid) == JobStatus.SUCCEEDED, logs[-2000:]
    at = {k: float(next(x for x in logs.splitlines() if x.startswith(k)).split()[1]) - t0 for k in ("DRIVER", "PG", "ALIVE")}
    return {"submit_to_running_s": round(at["ALIVE"], 3), "driver_s": round(at["DRIVER"], 3), "pg_s": round(at["PG"], 3)}


def _median(runs: list[dict[str, float]]) -> dict[str, float]:
    """Each figure's median over the rounds that have it (``driver_s`` only where the record was seen)."""
    keys = dict.fromkeys(k for r in runs for k in r)
    return {k: round(statistics.median(r[k] for r in runs if k in r), 3) for k in keys}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--replicas", default="1,32")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cpu", type=float, default=0.05, help="CPU per replica (tsm's role and the floor's bundles)")
    ap.add_argument("--tiny", "--smoke", action="store_true", help="tiny sizes: checks that the benchmark still runs")
    args = ap.parse_args()
    if args.tiny:
        args.replicas, args.repeat = "1", 1
    try:
        import ray  # noqa: F401
    except ImportError:
        print(json.dumps({"bench": "ray_latency", "skipped": "ray is not installed (pip install 'tsm[ray]')"}))
        return 0
    started = False
    if not head_up():
        if args.tiny:  # smoke: never start an engine
            print(json.dumps({"bench": "ray_latency", "skipped": "no Ray head is up (scripts/ray-up)"}))
            return 0
        subprocess.run(["bash", str(ROOT / "scripts" / "ray-up")], check=True)
        started = True
    here = os.getcwd()
    try:
        with tempfile.TemporaryDirectory() as wd:
            Path(wd, "floor.py").write_text(FLOOR)
            os.chdir(wd)  # tsm ships the launching directory: this one-file one, as the floor ships
            for n in (int(x) for x in args.replicas.split(",")):
                runs: list[dict[str, float]] = []
                base: list[dict[str, float]] = []
                for _ in range(args.repeat):
                    runs.append(tsm_once(n, args.cpu))
                    base.append(floor_once(n, args.cpu, wd))
                out: dict[str, Any] = {
                    "bench": "ray_latency", "replicas": n, "cpu": args.cpu, "repeat": args.repeat,
                    "tsm": _median(runs), "floor": _median(base),
                    "ratio": round(_median(runs)["submit_to_running_s"] / _median(base)["submit_to_running_s"], 2),
                    "rounds": {"tsm": [r["submit_to_running_s"] for r in runs],
                               "floor": [r["submit_to_running_s"] for r in base]},
                    "load": [round(x, 2) for x in os.getloadavg()]}
                print(json.dumps(out), flush=True)
    finally:
        with contextlib.suppress(OSError):
            os.chdir(here)
        if started:
            subprocess.run(["bash", str(ROOT / "scripts" / "ray-down")], check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
