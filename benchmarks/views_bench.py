"""Cost of the live views (issue 18): calls per refresh and CPU of the view with 100 running apps.

100 real local apps run (one ``sleep`` replica each, so the figures are the view's and not the apps').
Measured:

* the :class:`~tsm.views.snapshot.SnapshotCollector` alone: the calls one refresh makes (store queries,
  process-table walks) and its CPU time per refresh, over 20 refreshes;
* ``tsm serve --interval 1`` as its own process, with one page's event stream open: its CPU over 20 s,
  as a percentage of one core;
* ``tsm top`` (the Textual app, headless, refreshing at 1 Hz): its process's CPU over 20 s;
* the collector and ``tsm top`` again with 100 running apps of 10 replicas each (1,000 replica processes);
* the same collector over 1,000 replicas (100 ended apps of 10 replicas, rows as the local scheduler
  writes them): calls per refresh equal to the 10-replica case.

Target (issue 18): one batched call per scheduler per tick (store queries constant in the number of
apps and replicas) and a view under 5 % of one core with 100 running apps at 1 Hz.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from _util import emit, private_home  # noqa: E402

APPS = 100
WINDOW = 20.0

TOP_CHILD = r"""
import asyncio, sys, time
from tsm.views.top import TopApp
async def main():
    app = TopApp(interval=1.0)
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.pause(5)
        c0, t0 = time.process_time(), time.monotonic()
        await pilot.pause(float(sys.argv[1]))
        print((time.process_time() - c0) / (time.monotonic() - t0))
        rows = app.query_one("#apps").row_count
        print(rows)
asyncio.run(main())
"""


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def collector_figures(limit: int | None = 200) -> dict[str, object]:
    from tsm.views.snapshot import SnapshotCollector

    col = SnapshotCollector(limit=limit)
    col.refresh()
    c0, w0 = time.process_time(), time.perf_counter()
    n = 20
    for _ in range(n):
        snap = col.refresh()
    return {
        "apps": len(snap.apps), "replicas": sum(len(a.replicas) for a in snap.apps),
        "calls_per_refresh": snap.calls,
        "cpu_ms_per_refresh": round((time.process_time() - c0) / n * 1000, 2),
        "wall_ms_per_refresh": round((time.perf_counter() - w0) / n * 1000, 2),
    }


def serve_cpu() -> float:
    proc = subprocess.Popen([sys.executable, "-m", "tsm.cli.main", "serve", "--port", "0", "--interval", "1"],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().split(": ", 1)[1].strip()
        stream = urllib.request.urlopen(url + "api/events", timeout=30)  # one open page
        stream.readline()
        time.sleep(3)
        c0, t0 = cpu_seconds(proc.pid), time.monotonic()
        deadline = t0 + WINDOW
        while time.monotonic() < deadline:  # keep reading the pushed snapshots, as a page does
            stream.readline()
        pct = (cpu_seconds(proc.pid) - c0) / (time.monotonic() - t0) * 100
        stream.close()
        return round(pct, 2)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)


def top_cpu() -> tuple[float, int]:
    out = subprocess.run([sys.executable, "-c", TOP_CHILD, str(WINDOW)], capture_output=True, text=True,
                         timeout=120, check=True).stdout.split()
    return round(float(out[0]) * 100, 2), int(out[1])


def launch(runner: Any, apps: int, replicas: int) -> tuple[list[str], float]:
    """Start ``apps`` local apps of ``replicas`` sleeping replicas each; their handles and the time it took."""
    from tsm.specs.api import AppDef, Resource, Role

    handles: list[str] = []
    t0 = time.perf_counter()
    for i in range(apps):
        handles.append(runner.run(AppDef(f"idle{i}", [Role("w", image=".", entrypoint="sleep", args=["600"],
                                                            num_replicas=replicas,
                                                            resource=Resource(cpu=1, gpu=0, memMB=64))]), "local"))
    return handles, time.perf_counter() - t0


def main() -> None:
    global APPS, WINDOW
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", "--smoke", action="store_true", help="tiny sizes: checks that the benchmark still runs")
    tiny = ap.parse_args().tiny
    if tiny:
        APPS, WINDOW = 3, 2.0
    from tsm.runner.api import get_runner
    from tsm.specs.api import AppDef, Resource, Role
    from tsm.store import Store

    private_home()
    with get_runner() as runner:
        handles: list[str] = []
        try:
            handles, launch_s = launch(runner, APPS, 1)
            running = collector_figures()
            serve = serve_cpu()
            top, top_rows = top_cpu()
        finally:
            for h in handles:
                runner.cancel(h)
    emit("views: refresh with 100 running local apps", "store queries constant; view < 5 % of one core at 1 Hz",
         launch_s=round(launch_s, 1), collector=running, serve_cpu_pct_of_one_core=serve,
         top_cpu_pct_of_one_core=top, top_rows=top_rows)

    private_home()  # the same with 10 replicas per app: 1,000 running replicas (sleep processes)
    per_app = 2 if tiny else 10
    with get_runner() as runner:
        handles = []
        try:
            handles, launch_s = launch(runner, APPS, per_app)
            running = collector_figures()
            top, top_rows = top_cpu()
        finally:
            for h in handles:
                runner.cancel(h)
    emit("views: refresh with 1,000 running local replicas (100 apps of 10)",
         "calls per refresh as with 100 replicas; view < 5 % of one core at 1 Hz",
         launch_s=round(launch_s, 1), collector=running, top_cpu_pct_of_one_core=top, top_rows=top_rows)

    sizes = {}
    for apps, replicas in ((1, 10), (APPS, 10)):
        private_home()
        spec = json.dumps(AppDef("many", [Role("w", image=".", entrypoint="true", num_replicas=replicas,
                                               resource=Resource(cpu=1, gpu=0, memMB=64))]).to_dict())
        with Store() as s:
            stmts: list[tuple[str, tuple[object, ...]]] = []
            for a in range(apps):
                stmts.append(("INSERT INTO apps(handle, scheduler, session, app_id, name, state, created, updated, "
                              "spec) VALUES (?,?,?,?,?,?,?,?,?)",
                              (f"local://default/m-{a}", "local", "default", f"m-{a}", "many", 3, a, a, spec)))
                stmts.append(("INSERT INTO local_apps(app_id, session, name, state, created, app_dir, log_dir, spec) "
                              "VALUES (?,?,?,?,?,?,?,?)", (f"m-{a}", "default", "many", 3, a, "/none", "/none", spec)))
                stmts += [("INSERT INTO local_replicas(app_id, role, idx, state, exit_code) VALUES (?,?,?,?,0)",
                           (f"m-{a}", "w", k, 3)) for k in range(replicas)]
            s.write(stmts)
        sizes[f"{apps * replicas}_replicas"] = collector_figures(limit=None)
    emit("views: refresh of 10 vs 1,000 replicas", "same calls per refresh", **sizes)


if __name__ == "__main__":
    main()
