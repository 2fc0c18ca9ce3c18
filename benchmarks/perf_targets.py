"""Issue 19's performance table: every row that runs without a cluster, each beside its physical baseline.

One JSON line per row: ``measure``, ``value``, ``unit``, ``target``, ``baseline`` (what the machine can do
for the same work, measured in the same run), ``baseline_value``, ``met`` (whether the target holds) and
details.  Rows: ``Runner.run()`` return latency (vs ``subprocess.Popen`` of the same command); per-app
supervisor PSS, all its processes (vs an idle ``python3 -S -c``); 256 x ``/bin/true`` run -> wait (vs a plain
Python fork/exec/wait loop); N ``sleep`` replicas in one app under ``ulimit -n 1024`` (start, ``status``,
``cancel`` -> all gone); K concurrent apps (``tsm list``, total supervisor PSS); ``log_lines`` of 200k short
lines (vs ``open().read().splitlines()``); tail lag; ``tsm --help`` / ``status`` / ``list`` (vs ``python3 -c
pass``); socket timer pairs/s with C client processes (vs a bare Unix-socket echo); timer reap latency.

Not timed assertions: figures depend on load; the ``machine`` line says how loaded the machine was.
``--tiny`` runs every row at a tiny size (``make bench-smoke``: checks that the benchmark still runs).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import selectors
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from _util import median_of, private_home, timed  # noqa: E402
from local_scheduler import app, run_to_end  # noqa: E402

from tsm.runner.api import get_runner  # noqa: E402

PY = sys.executable
BIN = Path(PY).parent
TSM = str(BIN / "tsm")
MSG = 40  # bytes per timer request on the wire (approximately one acquire/release record)


def row(measure: str, value: float | None, unit: str, target: str, met: bool | None,
        baseline: str | None = None, baseline_value: float | None = None, **details: Any) -> None:
    """Print one row of issue 19's table as a JSON line."""
    out: dict[str, Any] = {"measure": measure, "value": value, "unit": unit, "target": target,
                           "baseline": baseline, "baseline_value": baseline_value, "met": met, **details}
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()


def pss_kb(pid: int | None) -> int:
    """Proportional set size of one process in kB (0 when it is gone)."""
    if not pid:
        return 0
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def supervisor_pids(runner: Any, handle: str) -> list[int]:
    """The supervisor's processes of a local app (supervisor and watchdog), from the scheduler's store."""
    rows = runner._scheduler("local").store.query(  # noqa: SLF001 - benchmark reads internals
        "SELECT sup_pid, watchdog_pid FROM local_apps WHERE app_id=?", (handle.rsplit("/", 1)[1],))
    return [p for p in (rows[0]["sup_pid"], rows[0]["watchdog_pid"]) if p] if rows else []


def replica_pids(runner: Any, handle: str, n: int, timeout: float) -> list[int]:
    """Wait until ``n`` replicas of ``handle`` report a pid (or ``timeout``); their pids."""
    deadline = time.monotonic() + timeout
    pids: list[int] = []
    while time.monotonic() < deadline:
        st = runner.status(handle)
        pids = [r.pid for rs in st.roles for r in rs.replicas if r.pid]
        if len(pids) >= n:
            break
        time.sleep(0.02)
    return pids


def machine(when: str = "start") -> None:
    load = os.getloadavg()
    ci = subprocess.run(["pgrep", "-f", "/tmp/ci"], capture_output=True, text=True).stdout.split()
    sys.stdout.write(json.dumps({"machine": {"at": when, "cpus": os.cpu_count(), "loadavg": [round(x, 2) for x in load],
                                             "ci_processes_under_/tmp/ci": len(ci),
                                             "python": sys.version.split()[0]}}) + "\n")


