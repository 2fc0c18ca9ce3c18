"""Log readers: a line without a newline in linear time and bounded memory; one follower for many replicas.

Issue 11, items 11 and 12.

A replica writes one line of 50, 100 and 300 MB without a newline; each reader reads the whole log:
``log_lines`` (combined streams: the index reader), ``log_lines`` of stdout only (the block reader) and a
follower (``should_tail``, on the ended replica). Printed beside each: the physical baseline, reading the
same file in 1 MiB blocks and decoding it (what any reader must pay), and the reader's peak of traced
Python memory. Targets (2-core machine): time within 5x the baseline and linear in the size (300 MB within
3.5x of 100 MB); peak memory under 8 MiB whatever the size; 300 MB in a few seconds.

Then an attached ``tsm run`` of 1,500 replicas (each prints a first line, sleeps 1 s, prints a last line)
under ``ulimit -n 1024``: every line delivered, and the CPU the ``tsm`` process spent following them beside
the baseline of ``tsm wait`` on the same app run detached (what attaching costs over just waiting).
Targets: 3,000 lines of 3,000; CPU within 3 s more than the baseline.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _util import emit, private_home  # noqa: E402

from tsm.runner.api import get_runner  # noqa: E402
from tsm.schedulers.api import Stream  # noqa: E402
from tsm.specs import AppDef, AppState, Role  # noqa: E402

MB = 1_000_000
WRITER = (
    "import sys\n"
    "w = sys.stdout.buffer.write\n"
    "block = bytes(range(97, 123)) * 40000\n"
    "left = int(sys.argv[1])\n"
    "while left > 0:\n"
    "    w(block[:left]); left -= len(block)\n"
)


def baseline(path: str) -> float:
    """Seconds to read ``path`` in 1 MiB blocks and decode each: the floor for any reader."""
    start = time.perf_counter()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            block.decode("utf-8", "surrogateescape")
    return time.perf_counter() - start


def measure(read: Callable[[], Iterator[str]]) -> tuple[float, float, int]:
    """(seconds, peak traced MiB, pieces) of consuming ``read()``: timed untraced, then traced for the peak."""
    start = time.perf_counter()
    pieces = sum(1 for _ in read())
    seconds = time.perf_counter() - start
    tracemalloc.start()
    sum(1 for _ in read())
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return seconds, peak / (1 << 20), pieces


#: runs ``tsm ARGS`` with at most 1,024 descriptors, then prints the CPU seconds it used on stderr
LAUNCHER = (
    "import resource, sys\n"
    "resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))\n"
    "from tsm.cli.main import main\n"
    "code = main(sys.argv[1:])\n"
    "ru = resource.getrusage(resource.RUSAGE_SELF)\n"
    "sys.stderr.write(f'\\ncpu_seconds {ru.ru_utime + ru.ru_stime:.3f}\\n')\n"
    "sys.exit(code)\n"
)


def tsm_cpu(*args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run ``tsm ARGS`` under ``ulimit -n 1024``; the result and the CPU seconds the tsm process used."""
    r = subprocess.run([sys.executable, "-c", LAUNCHER, *args], capture_output=True, text=True, timeout=600)
    line = [ln for ln in r.stderr.splitlines() if ln.startswith("cpu_seconds ")]
    return r, float(line[-1].split()[1]) if line else float("nan")


def many_replicas(n: int = 1500) -> None:
    app = ["utils.sh", "--num_replicas", str(n), "--", "echo first $TSM_REPLICA_ID; sleep 1; echo last $TSM_REPLICA_ID"]
    attached, cpu = tsm_cpu("run", "-c", "grace_period=5", *app)
    want = {f"sh/{k} first {k}" for k in range(n)} | {f"sh/{k} last {k}" for k in range(n)}
    delivered = len(want & set(attached.stdout.splitlines()))
    detached = subprocess.run([sys.executable, "-m", "tsm.cli.main", "run", "--detach", "-c", "grace_period=5", *app],
                              capture_output=True, text=True, timeout=600)
    _, base = tsm_cpu("wait", detached.stdout.strip())
    emit("attached tsm run, 1,500 replicas, ulimit -n 1024", target="3000 of 3000 lines; cpu <= baseline + 3 s",
         lines_delivered=delivered, lines_expected=2 * n, exit_code=attached.returncode,
         cpu_seconds=round(cpu, 3), baseline_wait_cpu_seconds=round(base, 3))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", "--smoke", action="store_true", help="tiny sizes: checks that the benchmark still runs")
    tiny = ap.parse_args().tiny
    sizes = (MB // 2, MB, 3 * MB) if tiny else (50 * MB, 100 * MB, 300 * MB)
    private_home()
    runner = get_runner("bench")
    times: dict[tuple[str, int], float] = {}
    for size in sizes:
        handle = runner.run(AppDef("longline", [Role("r", entrypoint=sys.executable, args=["-c", WRITER, str(size)])]))
        status = runner.wait(handle)
        assert status is not None and status.state == AppState.SUCCEEDED, status
        log_dir = status.ui_url.removeprefix("file://")
        path = os.path.join(log_dir, "r", "0", "stdout")
        base = min(baseline(path) for _ in range(2))
        readers: dict[str, Callable[[], Iterator[str]]] = {
            "log_lines combined": lambda h=handle: runner.log_lines(h, "r", 0),
            "log_lines stdout": lambda h=handle: runner.log_lines(h, "r", 0, streams=Stream.STDOUT),
            "follow (ended replica)": lambda h=handle: runner.log_lines(h, "r", 0, should_tail=True),
        }
        for name, read in readers.items():
            seconds, peak_mb, pieces = measure(read)
            times[(name, size)] = seconds
            emit(
                f"{name}: one {size // MB} MB line", target="<= 5x baseline; peak < 8 MiB",
                seconds=round(seconds, 3), baseline_seconds=round(base, 3), x_baseline=round(seconds / base, 2),
                peak_traced_mib=round(peak_mb, 2), pieces=pieces,
            )
        runner.remove([handle])
    for name in ("log_lines combined", "log_lines stdout", "follow (ended replica)"):
        emit(f"{name}: 300 MB / 100 MB time", target="<= 3.5 (linear: 3)",
             ratio=round(times[(name, sizes[2])] / times[(name, sizes[1])], 2))
    runner.close()
    many_replicas(10 if tiny else 1500)


if __name__ == "__main__":
    main()
