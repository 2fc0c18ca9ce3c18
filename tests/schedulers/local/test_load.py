"""Load on the local scheduler: concurrent launchers on one ``$TSM_HOME``, wide apps, a long history.

Each case is a row of the README's Reliability table (``make harden``); times are recorded as figures with
their limits, never asserted.
"""

from __future__ import annotations

import resource
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from testutil import HANG
from tsm.runner.api import get_runner
from tsm.schedulers.local.scheduler import LocalScheduler
from tsm.specs import AppState
from tsm.store import Store

PY = sys.executable
TSM = str(Path(PY).with_name("tsm"))
LOAD = "Load"

LAUNCHER = """
    import sys
    from tsm.runner.api import get_runner
    from tsm.specs import AppDef, Role
    n, tag = int(sys.argv[1]), sys.argv[2]
    with get_runner() as runner:
        handles = [runner.run(AppDef("load", [Role("r", entrypoint="echo", args=[tag, str(i)])])) for i in range(n)]
        for h in handles:
            status = runner.wait(h, timeout=300)
            print(h, status.state.name if status else "LOST", flush=True)
"""


def launch_concurrently(processes: int, apps_each: int) -> tuple[list[subprocess.CompletedProcess[str]], float]:
    """``processes`` launchers started together, each running ``apps_each`` apps to the end."""
    start = time.monotonic()
    procs = [
        subprocess.Popen([PY, "-c", textwrap.dedent(LAUNCHER), str(apps_each), f"p{p}"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for p in range(processes)
    ]
    done = []
    for p in procs:
        out, err = p.communicate(timeout=HANG * 3)
        done.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    return done, time.monotonic() - start


@pytest.mark.reliability(
    "8 processes launch 25 apps each at once on one $TSM_HOME",
    expect="all 200 recorded and SUCCEEDED with their output; nothing on stderr (no 'database is locked')",
    group=LOAD,
)
def test_concurrent_launchers_lose_nothing(figure) -> None:  # type: ignore[no-untyped-def]
    results, seconds = launch_concurrently(8, 25)
    for r in results:
        assert r.returncode == 0 and r.stderr == "", r.stderr[-2000:]
    lines = [ln.split() for r in results for ln in r.stdout.splitlines()]
    assert len(lines) == 200 and {state for _, state in lines} == {"SUCCEEDED"}
    handles = {h for h, _ in lines}
    assert len(handles) == 200
    runner = get_runner()
    assert handles <= {a.app_handle for a in runner.list()}
    with Store() as store:
        assert store.query("SELECT COUNT(*) AS n FROM local_apps WHERE state=?", (int(AppState.SUCCEEDED),))[0]["n"] == 200
        assert store.query("SELECT COUNT(*) AS n FROM apps")[0]["n"] == 200
    outputs = sorted(next(iter(runner.log_lines(h, "r", 0))) for h in handles)
    assert outputs == sorted(f"p{p} {i}\n" for p in range(8) for i in range(25))
    figure("all 200 launched and finished in", seconds, "s")
    figure("apps per second", 200 / seconds, "")


WIDE = """
    import sys
    from tsm.runner.api import get_runner
    from tsm.specs import AppDef, Role
    n = int(sys.argv[1])
    with get_runner() as runner:
        h = runner.run(AppDef("wide", [Role("r", entrypoint="sh", args=["-c", 'echo "replica $0"', "${replica_id}"], num_replicas=n)]))
        print(h, runner.wait(h, timeout=300).state.name)
"""


@pytest.mark.reliability(
    "512 replicas in one app under ulimit -n 1024",
    expect="SUCCEEDED; every replica recorded with its own output",
    group=LOAD,
)
def test_512_replicas_under_a_1024_file_limit(figure) -> None:  # type: ignore[no-untyped-def]
    n = 512

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))

    start = time.monotonic()
    proc = subprocess.run([PY, "-c", textwrap.dedent(WIDE), str(n)], capture_output=True, text=True,
                          preexec_fn=limit, timeout=HANG * 3)
    seconds = time.monotonic() - start
    assert proc.returncode == 0, proc.stderr[-2000:]
    handle, state = proc.stdout.split()
    assert state == "SUCCEEDED", proc.stdout
    runner = get_runner()
    status = runner.status(handle)
    assert status is not None
    replicas = status.roles[0].replicas
    assert len(replicas) == n and all(r.state == AppState.SUCCEEDED for r in replicas)
    for k in (0, 255, 511):
        assert list(runner.log_lines(handle, "r", k)) == [f"replica {k}\n"]
    figure("launch to SUCCEEDED", seconds, "s")


def clone_history(n: int) -> None:
    """Grow the store to ``n`` finished apps by copying the rows of the real finished apps already there.

    Launching 1,000 real apps takes a minute of the suite; the list's cost depends only on the rows, so the
    copies are the rows the scheduler and runner wrote, under new ids.
    """
    with Store() as store:
        real = store.query("SELECT * FROM local_apps")
        history = {r["app_id"]: r for r in store.query("SELECT * FROM apps")}
        reps = store.query("SELECT * FROM local_replicas")
        stmts = []
        for i in range(n - len(real)):
            src = real[i % len(real)]
            new_id = f"{src['app_id']}-c{i}"
            cols = src.keys()
            values = [new_id if c == "app_id" else src[c] for c in cols]
            stmts.append((f"INSERT INTO local_apps ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})", values))
            h = history[src["app_id"]]
            hcols = h.keys()
            hvalues = [new_id if c == "app_id" else h[c].replace(src["app_id"], new_id) if c == "handle" else h[c]
                       for c in hcols]
            stmts.append((f"INSERT INTO apps ({', '.join(hcols)}) VALUES ({', '.join('?' * len(hcols))})", hvalues))
            for rep in (r for r in reps if r["app_id"] == src["app_id"]):
                rcols = rep.keys()
                rvalues = [new_id if c == "app_id" else rep[c] for c in rcols]
                stmts.append((f"INSERT INTO local_replicas ({', '.join(rcols)}) VALUES ({', '.join('?' * len(rcols))})",
                              rvalues))
        store.write(stmts)


@pytest.mark.reliability(
    "1,000 finished apps in the store",
    expect="`tsm list` and `tsm list -s local` stay under 200 ms (median of 5) and show every app",
    group=LOAD,
)
def test_list_stays_fast_with_a_thousand_finished_apps(figure) -> None:  # type: ignore[no-untyped-def]
    results, _ = launch_concurrently(8, 5)
    assert all(r.returncode == 0 for r in results)
    clone_history(1000)
    assert len(LocalScheduler("check").list()) == 1000

    def timed(args: list[str]) -> tuple[float, str]:
        times, out = [], ""
        for _ in range(5):
            start = time.perf_counter()
            proc = subprocess.run([TSM, *args], capture_output=True, text=True, timeout=HANG, check=True)
            times.append(time.perf_counter() - start)
            out = proc.stdout
        return statistics.median(times), out

    history_s, out = timed(["list"])
    assert len(out.splitlines()) == 1 + 200  # header + the most recent 200 (the history's page)
    local_s, out = timed(["list", "-s", "local", "--all"])  # `tsm list` shows 200 unless told --all/--limit
    assert len(out.splitlines()) == 1 + 1000
    assert all(" SUCCEEDED " in ln for ln in out.splitlines()[1:])
    figure("tsm list", history_s, "s", limit=0.2)
    figure("tsm list -s local", local_s, "s", limit=0.2)
