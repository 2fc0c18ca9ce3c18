#!/usr/bin/env python3
"""Benchmark ``tsm stack`` across the replicas of one local app, beside one py-spy dump run by hand.

Prints one JSON object per line:

* ``pyspy_dump``: one ``py-spy dump --pid P`` (``--json``) of one replica's process, run directly: the
  physical floor of looking at one process;
* ``stack_cli``: a whole ``tsm stack HANDLE`` of an app of N replicas (8 by default), each a Python process
  blocked in a function, as a user runs it (a new ``tsm`` process: imports, the store, one py-spy per
  process, the grouping and printing); ``per_replica_ms`` divides it by N;
* ``stack_api``: ``Runner.replica_stacks`` in this process (no interpreter start), the same N replicas.

Run: ``python benchmarks/stack_bench.py [--replicas N] [--runs R]`` (``--tiny``: 2 replicas, 2 runs). Needs
py-spy (``pip install 'tsm[debug]'``). Figures depend on load: docs/perf.md records where they were taken.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"
if str(SRC) not in sys.path:
    sys.path.insert(0, str(SRC))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _util import emit, median_of, private_home, timed  # noqa: E402

PROGRAM = """
import os, sys, time
def blocked_in_the_benchmark():
    open(sys.argv[1] + "." + os.environ["TSM_REPLICA_ID"], "w").close()
    time.sleep(3600)
blocked_in_the_benchmark()
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replicas", type=int, default=8)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--tiny", "--smoke", action="store_true", help="2 replicas, 2 runs: checks that it still runs")
    args = ap.parse_args()
    n, runs = (2, 2) if args.tiny else (args.replicas, args.runs)
    private_home()
    from tsm.runner.api import get_runner
    from tsm.schedulers.common.pyspy import dump_argv, local_pyspy
    from tsm.specs.api import AppDef, Role

    exe = local_pyspy()
    if exe is None:
        sys.exit("py-spy is not installed: pip install 'tsm[debug]'")
    work = Path(tempfile.mkdtemp(prefix="tsm-stack-bench-"))
    (work / "prog.py").write_text(PROGRAM)
    started = work / "started"
    app = AppDef("stackbench", [Role("trainer", image=str(work), entrypoint=sys.executable,
                                     args=["prog.py", str(started)], num_replicas=n)])
    with get_runner() as runner:
        handle = runner.run(app, "local")
        try:
            while not all(Path(f"{started}.{k}").exists() for k in range(n)):
                time.sleep(0.01)
            status = runner.status(handle)
            pid = status.roles[0].replicas[0].pid if status else None
            assert pid is not None
            argv = dump_argv(pid, pyspy=exe)
            emit("pyspy_dump", **median_of(lambda: timed(lambda: subprocess.run(argv, capture_output=True, check=True)),
                                           runs))
            cli = [sys.executable, "-m", "tsm.cli.main", "stack", handle]
            env = {**os.environ, "TSM_CLI_SERVER": "0"}
            row = median_of(lambda: timed(lambda: subprocess.run(cli, capture_output=True, check=True, env=env)), runs)
            emit("stack_cli", replicas=n, per_replica_ms=round(row["median_ms"] / n, 2), **row)
            row = median_of(lambda: timed(lambda: runner.replica_stacks(handle)), runs)
            emit("stack_api", replicas=n, per_replica_ms=round(row["median_ms"] / n, 2), **row)
        finally:
            runner.cancel(handle)


if __name__ == "__main__":
    main()
