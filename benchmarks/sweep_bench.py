#!/usr/bin/env python3
"""Benchmark sweeps (issue 24): 1,000 trials of ``/bin/true`` with ``--parallel 32`` on the local scheduler.

Prints one JSON object per line:

* ``sweep_local``: trials per second from ``run_sweep`` to the sweep's end, and the CPU the detached sweep
  controller itself used (it submits every trial through the Runner and waits on each);
* ``popen_floor``: the same trials as a plain Python loop of ``subprocess.Popen`` capped at 32 (the floor: no
  state, no supervisor, nothing survives the caller);
* ``submitit_map_array``: submitit's ``LocalExecutor.map_array`` on the same trials, when submitit is installed
  (the optional ``bench`` extra); a ``skipped`` line otherwise. It has no cap and starts every job (a Python
  process each) at once, so it runs at most :data:`SUBMITIT_MAX` trials;
* ``sweep_show``: ``tsm sweep show`` of the finished sweep (every trial's row and tracker metrics), as a fresh
  ``tsm`` process and in-process; the target is under 200 ms for 1,000 trials.

Run: ``python benchmarks/sweep_bench.py`` (``--tiny``: 20 trials, 4 at a time, for ``make bench-smoke``).
Figures depend on load: run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import os
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

#: submitit's LocalExecutor starts every job of a map_array at once (no cap), each a Python interpreter of
#: ~30 MB: 1,000 at once would take ~30 GB, so its row runs this many.
SUBMITIT_MAX = 100

COMPONENT = '''
from tsm import AppDef, Role


def true(i: int = 0) -> AppDef:
    """One trial: /bin/true."""
    return AppDef(name="true", roles=[Role(name="true", image="", entrypoint="/bin/true", args=[str(i)])])
'''


def bench_sweep(trials: int, parallel: int, workdir: Path) -> str:
    from tsm import get_runner
    from tsm.sweep import run_sweep, sweep_wait
    from tsm.sweep.state import SweepState, parse_sweep_handle

    (workdir / "true_component.py").write_text(COMPONENT)
    comp = f"{workdir / 'true_component.py'}:true"
    start = time.perf_counter()
    with get_runner() as runner:
        handle = run_sweep(runner, comp, {"i": list(range(trials))}, scheduler="local", parallel=parallel)
        status = sweep_wait(handle)
    wall = time.perf_counter() - start
    state = SweepState.open(parse_sweep_handle(handle))
    meta = state.meta()
    state.close()
    emit("sweep_local", trials=trials, parallel=parallel, state=status.state, wall_s=round(wall, 2),
         trials_per_s=round(trials / wall, 1), controller_cpu_s=meta.get("controller_cpu_s"),
         controller_cpu_ms_per_trial=round(1000 * float(meta.get("controller_cpu_s") or 0) / trials, 2))
    return handle


def bench_popen(trials: int, parallel: int) -> None:
    start = time.perf_counter()
    cpu0 = os.times()
    running: dict[int, subprocess.Popen[bytes]] = {}  # kept referenced: a dropped Popen is reaped behind os.wait
    for i in range(trials):
        while len(running) >= parallel:
            pid, _ = os.wait()
            running.pop(pid, None)
        proc = subprocess.Popen(["/bin/true", str(i)])
        running[proc.pid] = proc
    while running:
        pid, _ = os.wait()
        running.pop(pid, None)
    wall = time.perf_counter() - start
    cpu1 = os.times()
    emit("popen_floor", trials=trials, parallel=parallel, wall_s=round(wall, 2), trials_per_s=round(trials / wall, 1),
         launcher_cpu_s=round((cpu1.user - cpu0.user) + (cpu1.system - cpu0.system), 3))


def bench_submitit(trials: int, parallel: int, workdir: Path) -> None:
    try:
        import submitit  # type: ignore[import-not-found]
    except ImportError:
        emit("submitit_map_array", skipped="submitit is not installed (pip install -e '.[bench]')")
        return
    trials = min(trials, SUBMITIT_MAX)  # map_array starts every job at once, each a Python process
    executor = submitit.LocalExecutor(folder=str(workdir / "submitit"))
    executor.update_parameters(timeout_min=10)
    start = time.perf_counter()
    jobs = executor.map_array(subprocess.check_call, [["/bin/true", str(i)] for i in range(trials)])
    for job in jobs:
        job.result()
    wall = time.perf_counter() - start
    emit("submitit_map_array", trials=trials, wall_s=round(wall, 2), trials_per_s=round(trials / wall, 1),
         note=f"LocalExecutor has no cap like --parallel {parallel}: all {trials} jobs (one Python process each) "
         f"start at once, so it is run on at most {SUBMITIT_MAX} trials")


def bench_show(handle: str, trials: int, runs: int) -> None:
    from tsm.cli.cmd_sweep import _show

    devnull = open(os.devnull, "w")  # noqa: SIM115 - kept for the runs below
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "tsm.cli.main", "sweep", "show", handle, "--sort", "loss"],
                       check=True, stdout=devnull)
        samples.append(time.perf_counter() - t0)
    inproc = []
    stdout = sys.stdout
    for _ in range(runs):
        sys.stdout = devnull
        try:
            t0 = time.perf_counter()
            _show(handle, "loss", False)
            inproc.append(time.perf_counter() - t0)
        finally:
            sys.stdout = stdout
    devnull.close()
    emit("sweep_show", trials=trials, process_median_ms=round(statistics.median(samples) * 1000, 1),
         in_process_median_ms=round(statistics.median(inproc) * 1000, 1), runs=runs,
         target="tsm sweep show of 1,000 trials under 200 ms")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tiny", action="store_true", help="20 trials, 4 at a time (a smoke run, not a measurement)")
    p.add_argument("--trials", type=int, default=1000)
    p.add_argument("--parallel", type=int, default=32)
    args = p.parse_args()
    trials, parallel = (20, 4) if args.tiny else (args.trials, args.parallel)
    private_home()
    with tempfile.TemporaryDirectory(prefix="tsm-sweep-bench-") as tmp:
        work = Path(tmp)
        handle = bench_sweep(trials, parallel, work)
        bench_popen(trials, parallel)
        bench_submitit(trials, parallel, work)
        bench_show(handle, trials, 3 if args.tiny else 7)
    return 0


if __name__ == "__main__":
    sys.exit(main())
