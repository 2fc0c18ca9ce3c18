"""tsm beside TorchX 0.7 (``local_cwd``) and ``torch.distributed.elastic.timer``: the same measures, one run.

Rows (one JSON line each, with ``tsm``, ``theirs`` and ``speedup`` = theirs / tsm for times, tsm / theirs for
rates, so above 1 means tsm is ahead): ``Runner.run()`` return latency, 256 x ``/bin/true`` run -> wait,
``log_lines`` of 200k short lines, ``--help`` of each CLI, and for the timers the reap latency after a
deadline and acquire+release pairs/s processed with 16 client processes (file server against file server,
in-process queue against queue, and tsm's socket server against torch's file server).

TorchX is optional: ``make bench-torchx`` runs this script from a virtualenv of its own (``.venv-bench``, with
``tsm[bench]`` and torch), never from ``.venv``, because TorchX 0.7 pins an old urllib3 that breaks the
Kubernetes client installed there. Without TorchX the TorchX rows print a ``skipped`` line and the timer rows
still run (torch is installed with the test setup).
TorchX's ``wait`` polls; it is given ``wait_interval=0.01`` s, its best case.  ``--tiny``: tiny sizes (smoke).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from _util import median_of, private_home, timed  # noqa: E402
from local_scheduler import app  # noqa: E402

from tsm.runner.api import get_runner  # noqa: E402

PY = sys.executable


def out(**row: Any) -> None:
    sys.stdout.write(json.dumps(row) + "\n")
    sys.stdout.flush()


def compare(measure: str, unit: str, ours: float, theirs: float, against: str, lower_is_better: bool = True,
            **details: Any) -> None:
    """Print one side-by-side row with the speed-up of tsm over the other implementation."""
    speedup = (theirs / ours if lower_is_better else ours / theirs) if ours and theirs else None
    out(measure=measure, unit=unit, tsm=ours, theirs=theirs, against=against,
        speedup=round(speedup, 2) if speedup else None, **details)


def torchx_rows(tiny: bool) -> None:
    try:
        import torchx
        import torchx.specs as tx
        from torchx.runner import get_runner as tx_runner
    except ImportError as e:
        for m in ("Runner.run() returns", "256 x /bin/true run -> wait", "log_lines 200k lines", "CLI --help"):
            out(measure=m, against="torchx local_cwd", skipped=f"torchx not importable ({e}); make bench-torchx runs this in its own venv")
        return
    ours, theirs = get_runner("bench"), tx_runner()
    against = f"torchx {torchx.__version__} local_cwd"

    def tx_app(entry: str, args: list[str], n: int) -> Any:
        return tx.AppDef("bench", [tx.Role("r", image=".", entrypoint=entry, args=args, num_replicas=n)])

    # Each side's first run is its own (tsm's spawns the supervisor and starts the launcher beside it; TorchX's
    # imports what its scheduler needs) and is shown apart; the median is of the runs after it, interleaved,
    # each app waited for before the next run, as a script or a sweep's controller sees them.
    runs = 2 if tiny else 15
    handle = ""

    def run_tsm() -> None:
        nonlocal handle
        handle = ours.run(app("/bin/true", [], 1))

    def run_tx() -> None:
        nonlocal handle
        handle = theirs.run(tx_app("/bin/true", [], 1), "local_cwd")

    first_tsm = timed(run_tsm)
    ours.wait(handle)
    first_tx = timed(run_tx)
    theirs.wait(handle, wait_interval=0.01)
    a_times, b_times = [], []
    for _ in range(runs):
        a_times.append(timed(run_tsm))
        ours.wait(handle)
        b_times.append(timed(run_tx))
        theirs.wait(handle, wait_interval=0.01)
    compare("Runner.run() returns (1 replica)", "ms median", round(statistics.median(a_times) * 1000, 2),
            round(statistics.median(b_times) * 1000, 2), against, runs=runs,
            first_ms_tsm=round(first_tsm * 1000, 1), first_ms_theirs=round(first_tx * 1000, 1))

    n = 16 if tiny else 256

    def tsm_wait() -> float:
        return timed(lambda: ours.wait(ours.run(app("/bin/true", [], n))))

    def tx_wait() -> float:
        return timed(lambda: theirs.wait(theirs.run(tx_app("/bin/true", [], n), "local_cwd"), wait_interval=0.01))

    compare(f"{n} x /bin/true run -> wait", "ms median", median_of(tsm_wait, 1 if tiny else 3)["median_ms"],
            median_of(tx_wait, 1 if tiny else 3)["median_ms"], against)

    lines = 2000 if tiny else 200_000
    code = f"import sys\nw = sys.stdout.write\nfor i in range({lines}): w(f'line {{i}}\\n')"
    h1 = ours.run(app(PY, ["-c", code], 1, "logs"))
    ours.wait(h1)
    h2 = theirs.run(tx_app(PY, ["-c", code], 1), "local_cwd")
    theirs.wait(h2, wait_interval=0.01)

    def rate(read: Any) -> tuple[float, int]:
        rates, count = [], 0
        for _ in range(3):
            start = time.perf_counter()
            count = sum(1 for _ in read())
            rates.append(count / (time.perf_counter() - start) / 1e6)
        return round(statistics.median(rates), 2), count

    (r1, c1), (r2, c2) = rate(lambda: ours.log_lines(h1, "r", 0)), rate(lambda: theirs.log_lines(h2, "r", 0))
    compare(f"log_lines after completion, {lines} lines", "M lines/s", r1, r2, against, lower_is_better=False,
            items_tsm=c1, items_theirs=c2)

    cli = {"tsm": [PY, "-m", "tsm.cli.main", "--help"], "tx": [PY, "-m", "torchx.cli.main", "--help"]}
    for cmd in cli.values():
        subprocess.run(cmd, capture_output=True)
    med = {k: median_of(lambda c=c: timed(lambda: subprocess.run(c, capture_output=True)), runs)["median_ms"]
           for k, c in cli.items()}
    compare("CLI --help (python -m)", "ms median", med["tsm"], med["tx"], against)
    ours.close()


def timer_rows(tiny: bool) -> None:
    import timer_bench as tb

    if tb.torch_timer is None:
        out(measure="timers", against="torch.distributed.elastic.timer", skipped=tb.TORCH)
        return
    import torch

    against = f"torch {torch.__version__} elastic.timer"
    pairs = [("tsm-file", "torch-file"), ("tsm-local", "torch-local"), ("tsm-socket", "torch-file")]
    workers, clients, duration = (2, 2, 0.2) if tiny else (10, 16, 1.0)
    with tempfile.TemporaryDirectory(prefix="tsm-cmp-") as d:
        def latency(impl: str) -> float | None:
            here, there = tb.CTX.Pipe()
            host = tb.CTX.Process(target=tb.latency_host, args=(impl, 0.1, workers, d, there))
            host.start()
            lat, _missed = here.recv() if here.poll(60) else ([], workers)
            host.join(10)
            return round(statistics.median(lat) * 1000, 2) if lat else None

        def tput(impl: str) -> float | None:
            here, there = tb.CTX.Pipe()
            host = tb.CTX.Process(target=tb.tput_host, args=(impl, clients, duration, d, there))
            host.start()
            res = here.recv() if here.poll(duration + 60) else {}
            host.join(10)
            v = res.get("processed_pairs_per_s")
            return float(v) if v is not None else None

        for ours, theirs in pairs:
            a, b = latency(ours), latency(theirs)
            compare(f"timer reap latency after deadline ({ours} vs {theirs}, max_interval 0.1)", "ms median",
                    a or 0.0, b or 0.0, against)
            a, b = tput(ours), tput(theirs)
            compare(f"timer acquire+release pairs/s, {clients} clients ({ours} vs {theirs})", "pairs/s processed",
                    a or 0.0, b or 0.0, against, lower_is_better=False)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", "--smoke", action="store_true", help="tiny sizes (smoke)")
    tiny = ap.parse_args().tiny
    private_home()
    torchx_rows(tiny)
    timer_rows(tiny)
    return 0


if __name__ == "__main__":
    sys.exit(main())
