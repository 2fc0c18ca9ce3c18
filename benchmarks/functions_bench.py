#!/usr/bin/env python3
"""Benchmark functions as jobs (issue 41): submit -> result, a map with a cap, on local and on Slurm.

Prints one JSON object per line, each beside its baseline:

* ``functions_local``: ``runner.submit(f, i).result()`` of a trivial function on the local scheduler (a
  detached app whose replica starts Python, loads the call and sends the outcome back), median of ``--runs``;
* ``process_pool``: the same call through ``concurrent.futures.ProcessPoolExecutor``: with a new pool per call
  (a fresh worker process each: the physical floor of "a new Python process runs my function") and on a warm
  pool (the process is already there: no job at all);
* ``submitit_local``: real submitit 1.5.4's ``LocalExecutor`` on the same call;
* ``functions_map_local``: ``runner.map(f, range(N), parallel=P)`` to its last result (1,000 items, 32 at a time);
  ``submitit_map_array_local``: submitit's ``map_array`` (it has no cap and starts every job, a Python process
  each, at once, so it runs at most :data:`SUBMITIT_MAX` items);
* on the Slurm cluster of ``scripts/slurm-up`` (skipped when it is not up): ``functions_slurm`` and
  ``submitit_slurm`` (submit -> result), ``functions_map_slurm`` and ``submitit_map_array_slurm`` (a job array
  of ``--slurm-items`` items, ``--parallel`` at a time), side by side on the same partition.

Real submitit runs in a virtualenv of its own (``--submitit-python``, else one built once in
``~/.cache/tsm/submitit-bench-venv-<key>`` with ``pip install submitit==1.5.4``): in tsm's environment
``import submitit`` must stay unresolved (it is what the alias answers). Run: ``python
benchmarks/functions_bench.py`` (``--tiny``: a few runs and 20 items, for ``make bench-smoke``). Figures depend
on load: run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"
if str(SRC) not in sys.path:
    sys.path.insert(0, str(SRC))

from _util import emit, private_home  # noqa: E402

SUBMITIT = "submitit==1.5.4"
SUBMITIT_MAX = 100
PARTITION = "debug"

#: what the submitit virtualenv runs: one JSON line of figures for ``mode`` (local, slurm)
SUBMITIT_SCRIPT = r"""
import json, statistics, sys, time
import submitit

def ident(x):
    return x

mode, folder, runs, items = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
if mode == "local":
    ex = submitit.LocalExecutor(folder)
    ex.update_parameters(timeout_min=10)
else:
    ex = submitit.SlurmExecutor(folder)
    ex.update_parameters(time=10, partition=sys.argv[5], array_parallelism=int(sys.argv[6]), cpus_per_task=1)
ex.submit(ident, -1).result()  # warm: the first job of a folder
samples = []
for i in range(runs):
    t = time.perf_counter(); assert ex.submit(ident, i).result() == i; samples.append(time.perf_counter() - t)
t = time.perf_counter()
jobs = ex.map_array(ident, range(items))
assert [j.result() for j in jobs] == list(range(items))
array_s = time.perf_counter() - t
print(json.dumps({"median_ms": round(statistics.median(samples) * 1000, 1), "min_ms": round(min(samples) * 1000, 1),
                  "runs": runs, "array_items": items, "array_wall_s": round(array_s, 2)}))
