"""Lockfile environments on Ray beside Ray's own ``runtime_env`` (pip), one JSON object per line.

    .venv/bin/python benchmarks/ray_env_bench.py [--packages 20] [--repeat 3]

Offline from a wheelhouse this script writes (``env_bench.make_lock``), on the head of ``scripts/ray-up``
(started when none answers, stopped after). Each round, interleaved, submit to SUCCEEDED of a one-replica
app that imports every package of the lock:

* ``tsm_cold_s``: through tsm with ``environment=uv.lock``, a key no node has built (a fresh copy of the
  wheelhouse, so a fresh key); ``tsm_warm_s``: the same key again (built on the node already);
* ``ray_pip_cold_s``: a plain Ray job with ``runtime_env={"pip": ...}`` of the same pinned requirements from
  the same fresh wheelhouse (``--no-index --find-links``), which Ray installs into a virtualenv of its own
  per distinct runtime_env; ``ray_pip_warm_s``: the same runtime_env again (Ray reuses that virtualenv);
* ``tsm_plain_s``: the tsm app without an environment (what a launch costs with no environment at all).

``--tiny`` makes 3 packages and one round, and prints ``skipped`` when no head is up: a check that the
script runs, not a measurement.
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
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for extra in (ROOT / "src", ROOT / "tests", ROOT / "benchmarks"):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

from _util import private_home  # noqa: E402
from env_bench import make_lock  # noqa: E402
from ray_bench import ADDRESS, head_up  # noqa: E402


def _requirements(lock: Path) -> list[str]:
    from tsm.env.build import uv_bin

    out = subprocess.run([uv_bin(), "export", "--quiet", "--frozen", "--no-emit-project", "--no-header", "--no-hashes",
                          "--format", "requirements-txt", "--project", str(lock.parent)],
                         check=True, capture_output=True, text=True).stdout
    return [ln.split(";")[0].strip() for ln in out.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]


def _program(packages: list[str]) -> str:
    return "import " + ", ".join(p.split("==")[0] for p in packages) + "; print('ok')"


def tsm_once(lock: Path | None, wheels: Path, program: str) -> float:
    import tsm
    from tsm.runner.api import get_runner

    env = tsm.Environment(str(lock)) if lock else None
    app = tsm.AppDef("envbench", roles=[tsm.Role("r", entrypoint="python", args=["-c", program],
                                                 resource=tsm.Resource(cpu=0.1, memMB=0), environment=env)])
    cfg: dict[str, Any] = {"address": ADDRESS, "ship_cwd": False, "find_links": [str(wheels)]}
    with get_runner("envbench") as runner:
        t0 = time.perf_counter()
        handle = runner.run(app, "ray", cfg=cfg)
        status = runner.wait(handle, wait_interval=0.1)
        seconds = time.perf_counter() - t0
    assert status is not None and status.state.name == "SUCCEEDED", status
    return seconds


def ray_pip_once(packages: list[str], wheels: Path, program: str) -> float:
    from ray.job_submission import JobStatus, JobSubmissionClient

    c = JobSubmissionClient(ADDRESS)
    env = {"pip": {"packages": packages, "pip_check": False,
                   "pip_install_options": ["--no-index", "--find-links", str(wheels)]}}
    t0 = time.perf_counter()
    jid = c.submit_job(entrypoint=f"python -c {json.dumps(program)}", runtime_env=env)
    while not c.get_job_status(jid).is_terminal():
        time.sleep(0.1)
    seconds = time.perf_counter() - t0
    assert c.get_job_status(jid) == JobStatus.SUCCEEDED, c.get_job_logs(jid)[-2000:]
    return seconds


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--packages", type=int, default=20)
    ap.add_argument("--files", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--tiny", "--smoke", action="store_true", help="3 packages, 1 round (a check, not a measurement)")
    args = ap.parse_args()
    if args.tiny:
        args.packages, args.files, args.repeat = 3, 2, 1
    try:
        import ray  # noqa: F401
    except ImportError:
        print(json.dumps({"bench": "ray_env", "skipped": "ray is not installed (pip install 'tsm[ray]')"}))
        return 0
    private_home()
    started = False
    if not head_up():
        if args.tiny:
            print(json.dumps({"bench": "ray_env", "skipped": "no Ray head is up (scripts/ray-up)"}))
            return 0
        subprocess.run(["bash", str(ROOT / "scripts" / "ray-up")], check=True)
        started = True
    rows: dict[str, list[float]] = {k: [] for k in ("tsm_cold_s", "tsm_warm_s", "ray_pip_cold_s", "ray_pip_warm_s",
                                                    "tsm_plain_s")}
    try:
        with tempfile.TemporaryDirectory(prefix="tsm-ray-env-bench-") as tmp:
            work = Path(tmp)
            lock, wheels = make_lock(work, args.packages, args.files)
            packages = _requirements(lock)
            program = _program(packages)
            for i in range(args.repeat):
                fresh = work / f"wheels{i}"  # a new folder: a new key for tsm, a new runtime_env for Ray
                shutil.copytree(wheels, fresh)
                rows["tsm_cold_s"].append(tsm_once(lock, fresh, program))
                rows["ray_pip_cold_s"].append(ray_pip_once(packages, fresh, program))
                rows["tsm_warm_s"].append(tsm_once(lock, fresh, program))
                rows["ray_pip_warm_s"].append(ray_pip_once(packages, fresh, program))
                rows["tsm_plain_s"].append(tsm_once(None, fresh, "print('ok')"))
    finally:
        if started:
            subprocess.run(["bash", str(ROOT / "scripts" / "ray-down")], check=False)
    med = {k: round(statistics.median(v), 3) for k, v in rows.items()}
    print(json.dumps({"bench": "ray_env", "packages": args.packages, "repeat": args.repeat, "median": med,
                      "rounds": {k: [round(x, 3) for x in v] for k, v in rows.items()},
                      "cold_ratio": round(med["tsm_cold_s"] / med["ray_pip_cold_s"], 2),
                      "warm_ratio": round(med["tsm_warm_s"] / med["ray_pip_warm_s"], 2),
                      "baseline": "the same app as a plain Ray job with runtime_env pip of the same pins, offline",
                      "load": [round(x, 2) for x in os.getloadavg()]}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