# -- rows ----------------------------------------------------------------------------------------------------
def run_latency(runner: Any, runs: int) -> None:
    """``Runner.run()`` of a one-replica app, interleaved with a bare ``Popen`` and, when importable, TorchX 0.7
    ``local_cwd``'s ``run()`` (optional ``bench`` extra): issue 26's target is TorchX's figure in the same run.

    The first run of the home spawns its supervisor (and starts the launcher beside it); the figure is the
    median of the runs after it, as a sweep or any second ``run()`` sees it (``first_ms`` is printed too).
    """
    handles: list[str] = []
    tx: Any = None
    try:
        import torchx.specs as txs
        from torchx.runner import get_runner as tx_runner

        tx = tx_runner()
        tx_app = txs.AppDef("lat", [txs.Role("r", image=os.getcwd(), entrypoint="/bin/true")])
    except ImportError:
        pass
    first = timed(lambda: handles.append(runner.run(app("/bin/true", [], 1, "lat"))))
    ours, base, theirs = [], [], []
    for _ in range(runs):
        ours.append(timed(lambda: handles.append(runner.run(app("/bin/true", [], 1, "lat")))))
        start = time.perf_counter()
        p = subprocess.Popen(["/bin/true"])
        base.append(time.perf_counter() - start)
        p.wait()
        if tx is not None:
            theirs.append(timed(lambda: handles.append("tx:" + tx.run(tx_app, "local_cwd"))))
        runner.wait(handles[-1] if tx is None else handles[-2])
    for h in handles:
        if h.startswith("tx:"):
            tx.wait(h[3:], wait_interval=0.01)
        else:
            runner.wait(h)
    med = round(statistics.median(ours) * 1000, 2)
    tx_ms = round(statistics.median(theirs) * 1000, 2) if theirs else None
    row("Runner.run() returns (1 replica, record durable, supervisor ready)", med, "ms median",
        "<= TorchX 0.7 local_cwd run() in the same run", med <= tx_ms if tx_ms else None,
        "subprocess.Popen of the same command", round(statistics.median(base) * 1000, 3), runs=runs,
        torchx_run_ms=tx_ms, first_ms=round(first * 1000, 2))


def supervisor_memory(runner: Any, n: int) -> None:
    """PSS of every supervisor process (and the launcher they were forked from) over ``n`` running apps, per app."""
    handles = [runner.run(app("sleep", ["1000"], 1, f"pss{i}"), cfg={"grace_period": 1.0}) for i in range(n)]
    try:
        for h in handles:
            replica_pids(runner, h, 1, 60)
        pids = [p for h in handles for p in supervisor_pids(runner, h)]
        parents = {_parent(p) for p in pids}
        launchers = [p for p in parents if p and "tsm.schedulers.local.launcher" in _cmdline(p)]
        total = sum(pss_kb(p) for p in pids) + sum(pss_kb(p) for p in launchers)
        ours = total / 1024 / n
        idle = subprocess.Popen([PY, "-S", "-c", "import time; time.sleep(60)"])
        time.sleep(0.3)
        base = pss_kb(idle.pid) / 1024
        idle.kill()
        idle.wait()
    finally:
        for h in handles:
            runner.cancel(h)
    row(f"per-app supervisor memory at {n} running apps (PSS, all its processes + launcher share)", round(ours, 2),
        "MB", "<= 3 MB", ours <= 3, "an idle python3 -S -c", round(base, 2), processes=len(pids), apps=n,
        launchers=len(launchers))


