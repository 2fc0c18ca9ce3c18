"""Ray scheduler figures on the head of ``scripts/ray-up``, one JSON object per line.

    .venv/bin/python benchmarks/ray_bench.py [--replicas 1,32] [--repeat 1]

Line ``ray_latency`` per replica count: seconds from ``submit`` to the app RUNNING with every replica
running (``describe``), and from the replicas' exit (the latest exit time they print) to ``wait``
returning SUCCEEDED, for a role running ``sleep 2`` with ``cpu=0.1``. ``baseline``: the same app as one
``ray job submit`` (``JobSubmissionClient``) whose driver starts one actor per replica running the same
command (running = the last actor started its process), polled with ``get_job_status`` every 0.1 s --
what tsm adds on top of Ray. Starts the head when
none answers (and stops it after); without ``ray`` installed prints one ``skipped`` line.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ADDRESS = os.environ.get("RAY_ADDRESS", "http://127.0.0.1:8265")
REPLICA = "import time; time.sleep(2); print(f'exit {time.time():.6f}', flush=True)"
BASELINE = '''
import subprocess, sys, ray
ray.init()
@ray.remote(num_cpus=0.1)
class R:
    def run(self, code):
        import time
        started = time.time()
        return started, subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout
n = int(sys.argv[1])
outs = ray.get([R.remote().run.remote(sys.argv[2]) for _ in range(n)])
print("STARTED", max(t for t, _ in outs))
print("EXITS", max(float(o.split()[1]) for _, o in outs))
'''


def head_up() -> bool:
    import urllib.request

    try:
        urllib.request.urlopen(f"{ADDRESS}/api/jobs/", timeout=5)
    except OSError:
        return False
    return True


def tsm_once(n: int) -> dict[str, float]:
    from tsm.schedulers.ray import create_scheduler
    from tsm.specs.api import AppDef, AppState, Resource, Role

    s = create_scheduler("bench", address=ADDRESS)
    app = AppDef("bench", [Role("r", entrypoint=sys.executable, args=["-c", REPLICA], num_replicas=n,
                                resource=Resource(cpu=0.1, memMB=0))])
    t0 = time.time()
    app_id = s.submit(app)
    while True:
        d = s.describe(app_id)
        if d is not None and (d.state.is_terminal or (d.state == AppState.RUNNING and all(
                r.state == AppState.RUNNING for rs in d.roles_statuses for r in rs.replicas))):
            break
        time.sleep(0.05)
    running = time.time() - t0
    d = s.wait(app_id)
    t_wait = time.time()
    assert d is not None and d.state == AppState.SUCCEEDED, d
    exits = [float(line.split()[1]) for k in range(n) for line in s.log_iter(app_id, "r", k) if line.startswith("exit")]
    return {"submit_to_running_s": round(running, 3), "exit_to_wait_s": round(t_wait - max(exits), 3)}


def baseline_once(n: int, workdir: str) -> dict[str, float]:
    from ray.job_submission import JobStatus, JobSubmissionClient

    c = JobSubmissionClient(ADDRESS)
    t0 = time.time()
    jid = c.submit_job(entrypoint=f"python driver.py {n} {shlex.quote(REPLICA)}",
                       runtime_env={"working_dir": workdir})
    while not c.get_job_status(jid).is_terminal():
        time.sleep(0.1)
    t_wait = time.time()
    assert c.get_job_status(jid) == JobStatus.SUCCEEDED, c.get_job_logs(jid)[-2000:]
    logs = c.get_job_logs(jid).splitlines()
    started, exits = (float(next(x for x in logs if x.startswith(k)).split()[1]) for k in ("STARTED", "EXITS"))
    return {"submit_to_running_s": round(started - t0, 3), "exit_to_wait_s": round(t_wait - exits, 3)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--replicas", default="1,32")
    ap.add_argument("--repeat", type=int, default=1)
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
    try:
        with tempfile.TemporaryDirectory() as wd:
            Path(wd, "driver.py").write_text(BASELINE)
            for n in (int(x) for x in args.replicas.split(",")):
                runs = [tsm_once(n) for _ in range(args.repeat)]
                base = [baseline_once(n, wd) for _ in range(args.repeat)]
                med = {k: round(statistics.median(r[k] for r in runs), 3) for k in runs[0]}
                bmed = {k: round(statistics.median(r[k] for r in base), 3) for k in base[0]}
                print(json.dumps({"bench": "ray_latency", "replicas": n, "tsm": med, "baseline": bmed,
                                  "repeat": args.repeat}), flush=True)
    finally:
        if started:
            subprocess.run(["bash", str(ROOT / "scripts" / "ray-down")], check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
