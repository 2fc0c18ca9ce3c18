"""How cost grows with replicas: submit, status, log read and cancel at 1, 10, 100, 1,000 (10,000 on local).

For every scheduler whose engine is up (local always; Slurm, Docker, Kubernetes and Ray when the engine
benchmarks' own checks say so, never starting one), one app of N ``sleep`` replicas is submitted (``submit``:
until ``submit`` returns), described once all run (``status``: median of three ``describe``), then cancelled
(``cancel``: until ``cancel`` returns and the app is terminal); a second app of N replicas that each print one
line is run to its end and every replica's log is read (``logs``: one ``log_iter_many`` where the backend has
it, else ``log_iter`` per replica). On local each figure has its physical baseline beside it, measured in the
same run: N ``Popen`` of ``sleep``, N reads of ``/proc/PID/stat``, N ``open().read()`` of the log files, and
``kill`` of N ``sleep``s by a plain loop until all are reaped.

Prints one JSON line per (scheduler, N) and writes, per scheduler, ``scaling-<name>.json`` and
``scaling-<name>.svg`` (time against replicas, both axes logarithmic, each baseline dashed beside its
measure) into ``--out`` (default ``docs/perf/``). A measure growing faster than linearly shows as a slope
above the baseline's. ``--tiny`` runs N = 1 and 3 into a temporary folder (``make bench-smoke``).
Not timed assertions: the figures depend on the machine's load (printed on the ``machine`` line).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
ROOT = Path(__file__).resolve().parents[1]

MEASURES = ("submit", "status", "logs", "cancel")
COLOURS = {"submit": "#1f77b4", "status": "#2ca02c", "logs": "#9467bd", "cancel": "#d62728"}
#: Seconds to wait for N replicas to be running (or a run to end) before giving up on that size.
READY_TIMEOUT = 600.0


def emit(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


# -- which engines are up, and what an app looks like on each -------------------------------------------------------
def engines() -> dict[str, str | None]:
    """Scheduler name -> None when its engine is up, else why not (each engine benchmark's own check)."""
    out: dict[str, str | None] = {"local": None}
    try:
        import slurm_bench

        out["slurm"] = slurm_bench.cluster_ready(start=False)
    except Exception as e:  # noqa: BLE001 - a check that cannot run means "not up"
        out["slurm"] = f"check failed: {e}"
    try:
        import docker_bench

        out["docker"] = docker_bench.engine_ready(start=False)
    except Exception as e:  # noqa: BLE001
        out["docker"] = f"check failed: {e}"
    try:
        import k8s_bench

        out["kubernetes"] = k8s_bench.cluster_ready()
    except Exception as e:  # noqa: BLE001
        out["kubernetes"] = f"check failed: {e}"
    try:
        import ray_bench

        out["ray"] = None if ray_bench.head_up() else "no Ray head is up (scripts/ray-up)"
    except Exception as e:  # noqa: BLE001
        out["ray"] = f"check failed: {e}"
    return out


def role_and_cfg(name: str, entry: str, args: list[str], n: int) -> tuple[Any, dict[str, Any]]:
    """A role of ``n`` replicas running ``entry args`` on scheduler ``name``, and the run config it needs."""
    from tsm.specs.api import Resource, Role

    if name == "local":
        return Role("r", entrypoint=entry, args=args, num_replicas=n), {"grace_period": 1.0}
    image = f"tsm-test/python:{os.environ.get('TSM_TEST_IMAGE_TAG', '3')}"
    small = Resource(cpu=1, memMB=64)
    if name == "kubernetes":
        return (Role("r", image, entry, args, num_replicas=n, resource=small),
                {"request_fraction": 0.01, "gang_timeout": READY_TIMEOUT, "grace_period": 0})
    if name == "docker":
        return Role("r", image=image, entrypoint=entry, args=args, num_replicas=n, resource=small), {}
    return Role("r", entrypoint=entry, args=args, num_replicas=n, resource=Resource(cpu=1, memMB=64)), {}


def scheduler(name: str) -> Any:
    from tsm.runner.api import get_runner

    runner = get_runner("scaling")
    return runner, runner._scheduler(name)  # noqa: SLF001 - the benchmark times the scheduler itself


# -- one size on one scheduler ---------------------------------------------------------------------------------------
def _until(pred: Callable[[], bool], timeout: float) -> bool:
    end = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > end:
            return False
        time.sleep(0.02)
    return True


def measure(name: str, sched: Any, n: int) -> dict[str, Any]:
    """The four figures (seconds) for ``n`` replicas on ``sched``, with local's baselines."""
    from tsm.schedulers.api import MultiReplicaLogs
    from tsm.specs.api import AppDef, AppState

    out: dict[str, Any] = {"scheduler": name, "replicas": n}
    role, cfg = role_and_cfg(name, "sleep", ["600"], n)
    t0 = time.perf_counter()
    app_id = sched.submit(AppDef(f"scale{n}", [role]), cfg)
    out["submit"] = time.perf_counter() - t0

    def running() -> bool:
        d = sched.describe(app_id)
        return d is not None and (d.state.is_terminal or all(
            r.state == AppState.RUNNING for rs in d.roles_statuses for r in rs.replicas))

    try:
        out["all_running"] = _until(running, READY_TIMEOUT)
    except BaseException:  # interrupted or failed while waiting: leave nothing queued on the engine
        sched.cancel(app_id)
        raise
    samples = []
    for _ in range(3):
        t0 = time.perf_counter()
        desc = sched.describe(app_id)
        samples.append(time.perf_counter() - t0)
    out["status"] = statistics.median(samples)
    pids = [r.pid for rs in desc.roles_statuses for r in rs.replicas if r.pid] if name == "local" and desc else []
    t0 = time.perf_counter()
    sched.cancel(app_id)
    _until(lambda: (d := sched.describe(app_id)) is None or d.state.is_terminal, READY_TIMEOUT)
    out["cancel"] = time.perf_counter() - t0

    role, cfg = role_and_cfg(name, "echo", ["line"], n)
    logs_id = sched.submit(AppDef(f"scalelog{n}", [role]), cfg)
    sched.wait(logs_id, timeout=READY_TIMEOUT)
    t0 = time.perf_counter()
    if isinstance(sched, MultiReplicaLogs):
        lines = sum(1 for _ in sched.log_iter_many(logs_id, None, text_only=True))
    else:
        lines = sum(1 for k in range(n) for _ in sched.log_iter(logs_id, "r", k))
    out["logs"] = time.perf_counter() - t0
    out["log_lines"] = lines
    if name == "local":
        out.update(local_baselines(n, pids, sched, logs_id))
        sched.remove(logs_id)
        sched.remove(app_id)
    return out


def local_baselines(n: int, pids: list[int], sched: Any, logs_id: str) -> dict[str, float]:
    """What the machine itself takes for the same work: N spawns, N /proc reads, N file reads, N kills."""
    row = sched.app_row(logs_id)  # where the log files are
    t0 = time.perf_counter()
    procs = [subprocess.Popen(["sleep", "600"]) for _ in range(n)]
    submit = time.perf_counter() - t0
    t0 = time.perf_counter()
    for p in procs:
        with open(f"/proc/{p.pid}/stat", "rb") as f:
            f.read()
    status = time.perf_counter() - t0
    t0 = time.perf_counter()
    for p in procs:
        p.kill()
    for p in procs:
        p.wait()
    cancel = time.perf_counter() - t0
    t0 = time.perf_counter()
    for k in range(n):
        with open(os.path.join(row["log_dir"], "r", str(k), "stdout"), "rb") as f:
            f.read().splitlines()
    logs = time.perf_counter() - t0
    return {"baseline_submit": submit, "baseline_status": status, "baseline_cancel": cancel, "baseline_logs": logs}


# -- the chart --------------------------------------------------------------------------------------------------------
def svg(name: str, rows: list[dict[str, Any]], machine: str) -> str:
    """A log-log chart of every measure (solid) and its baseline (dashed) against replicas, as SVG text."""
    import math

    w, h, left, right, top, bottom = 640, 400, 70, 130, 40, 50
    xs = sorted({r["replicas"] for r in rows})
    ys = [r[k] for r in rows for k in (*MEASURES, *(f"baseline_{m}" for m in MEASURES)) if r.get(k)]
    if not xs or not ys:
        return ""
    x0, x1 = math.log10(min(xs)), math.log10(max(xs)) or 1.0
    y0, y1 = math.floor(math.log10(min(ys))), math.ceil(math.log10(max(ys)))
    y1 = y1 if y1 > y0 else y0 + 1

    def px(x: float) -> float:
        return left + (math.log10(x) - x0) / ((x1 - x0) or 1.0) * (w - left - right)

    def py(y: float) -> float:
        return top + (y1 - math.log10(y)) / (y1 - y0) * (h - top - bottom)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" '
             f'font-size="11"><rect width="{w}" height="{h}" fill="white"/>',
             f'<text x="{left}" y="20" font-size="13">{name}: time against replicas (log-log; dashed: baseline)</text>']
    for e in range(int(y0), int(y1) + 1):
        y = py(10.0**e)
        parts.append(f'<line x1="{left}" y1="{y:.1f}" x2="{w - right}" y2="{y:.1f}" stroke="#ddd"/>'
                     f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{_seconds(10.0**e)}</text>')
    for x in xs:
        parts.append(f'<line x1="{px(x):.1f}" y1="{top}" x2="{px(x):.1f}" y2="{h - bottom}" stroke="#eee"/>'
                     f'<text x="{px(x):.1f}" y="{h - bottom + 16}" text-anchor="middle">{x:,}</text>')
    parts.append(f'<text x="{(left + w - right) / 2}" y="{h - 12}" text-anchor="middle">replicas</text>')
    for i, m in enumerate(MEASURES):
        for key, dash in ((m, ""), (f"baseline_{m}", ' stroke-dasharray="5,4"')):
            pts = [(px(r["replicas"]), py(r[key])) for r in rows if r.get(key)]
            if pts:
                path = " ".join(f"{x:.1f},{y:.1f}" for x, y in pts)
                parts.append(f'<polyline points="{path}" fill="none" stroke="{COLOURS[m]}" stroke-width="2"{dash}/>')
        ly = top + 14 + i * 18
        parts.append(f'<line x1="{w - right + 10}" y1="{ly}" x2="{w - right + 30}" y2="{ly}" stroke="{COLOURS[m]}" '
                     f'stroke-width="2"/><text x="{w - right + 35}" y="{ly + 4}">{m}</text>')
    parts.append(f'<text x="{left}" y="{h - 28}" fill="#666">{machine}</text></svg>')
    return "\n".join(parts) + "\n"


def _seconds(s: float) -> str:
    return f"{s * 1e6:g} µs" if s < 1e-3 else f"{s * 1e3:g} ms" if s < 1 else f"{s:g} s"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", "--smoke", action="store_true", help="N = 1 and 3 only, into a temporary folder")
    ap.add_argument("--schedulers", nargs="*", help="only these (default: every one whose engine is up)")
    ap.add_argument("--max", type=int, default=None, help="largest N (default 10,000 on local, 1,000 elsewhere)")
    ap.add_argument("--out", default=str(ROOT / "docs" / "perf"), help="folder for the JSON and SVG files")
    args = ap.parse_args()
    args.out = os.path.abspath(args.out)
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    os.environ["TSM_HOME"] = tempfile.mkdtemp(prefix="tsm-scaling-")
    out_dir = Path(tempfile.mkdtemp(prefix="tsm-scaling-out-") if args.tiny else args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    os.chdir(tempfile.mkdtemp(prefix="tsm-scaling-cwd-"))  # engines that ship the working directory ship nothing
    load = Path("/proc/loadavg").read_text().split()[:3]
    machine = f"{os.cpu_count()} CPUs, load {' / '.join(load)} at start, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
    emit(machine=machine)
    status = engines()
    for name, why in status.items():
        if args.schedulers and name not in args.schedulers:
            continue
        if why is not None:
            emit(scheduler=name, skipped=why)
            continue
        sizes = (1, 3) if args.tiny else (1, 10, 100, 1000, 10_000) if name == "local" else (1, 10, 100, 1000)
        limit = args.max or (10_000 if name == "local" else 1000)
        runner, sched = scheduler(name)
        rows: list[dict[str, Any]] = []
        try:
            for n in (s for s in sizes if s <= limit):
                try:
                    r = measure(name, sched, n)
                except Exception as e:  # noqa: BLE001 - one size failing still leaves the others' figures
                    emit(scheduler=name, replicas=n, error=f"{type(e).__name__}: {e}"[:500])
                    break
                rows.append(r)
                emit(**{k: round(v, 6) if isinstance(v, float) else v for k, v in r.items()})
        finally:
            runner.close()
        if rows:
            (out_dir / f"scaling-{name}.json").write_text(json.dumps({"machine": machine, "rows": rows}, indent=1) + "\n")
            (out_dir / f"scaling-{name}.svg").write_text(svg(name, rows, machine))
            emit(scheduler=name, wrote=[str(out_dir / f"scaling-{name}.json"), str(out_dir / f"scaling-{name}.svg")])
    return 0


if __name__ == "__main__":
    sys.exit(main())