def _parent(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
        return int(data[data.rindex(b")") + 2 :].split()[1])
    except (OSError, ValueError):
        return 0


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def fork_exec_wait(n: int) -> float:
    """``n`` x fork/exec ``/bin/true`` then wait for all, by a plain Python loop: seconds."""
    start = time.perf_counter()
    pids = []
    for _ in range(n):
        pid = os.fork()
        if pid == 0:
            try:
                os.execv("/bin/true", ["/bin/true"])
            finally:
                os._exit(127)
        pids.append(pid)
    for pid in pids:
        os.waitpid(pid, 0)
    return time.perf_counter() - start


def many_true(runner: Any, n: int, runs: int) -> None:
    run_to_end(runner, app("/bin/true", [], 4))  # warm up
    ours = median_of(lambda: run_to_end(runner, app("/bin/true", [], n)), runs)["median_ms"] / 1000
    base = median_of(lambda: fork_exec_wait(n), runs)["median_ms"] / 1000
    row(f"{n} x /bin/true, run -> wait returns", round(ours, 3), "s median", "<= 0.2 s (for 256)",
        ours <= 0.2 * n / 256, "fork/exec/wait by a plain Python loop", round(base, 3), runs=runs)


REPLICAS_CHILD = textwrap.dedent("""
    import json, resource, statistics, sys, time
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))
    from tsm.runner.api import get_runner
    from tsm.schedulers.local import _os
    from tsm.specs import AppDef, Role
    n = int(sys.argv[1])
    out = {}
    r = get_runner("bench")
    t0 = time.perf_counter()
    h = r.run(AppDef("many", [Role("r", entrypoint="sleep", args=["1000"], num_replicas=n)]), cfg={"grace_period": 2.0})
    deadline = time.monotonic() + 120 + n * 0.05
    pids = []
    while time.monotonic() < deadline:
        st = r.status(h)
        pids = [x.pid for rs in st.roles for x in rs.replicas if x.pid]
        if len(pids) >= n or st.state.is_terminal:
            break
        time.sleep(0.05)
    out["start_s"] = round(time.perf_counter() - t0, 3)
    out["started"] = len(pids)
    out["state"] = st.state.name
    lat = []
    for _ in range(5):
        s = time.perf_counter(); r.status(h); lat.append(time.perf_counter() - s)
    out["status_ms"] = round(statistics.median(lat) * 1000, 2)
    s = time.perf_counter()
    r.cancel(h)
    end = time.monotonic() + 60
    while any(_os.start_time(p) is not None for p in pids) and time.monotonic() < end:
        time.sleep(0.005)
    out["cancel_s"] = round(time.perf_counter() - s, 3)
    out["left_alive"] = sum(1 for p in pids if _os.start_time(p) is not None)
    print(json.dumps(out))
""")


def many_replicas(n: int) -> None:
    p = subprocess.run([PY, "-c", REPLICAS_CHILD, str(n)], capture_output=True, text=True, timeout=900)
    try:
        d = json.loads(p.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        row(f"{n} replicas in one app (sleep), ulimit -n 1024", None, "", "all start", False,
            error=(p.stderr or p.stdout).strip()[-400:])
        return
    base = kill_sleeps(n)
    ok = d["started"] == n and d["status_ms"] <= 100 and d["cancel_s"] <= 1 and d["left_alive"] == 0
    row(f"{n} replicas in one app (sleep), ulimit -n 1024", d["started"], "replicas started",
        "all start (10,000), status <= 100 ms, cancel -> all gone <= 1 s", ok,
        "kill of as many sleeps by a plain loop, all gone (s)", base, **d)


def kill_sleeps(n: int) -> float:
    """Start ``n`` ``sleep``s, then SIGKILL each by a plain loop and reap them all: seconds (issue 26's baseline)."""
    procs = [subprocess.Popen(["sleep", "1000"]) for _ in range(n)]
    start = time.perf_counter()
    for p in procs:
        p.kill()
    for p in procs:
        p.wait()
    return round(time.perf_counter() - start, 3)


def concurrent_apps(runner: Any, k: int, env: dict[str, str]) -> None:
    handles = []
    try:
        t0 = time.perf_counter()
        for i in range(k):
            handles.append(runner.run(app("sleep", ["1000"], 1, f"conc{i}"), cfg={"grace_period": 1.0}))
        launch_s = time.perf_counter() - t0
        for h in handles:
            replica_pids(runner, h, 1, 60)
        tracked = sum(1 for h in handles if (st := runner.status(h)) is not None and not st.state.is_terminal)
        subprocess.run([TSM, "list"], env=env, capture_output=True)
        list_ms = median_of(lambda: timed(lambda: subprocess.run([TSM, "list"], env=env, capture_output=True,
                                                                 check=True)), 5)["median_ms"]
        total_mb = sum(pss_kb(p) for h in handles for p in supervisor_pids(runner, h)) / 1024
    finally:
        for h in handles:
            runner.cancel(h)
    ok = tracked == k and list_ms <= 150 and total_mb <= 4096 * k / 1000
    row(f"{k} concurrent local apps", tracked, "apps tracked",
        "all tracked (1,000); tsm list <= 150 ms; total supervisor memory <= 4 GB per 1,000", ok,
        tsm_list_ms=list_ms, total_supervisor_pss_mb=round(total_mb, 1), launch_s=round(launch_s, 2))


def log_lines(runner: Any, n: int) -> None:
    code = f"import sys\nw = sys.stdout.write\nfor i in range({n}): w(f'line {{i}}\\n')"
    h = runner.run(app(PY, ["-c", code], 1, "logs"))
    st = runner.wait(h)
    path = os.path.join(st.ui_url.removeprefix("file://"), "r", "0", "stdout")
    rates, counts, base = [], set(), []
    for _ in range(3):
        start = time.perf_counter()
        counts.add(sum(1 for _ in runner.log_lines(h, "r", 0)))
        rates.append(n / (time.perf_counter() - start))
        start = time.perf_counter()
        with open(path) as f:
            k = len(f.read().splitlines())
        base.append(k / (time.perf_counter() - start))
    ours, b = statistics.median(rates) / 1e6, statistics.median(base) / 1e6
    row(f"log_lines after completion, {n} short lines, counted", round(ours, 2), "M lines/s", ">= 15 M lines/s",
        ours >= 15 and counts == {n}, "open().read().splitlines() of the same file", round(b, 2),
        items=sorted(counts))


def tail_lag(runner: Any, lines: int) -> None:
    code = (f"import time, sys\nfor i in range({lines}):\n    time.sleep(0.02)\n"
            "    sys.stdout.write(repr(time.time()) + '\\n'); sys.stdout.flush()")
    h = runner.run(app(PY, ["-c", code], 1, "tail"))
    lags = [time.time() - float(line) for line in runner.log_lines(h, "r", 0, should_tail=True) if line.strip()]
    ms = round(statistics.median(lags) * 1000, 2) if lags else None
    row("tail lag: line written -> delivered to a follower", ms, "ms median", "<= 3 ms", ms is not None and ms <= 3,
        lines=len(lags), p95_ms=round(sorted(lags)[int(0.95 * (len(lags) - 1))] * 1000, 2) if lags else None)


def _wall_and_cpu(cmd: list[str], env: dict[str, str], runs: int) -> tuple[float, float]:
    """Median wall-clock and median CPU (user + system of the child) milliseconds of running ``cmd``.

    CPU time is what the command itself costs; unlike wall-clock time it hardly grows when other work
    shares the cores (the machine these figures come from is shared), so it is the figure to compare
    across runs.
    """
    import resource

    walls, cpus = [], []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        subprocess.run(cmd, env=env, capture_output=True)
        walls.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return round(statistics.median(walls) * 1000, 2), round(statistics.median(cpus) * 1000, 2)


def cli(runner: Any, env: dict[str, str], runs: int, apps: int) -> None:
    """``tsm --help``, ``tsm status HANDLE`` and ``tsm list`` with ``apps`` ended apps in the home (issue 26:
    100), each beside ``python3 -c pass``: wall clock and CPU time (user + system) of the command."""
    handles = [runner.run(app("/bin/true", [], 1, f"cli{i}")) for i in range(apps)]
    for h in handles:
        runner.wait(h)
    h = handles[-1]
    subprocess.run([PY, "-c", "pass"], env=env, capture_output=True)
    base, base_cpu = _wall_and_cpu([PY, "-c", "pass"], env, runs)
    for name, cmd in (("tsm --help", [TSM, "--help"]), ("tsm status HANDLE", [TSM, "status", h]),
                      ("tsm list", [TSM, "list"])):
        subprocess.run(cmd, env=env, capture_output=True)  # warm: file cache, bytecode
        ours, cpu = _wall_and_cpu(cmd, env, runs)
        row(name, ours, "ms median", "<= 2 x python3 -c pass", ours <= 2 * base, "python3 -c pass", base,
            ratio=round(ours / base, 2), cpu_ms=cpu, baseline_cpu_ms=base_cpu, cpu_ratio=round(cpu / base_cpu, 2),
            apps_in_home=apps)


def _echo_server(path: str, ready: Any, stop: Any, out: Any) -> None:
    sel = selectors.DefaultSelector()
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(128)
    srv.setblocking(False)
    sel.register(srv, selectors.EVENT_READ)
    ready.set()
    total = 0
    while not stop.is_set():
        for key, _ in sel.select(0.05):
            if key.fileobj is srv:
                c, _a = srv.accept()
                sel.register(c, selectors.EVENT_READ)
                continue
            sock: socket.socket = key.fileobj  # type: ignore[assignment]
            data = sock.recv(1 << 16)
            if not data:
                sel.unregister(sock)
                sock.close()
                continue
            total += len(data)
            sock.sendall(data)
    out.put(total)


def _echo_client(path: str, go: Any, end: Any, out: Any) -> None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    msg = b"x" * MSG
    sent = 0
    go.wait()
    stop = end.value
    while time.time() < stop:
        for _ in range(64):
            s.sendall(msg)
            s.sendall(msg)
            sent += 2
        while True:  # drain the echo without waiting for it
            try:
                if not s.recv(1 << 16, socket.MSG_DONTWAIT):
                    break
            except BlockingIOError:
                break
    s.shutdown(socket.SHUT_WR)
    while s.recv(1 << 16):
        pass
    out.put(sent)


def echo_baseline(clients: int, duration: float) -> tuple[float, float]:
    """Messages/2 per second a bare selector server echoes from ``clients`` processes (pairs/s), and the CPU
    microseconds all those processes spent per pair (their whole lives: comparable, not exact)."""
    ctx = mp.get_context("fork")
    cpu0 = os.times()
    with tempfile.TemporaryDirectory(prefix="tsm-echo-") as d:
        path = os.path.join(d, "s")
        ready, stop, go, out = ctx.Event(), ctx.Event(), ctx.Event(), ctx.Queue()
        end = ctx.Value("d", 0.0)
        srv = ctx.Process(target=_echo_server, args=(path, ready, stop, out))
        srv.start()
        ready.wait(10)
        procs = [ctx.Process(target=_echo_client, args=(path, go, end, out)) for _ in range(clients)]
        for p in procs:
            p.start()
        time.sleep(0.2)
        t0 = time.time()
        end.value = t0 + duration
        go.set()
        sent = sum(out.get() for _ in procs)
        elapsed = time.time() - t0
        stop.set()
        processed = out.get() // MSG
        for p in [*procs, srv]:
            p.join(5)
    cpu1 = os.times()
    pairs = max(min(sent, processed) / 2, 1)
    cpu = cpu1.children_user + cpu1.children_system - cpu0.children_user - cpu0.children_system
    return pairs / elapsed, cpu / pairs * 1e6


def socket_timer(clients: int, duration: float) -> None:
    import timer_bench  # heavy (imports torch when present): only for this row

    ctx = timer_bench.CTX
    with tempfile.TemporaryDirectory(prefix="tsm-timer-") as d:
        here, there = ctx.Pipe()
        host = ctx.Process(target=timer_bench.tput_host, args=("tsm-socket", clients, duration, d, there))
        host.start()
        res = here.recv() if here.poll(duration + 60) else {}
        host.join(10)
    base, base_cpu = echo_baseline(clients, duration)
    val = res.get("processed_pairs_per_s")
    row(f"socket timer: acquire+release pairs/s, {clients} client processes", val, "pairs/s processed",
        ">= 300k/s processed, 0 lost", bool(val and val >= 300_000 and res.get("requests_lost") == 0),
        f"a bare Unix-socket echo of {MSG}-byte messages", round(base),
        baseline_cpu_us_per_pair=round(base_cpu, 2), **res)


def reap_latency(workers: int) -> None:
    import timer_bench

    ctx = timer_bench.CTX
    medians = {}
    missed = 0
    with tempfile.TemporaryDirectory(prefix="tsm-reap-") as d:
        for mi in (0.01, 0.1, 1.0):
            here, there = ctx.Pipe()
            host = ctx.Process(target=timer_bench.latency_host, args=("tsm-socket", mi, workers, d, there))
            host.start()
            lat, m = here.recv() if here.poll(60) else ([], workers)
            host.join(10)
            missed += m
            medians[str(mi)] = round(statistics.median(lat) * 1000, 2) if lat else None
    worst = max((v for v in medians.values() if v is not None), default=None)
    row("timer reap latency after deadline (socket server)", worst, "ms, worst median over max_interval",
        "<= 1 ms at any max_interval", worst is not None and worst <= 1 and missed == 0,
        median_ms_by_max_interval=medians, not_reaped=missed)


#: The rows ``--only`` can pick, in the order they run.
ROWS = ("run", "memory", "true", "replicas", "apps", "logs", "tail", "cli", "timer", "reap")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", "--smoke", action="store_true", help="every row at a tiny size (smoke)")
    ap.add_argument("--replicas", type=int, default=1000, help="replicas in one app (issue target 10000)")
    ap.add_argument("--apps", type=int, default=50, help="concurrent local apps (issue target 1000)")
    ap.add_argument("--memory-apps", type=int, default=100, help="running apps the memory row measures over")
    ap.add_argument("--cli-apps", type=int, default=100, help="ended apps in the home for the CLI rows")
    ap.add_argument("--clients", type=int, default=16, help="socket timer client processes")
    ap.add_argument("--only", nargs="*", choices=ROWS, metavar="ROW",
                    help=f"run only these rows (any of: {', '.join(ROWS)}); default: all")
    args = ap.parse_args()
    only = set(args.only or ROWS)
    tiny = args.tiny
    # Figures are what an installed tsm costs, which runs from cached bytecode: with PYTHONDONTWRITEBYTECODE
    # set (as the test suite sets it) every module edited since its .pyc was written would be compiled
    # again in every CLI call and every supervisor, tens of milliseconds that no user pays.
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    home = private_home()
    env = dict(os.environ, TSM_HOME=home, PATH=f"{BIN}:{os.environ.get('PATH', '')}")
    machine()
    runner = get_runner("bench")
    try:
        if "run" in only:
            run_latency(runner, 3 if tiny else 15)
        if "memory" in only:
            supervisor_memory(runner, 3 if tiny else args.memory_apps)
        if "true" in only:
            many_true(runner, 16 if tiny else 256, 1 if tiny else 5)
        if "replicas" in only:
            many_replicas(10 if tiny else args.replicas)
        if "apps" in only:
            concurrent_apps(runner, 3 if tiny else args.apps, env)
        if "logs" in only:
            log_lines(runner, 2000 if tiny else 200_000)
        if "tail" in only:
            tail_lag(runner, 5 if tiny else 100)
        if "cli" in only:
            cli(runner, env, 2 if tiny else 15, 2 if tiny else args.cli_apps)
        if "timer" in only:
            socket_timer(2 if tiny else args.clients, 0.2 if tiny else 1.0)
        if "reap" in only:
            reap_latency(2 if tiny else 10)
    finally:
        runner.close()
        machine("end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