"""


def ident(x: int) -> int:
    return x


def _median(samples: list[float]) -> dict[str, float]:
    return {"median_ms": round(statistics.median(samples) * 1000, 1), "min_ms": round(min(samples) * 1000, 1),
            "runs": len(samples)}


def bench_functions(runner: object, scheduler: str, runs: int, **options: object) -> dict[str, float]:
    submit = runner.submit  # type: ignore[attr-defined]
    assert submit(ident, -1, scheduler=scheduler, **options).result() == -1  # warm: launcher, imports
    samples = []
    for i in range(runs):
        t = time.perf_counter()
        assert submit(ident, i, scheduler=scheduler, **options).result() == i
        samples.append(time.perf_counter() - t)
    return _median(samples)


def bench_process_pool(runs: int) -> None:
    cold = []
    for i in range(runs):
        t = time.perf_counter()
        with concurrent.futures.ProcessPoolExecutor(max_workers=1) as pool:
            assert pool.submit(ident, i).result() == i
        cold.append(time.perf_counter() - t)
    with concurrent.futures.ProcessPoolExecutor(max_workers=1) as pool:
        pool.submit(ident, -1).result()
        warm = []
        for i in range(runs):
            t = time.perf_counter()
            pool.submit(ident, i).result()
            warm.append(time.perf_counter() - t)
    emit("process_pool", new_pool_per_call=_median(cold), warm_pool=_median(warm),
         note="a new pool per call starts one Python process (the floor of a job); a warm pool runs no job at all")


def bench_map(runner: object, scheduler: str, items: int, parallel: int, **options: object) -> dict[str, float]:
    t = time.perf_counter()
    jobs = runner.map(ident, range(items), parallel=parallel, scheduler=scheduler, **options)  # type: ignore[attr-defined]
    assert jobs.results() == list(range(items))
    wall = time.perf_counter() - t
    return {"items": items, "parallel": parallel, "wall_s": round(wall, 2), "items_per_s": round(items / wall, 1)}


def submitit_python(given: str | None) -> str:
    """An interpreter with real submitit (given, or a cached virtualenv built once)."""
    if given:
        return given
    key = hashlib.sha256(f"{SUBMITIT}\n{sys.version.split()[0]}".encode()).hexdigest()[:16]
    venv = Path.home() / ".cache" / "tsm" / f"submitit-bench-venv-{key}"
    if not (venv / ".complete").exists():
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", SUBMITIT], check=True)
        (venv / ".complete").write_text(SUBMITIT + "\n")
    return str(venv / "bin" / "python")


def bench_submitit(python: str, mode: str, runs: int, items: int, parallel: int) -> dict[str, object] | None:
    with tempfile.TemporaryDirectory(prefix="tsm-submitit-bench-") as folder:
        script = Path(folder) / "bench.py"
        script.write_text(SUBMITIT_SCRIPT)
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TSM_SUBMITIT_ALIAS")}
        proc = subprocess.run([python, str(script), mode, str(Path(folder) / "jobs"), str(runs), str(items),
                               PARTITION, str(parallel)], capture_output=True, text=True, env=env, cwd=folder)
    if proc.returncode != 0:
        emit(f"submitit_{mode}", skipped=f"real submitit failed: {proc.stderr.strip()[-300:]}")
        return None
    row: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    return row


def slurm_up() -> bool:
    if shutil.which("sinfo") is None:
        return False
    out = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True)
    return out.returncode == 0 and any(s in out.stdout for s in ("idle", "mix", "alloc"))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--tiny", action="store_true", help="3 runs and 20 items (a smoke run, not a measurement)")
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--items", type=int, default=1000)
    p.add_argument("--parallel", type=int, default=32)
    p.add_argument("--slurm-items", type=int, default=100)
    p.add_argument("--submitit-python", help="an interpreter with submitit==1.5.4 (default: a cached virtualenv)")
    p.add_argument("--no-slurm", action="store_true")
    args = p.parse_args()
    runs, items, slurm_items = (3, 20, 8) if args.tiny else (args.runs, args.items, args.slurm_items)
    private_home()
    from tsm import get_runner

    python = submitit_python(args.submitit_python)
    with get_runner() as runner:
        emit("functions_local", **bench_functions(runner, "local", runs),
             note="submit -> result of a trivial function: a detached local app, a replica's Python, the outcome")
        bench_process_pool(runs)
        real = bench_submitit(python, "local", runs, min(items, SUBMITIT_MAX), args.parallel)
        if real is not None:
            emit("submitit_local", median_ms=real["median_ms"], min_ms=real["min_ms"], runs=real["runs"])
        emit("functions_map_local", **bench_map(runner, "local", items, args.parallel))
        if real is not None:
            emit("submitit_map_array_local", items=real["array_items"], wall_s=real["array_wall_s"],
                 items_per_s=round(float(real["array_items"]) / float(real["array_wall_s"]), 1),
                 note="no cap: every job starts at once, so at most a hundred")
        if args.no_slurm or not slurm_up():
            emit("functions_slurm", skipped="no Slurm cluster up (scripts/slurm-up)")
            return 0
        emit("functions_slurm", **bench_functions(runner, "slurm", max(3, runs // 4), partition=PARTITION))
        emit("functions_map_slurm", **bench_map(runner, "slurm", slurm_items, args.parallel, partition=PARTITION))
    real = bench_submitit(python, "slurm", max(3, runs // 4), slurm_items, args.parallel)
    if real is not None:
        emit("submitit_slurm", median_ms=real["median_ms"], min_ms=real["min_ms"], runs=real["runs"])
        emit("submitit_map_array_slurm", items=real["array_items"], parallel=args.parallel, wall_s=real["array_wall_s"],
             items_per_s=round(float(real["array_items"]) / float(real["array_wall_s"]), 1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
