"""``tsm status HANDLE``, ``tsm list`` and ``tsm --help`` beside a bare interpreter, with 100 and 10,000 apps in the home.

Each command runs two ways, interleaved with ``python -c pass`` of the same interpreter (the floor): *served*,
by the per-user command server (``tsm.cli._server``: what a user gets from the second read of a minute on),
and *in-process* (``TSM_CLI_SERVER=0``: what every read cost before the server). One JSON line per command and
home size: the median wall time and CPU of each way over ``--runs`` runs, the bare interpreter's beside them,
the ratios, and whether the served output is byte for byte the in-process output. The CPU is the command's own
process (a served command's work is done in the server's child: the wall time counts it).

Bytecode is compiled first and ``PYTHONDONTWRITEBYTECODE`` unset (this machine's shells set it), as an installed
tsm runs. The apps are real local apps (``/bin/true``, run to their end). Target: served <= 1.5 x the bare
interpreter for each command and size. Not timed assertions: the ``machine`` line says how loaded it was.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from _util import private_home  # noqa: E402

PY = sys.executable
TSM = str(Path(PY).parent / "tsm")
ROOT = Path(__file__).resolve().parents[1]


def make_apps(n: int) -> str:
    """``n`` ended local apps in the home (``/bin/true``, 50 in flight at a time); the handle of the middle one."""
    from tsm.runner.api import get_runner
    from tsm.specs.api import AppDef, Role

    handles: list[str] = []
    with get_runner() as runner:
        while len(handles) < n:
            batch = [runner.run(AppDef(f"a{len(handles) + i}", [Role("w", entrypoint="/bin/true")]), "local")
                     for i in range(min(50, n - len(handles)))]
            for h in batch:
                runner.wait(h)
            handles += batch
    return handles[n // 2]


def run(cmd: list[str], env: dict[str, str]) -> tuple[float, float, bytes]:
    """Wall and CPU (user + sys) seconds of ``cmd``, and its stdout."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    out = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, check=True).stdout
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, out


def warm_server(cmd: list[str], env: dict[str, str], home: str) -> None:
    """Run ``cmd`` until the home's command server runs (the second read of a minute starts it)."""
    for _ in range(3):
        run(cmd, env)
    deadline = time.monotonic() + 60
    while not list(Path(home, "cli").glob("*.sock")) and time.monotonic() < deadline:
        time.sleep(0.05)  # set-up only, never in a figure: the server binds its socket once it imported all
    run(cmd, env)


def machine() -> str:
    return f"load {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}, {os.cpu_count()} CPUs"


def measure(apps: int, runs: int, homes: str | None) -> None:
    """The rows of one home size; with ``homes``, the home ``homes/apps-N`` is made once and kept for later runs."""
    t0 = time.monotonic()
    if homes:
        home = os.path.join(homes, f"apps-{apps}")
        os.environ["TSM_HOME"] = home
        saved = Path(home + ".handle")
        if not saved.exists():
            saved.write_text(make_apps(apps))
        handle = saved.read_text()
    else:
        home = private_home()
        handle = make_apps(apps)
    made = time.monotonic() - t0
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "TSM_CLI_SERVER")}
    local = {**env, "TSM_CLI_SERVER": "0"}
    commands = {"tsm status HANDLE": [TSM, "status", handle], "tsm list": [TSM, "list"], "tsm --help": [TSM, "--help"]}
    for cmd in commands.values():
        warm_server(cmd, env, home)
    samples: dict[str, list[tuple[float, float]]] = {"bare": []}
    outputs: dict[str, set[bytes]] = {}
    for _ in range(runs):  # interleaved: the floor and each way of each command in every round
        samples["bare"].append(run([PY, "-c", "pass"], env)[:2])
        for name, cmd in commands.items():
            for way, e in (("served", env), ("in-process", local)):
                wall, cpu, out = run(cmd, e)
                samples.setdefault(f"{name}|{way}", []).append((wall, cpu))
                outputs.setdefault(f"{name}|{way}", set()).add(out)
    bare_wall = statistics.median(w for w, _ in samples["bare"])
    bare_cpu = statistics.median(c for _, c in samples["bare"])
    for name in commands:
        row: dict[str, Any] = {"measure": name, "apps": apps, "runs": runs, "unit": "ms",
                               "baseline": "python -c pass (same interpreter)",
                               "baseline_wall_ms": round(bare_wall * 1000, 2), "baseline_cpu_ms": round(bare_cpu * 1000, 2)}
        for way in ("served", "in-process"):
            walls = [w for w, _ in samples[f"{name}|{way}"]]
            cpus = [c for _, c in samples[f"{name}|{way}"]]
            key = way.replace("-", "_")
            row[f"{key}_wall_ms"] = round(statistics.median(walls) * 1000, 2)
            row[f"{key}_cpu_ms"] = round(statistics.median(cpus) * 1000, 2)
            row[f"{key}_x"] = round(statistics.median(walls) / bare_wall, 2)
        row["same_output"] = outputs[f"{name}|served"] == outputs[f"{name}|in-process"] and len(outputs[f"{name}|served"]) == 1
        row["target"] = "served <= 1.5 x python -c pass"
        row["met"] = row["served_x"] <= 1.5 and row["same_output"]
        row["home_made_s"] = round(made, 1)
        sys.stdout.write(json.dumps(row) + "\n")
        sys.stdout.flush()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", "--smoke", action="store_true", help="tiny sizes: checks that the benchmark still runs")
    ap.add_argument("--runs", type=int, default=15, help="runs of each command (interleaved), median taken")
    ap.add_argument("--apps", default="100,10000", help="apps in the home, one home per size (comma-separated)")
    ap.add_argument("--homes", default=None, help="keep the homes here (apps-N), made once: 10,000 apps take minutes")
    args = ap.parse_args()
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    subprocess.run([PY, "-m", "compileall", "-q", str(ROOT / "src" / "tsm")], check=True)
    sys.stdout.write(json.dumps({"measure": "machine", "at": "start", "machine": machine()}) + "\n")
    for n in ([3] if args.tiny else [int(x) for x in args.apps.split(",")]):
        measure(n, 3 if args.tiny else max(5, args.runs), None if args.tiny else args.homes)
    sys.stdout.write(json.dumps({"measure": "machine", "at": "end", "machine": machine()}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
