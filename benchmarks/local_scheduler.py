"""Local scheduler figures: launch throughput, wait latency, log reading, cancel, supervisor footprint.

Targets (2-core machine, medians): 256 x /bin/true run->wait <= 1.0 s; 64 x `python -c pass` <= 2 s;
replica exit -> wait() returns <= 20 ms; log_lines over 200,000 lines >= 1.5 M lines/s (exactly 200,000
items); tail ends <= 50 ms after the replica exits; cancel of 32 x `sleep 1000`: all gone <= 100 ms;
supervisor RSS <= 30 MB with 256 replicas; 512 replicas run under `ulimit -n 1024`.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _util import emit, median_of, private_home, timed  # noqa: E402

from tsm.runner.api import get_runner  # noqa: E402
from tsm.schedulers.local import _os  # noqa: E402
from tsm.specs import AppDef, AppState, Role  # noqa: E402

PY = sys.executable


def app(entry: str, args: list[str], n: int, name: str = "bench") -> AppDef:
    return AppDef(name, [Role("r", entrypoint=entry, args=args, num_replicas=n)])


def run_to_end(runner, a: AppDef) -> float:  # type: ignore[no-untyped-def]
    def go() -> None:
        status = runner.wait(runner.run(a))
        assert status.state == AppState.SUCCEEDED, status
    return timed(go)


def exit_to_wait(runner) -> float:  # type: ignore[no-untyped-def]
    code = "import time, sys; time.sleep(0.2); sys.stdout.write(repr(time.time())); sys.stdout.flush()"
    handle = runner.run(app(PY, ["-c", code], 1))
    runner.wait(handle)
    returned = time.time()
    printed = float("".join(runner.log_lines(handle, "r", 0)))
    return returned - printed


def tail_end(runner) -> float:  # type: ignore[no-untyped-def]
    code = "import time, sys\nfor i in range(20): print(i)\ntime.sleep(0.2)\nsys.stdout.write(repr(time.time()))"
    handle = runner.run(app(PY, ["-c", code], 1))
    lines = list(runner.log_lines(handle, "r", 0, should_tail=True))
    ended = time.time()
    return ended - float(lines[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", "--smoke", action="store_true", help="tiny sizes: checks that the benchmark still runs")
    tiny = ap.parse_args().tiny
    k = 16 if tiny else 1  # sizes are divided by k
    runs = 1 if tiny else 5
    private_home()
    runner = get_runner("bench")
    run_to_end(runner, app("/bin/true", [], 4))  # warm up
    emit("256 x /bin/true run->wait", target="median <= 1.0 s",
         **median_of(lambda: run_to_end(runner, app("/bin/true", [], 256 // k)), runs))
    emit("64 x python -c pass run->wait", target="median <= 2 s",
         **median_of(lambda: run_to_end(runner, app(PY, ["-S", "-c", "pass"], 64 // k)), runs))
    emit("replica exit -> wait() returns", target="median <= 20 ms",
         **median_of(lambda: exit_to_wait(runner), 2 * runs))

    # log reading: one replica printing 200,000 short lines
    code = f"import sys\nw = sys.stdout.write\nfor i in range({200000 // k}): w(f'line {{i}}\\n')"
    handle = runner.run(app(PY, ["-c", code], 1, "logs"))
    runner.wait(handle)
    counts = []
    rates = []
    for _ in range(5):
        start = time.perf_counter()
        n = sum(1 for _ in runner.log_lines(handle, "r", 0))
        rates.append(n / (time.perf_counter() - start))
        counts.append(n)
    emit("log_lines over 200,000 lines", target=">= 1.5 M lines/s, exactly 200000 items",
         median_lines_per_s=round(statistics.median(rates)), items=sorted(set(counts)))
    emit("tail ends after replica exit", target="median <= 50 ms", **median_of(lambda: tail_end(runner), 2 * runs))

    # cancel 32 sleeps
    def cancel_32() -> float:
        handle = runner.run(app("sleep", ["1000"], 32 // k, "cancel"), cfg={"grace_period": 10.0})
        deadline = time.monotonic() + 30
        while True:
            st = runner.status(handle)
            pids = [r.pid for rs in st.roles for r in rs.replicas if r.pid]
            if len(pids) == 32 // k or time.monotonic() > deadline:
                break
            time.sleep(0.01)
        start = time.perf_counter()
        runner.cancel(handle)
        while any(_os.start_time(p) is not None for p in pids):
            time.sleep(0.001)
        return time.perf_counter() - start

    emit("cancel 32 x sleep 1000: all gone", target="median <= 100 ms", **median_of(cancel_32, runs))

    # supervisor memory with 256 live replicas
    handle = runner.run(app("sleep", ["1000"], 256 // k, "rss"), cfg={"grace_period": 1.0})
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        st = runner.status(handle)
        if sum(1 for rs in st.roles for r in rs.replicas if r.pid) == 256 // k:
            break
        time.sleep(0.05)
    store_row = runner._scheduler("local").store.query(  # noqa: SLF001 - benchmark reads internals
        "SELECT sup_pid, watchdog_pid FROM local_apps WHERE app_id=?", (handle.rsplit("/", 1)[1],))[0]

    def rss_mb(pid: int) -> float:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        return 0.0

    emit("supervisor RSS with 256 replicas", target="<= 30 MB",
         supervisor_mb=round(rss_mb(store_row["sup_pid"]), 1), watchdog_mb=round(rss_mb(store_row["watchdog_pid"]), 1))
    runner.cancel(handle)

    # 512 replicas under ulimit -n 1024
    script = textwrap.dedent("""
        import resource, sys, time
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))
        from tsm.runner.api import get_runner
        from tsm.specs import AppDef, Role
        r = get_runner()
        start = time.perf_counter()
        st = r.wait(r.run(AppDef("many", [Role("r", entrypoint="/bin/true", num_replicas=int(sys.argv[1]))])))
        print(st.state.name, round(time.perf_counter() - start, 3))
    """)
    out = subprocess.run([PY, "-c", script, str(512 // k)], capture_output=True, text=True, timeout=300)
    state, _, secs = out.stdout.strip().partition(" ")
    emit("512 replicas under ulimit -n 1024", target="SUCCEEDED", state=state or out.stderr.strip()[-300:],
         seconds=float(secs) if secs else None)
    runner.close()


if __name__ == "__main__":
    main()
