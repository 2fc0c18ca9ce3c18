"""The test plan of ``make test``: the suite split into pytest runs that go side by side, and where the time went.

Most of the real-engine tests wait on their engine (a pod to start, a Slurm time limit to pass), not on the
CPU, so each engine's tests run in a process of their own, beside the others and beside the engine-free tests
(which run on every core through pytest-xdist)::

    kubernetes   -m kubernetes                               one process (waits for the cluster's first build)
    slurm        -m "slurm and not kubernetes"               one process (tests share the four nodes: serial)
    docker       -m "docker and not (slurm or kubernetes)"   one process
    ray          -m "ray and not (docker or ...)"            one process
    main         everything else                             pytest-xdist, one worker per core, at nice 10

The marker expressions partition the suite: every collected test is in exactly one run. The main run starts at
once; a collection pass in this process meanwhile lists each engine run's files (so those import only the
modules they need) and finds any test that uses an engine's fixture without that engine's marker (it would
start the engine in the wrong run): such a test fails the plan.
Tests of one engine stay in one process because they share its capacity (four Slurm nodes, one kubelet) and
some take all of it on purpose (a node set down, a preemption).

Each run writes its output to ``build/tests/NAME.log`` (printed whole when it ends) and the duration of each
test's setup, call and teardown to ``build/tests/NAME.timings.json``; at the end this prints each run's
wall-clock span, the engines' start-up lines, and the 20 slowest tests of all runs, on the clock of
``$SUITES_CLOCK_START`` (seconds since the epoch: .ci/run's start) when set. The exit status is 0 only if every
run passed.

Usage: ``python tests/suites.py [--only NAME,...] [--make TARGET ...] [-- PYTEST_ARGS...]``; ``--make`` runs a
make target beside the suites as one more run (its exit status counts the same).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "build" / "tests"
ENGINES = ("kubernetes", "slurm", "docker", "ray")  # a test with several engine markers runs with the first
FIXTURES = {"k8s_cluster": "kubernetes", "slurm_cluster": "slurm", "ssh_server": "slurm", "docker_engine": "docker",
            "ray_cluster": "ray"}
MAIN_NICE = 10  # see pytest_run
HEARTBEAT = 120.0  # seconds between the "still running" lines, so a long wait never looks like a hang


def marker_expression(name: str) -> str:
    """The ``-m`` expression of run ``name``: its engine and none of the engines before it, or no engine."""
    if name == "main":
        return f"not ({' or '.join(ENGINES)})"
    earlier = ENGINES[: ENGINES.index(name)]
    return name if not earlier else f"{name} and not ({' or '.join(earlier)})"


def suite_of(markers: set[str]) -> str:
    """The run a test with these marker names belongs to (what :func:`marker_expression` selects)."""
    return next((e for e in ENGINES if e in markers), "main")


@dataclass
class Run:
    """One process of the plan: a pytest run over some files, or a make target."""

    name: str
    argv: list[str]
    nice: int = 0
    tests: int = 0
    files: int = 0
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    ended: float = 0.0
    returncode: int | None = None
    log: Path = field(default_factory=Path)

    @property
    def timings(self) -> Path:
        return OUT / f"{self.name}.timings.json"


class _Collector:
    """A pytest plugin that records each collected test's file, markers and fixtures."""

    def __init__(self) -> None:
        self.items: list[tuple[str, set[str], set[str]]] = []

    def pytest_collection_finish(self, session) -> None:  # type: ignore[no-untyped-def]
        for item in session.items:
            markers = {m.name for m in item.iter_markers()}
            self.items.append((item.nodeid, markers, set(getattr(item, "fixturenames", ()))))


def collect(pytest_args: list[str]) -> tuple[dict[str, dict[str, int]], list[str]]:
    """Each run's files (in collection order) with their test counts, from one collection pass, and the tests
    marked wrongly (an engine's fixture without its marker, an engine's marker without ``integration``)."""
    import pytest

    collector = _Collector()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):  # one line per test: shown only if the collection fails
        code = pytest.main(["--collect-only", "-q", "-m", "", "-p", "no:cacheprovider", *pytest_args],
                           plugins=[collector])
    if code != 0:
        sys.stdout.write(out.getvalue())
        raise SystemExit(f"suites: collecting the tests failed (pytest exit {code})")
    files: dict[str, dict[str, int]] = {}
    wrong = []
    for nodeid, markers, fixtures in collector.items:
        per_file = files.setdefault(suite_of(markers), {})
        per_file[nodeid.split("::")[0]] = per_file.get(nodeid.split("::")[0], 0) + 1
        needs = {FIXTURES[f] for f in fixtures if f in FIXTURES} - markers
        if needs:
            wrong.append(f"{nodeid} uses the {', '.join(sorted(needs))} fixture without the marker")
        elif markers & set(ENGINES) and "integration" not in markers:
            wrong.append(f"{nodeid} is marked {', '.join(sorted(markers & set(ENGINES)))} but not integration")
    return files, wrong


def pytest_run(name: str, pytest_args: list[str], files: dict[str, int] | None = None, workers: int = 1) -> Run:
    """Run ``name``: pytest with its marker expression over ``files`` (all of ``pytest_args``' tests if None).

    The main run, which keeps every core busy, runs at a lower priority than the engines' runs: those mostly wait
    on their engine, and get the CPU at once when they need it (as does a Kubernetes build in the background)."""
    spread = ["-n", str(workers), "--dist", "worksteal"] if workers > 1 else []
    argv = [sys.executable, "-m", "pytest", "-q", "-m", marker_expression(name), *spread,
            f"--timings={OUT / f'{name}.timings.json'}", *pytest_args, *(files or ())]
    return Run(name, argv, nice=MAIN_NICE if name == "main" else 0, tests=sum(files.values()) if files else 0,
               files=len(files) if files else 0, log=OUT / f"{name}.log")


def clock(seconds: float) -> str:
    """``m:ss`` of a span."""
    return f"{int(seconds) // 60}:{int(seconds) % 60:02d}"


def start(run: Run, t0: float) -> None:
    run.log.parent.mkdir(parents=True, exist_ok=True)
    with open(run.log, "wb") as log:
        run.proc = subprocess.Popen(run.argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    preexec_fn=(lambda: os.nice(run.nice)) if run.nice else None)  # noqa: PLW1509
    run.started = time.time()
    what = f"{run.tests} tests in {run.files} files" if run.files else " ".join(run.argv)
    print(f"[{clock(run.started - t0)}] start  {run.name:<11} {what}", flush=True)


def finish(run: Run, t0: float) -> None:
    """Record the end of ``run`` and print its whole log."""
    assert run.proc is not None
    run.returncode = run.proc.returncode
    run.ended = time.time()
    verdict = "passed" if run.returncode == 0 else f"FAILED (exit {run.returncode})"
    bar = "=" * 30
    print(f"\n{bar} [{clock(run.ended - t0)}] {run.name}: {verdict} after {clock(run.ended - run.started)} {bar}",
          flush=True)
    sys.stdout.write(run.log.read_text(errors="replace"))
    print(f"{bar} end of {run.name} {bar}\n", flush=True)


def wait_all(runs: list[Run], t0: float) -> None:
    """Wait for every run, printing each one's log as it ends and a heartbeat while any is left."""
    beat = time.time() + HEARTBEAT
    left = [r for r in runs if r.proc is not None]
    while left:
        for run in list(left):
            assert run.proc is not None
            if run.proc.poll() is not None:
                finish(run, t0)
                left.remove(run)
        if left and time.time() >= beat:
            beat += HEARTBEAT
            now = time.time()
            print(f"[{clock(now - t0)}] running: " + ", ".join(f"{r.name} ({clock(now - r.started)})" for r in left),
                  flush=True)
        time.sleep(0.5)  # the runs are separate processes with their own logs: a poll of their exits suffices


def phases(run: Run) -> dict[str, dict[str, tuple[float, str]]]:
    """Each test of ``run``: its phases' (duration, outcome), from the run's timings file."""
    per_test: dict[str, dict[str, tuple[float, str]]] = {}
    if run.timings.is_file():
        for entry in json.loads(run.timings.read_text()):
            per_test.setdefault(entry["nodeid"], {})[entry["when"]] = (entry["duration"], entry["outcome"])
    return per_test


def slowest(runs: list[Run], count: int = 20) -> list[str]:
    """The ``count`` slowest tests of all runs (setup + call + teardown), with the setup's share."""
    rows: list[tuple[float, float, str, str]] = []
    for run in runs:
        for nodeid, p in phases(run).items():
            rows.append((sum(d for d, _ in p.values()), p.get("setup", (0.0, ""))[0], run.name, nodeid))
    rows.sort(reverse=True)
    return [f"{total:8.1f}s  (setup {setup:6.1f}s)  {name:<10}  {nodeid}" for total, setup, name, nodeid in rows[:count]]


def outcome_line(runs: list[Run]) -> str:
    """``tests: N passed, N failed, N skipped`` over every run (a failed setup or teardown is a failure)."""
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    for run in runs:
        for p in phases(run).values():
            outcomes = {o for _, o in p.values()}
            counts["failed" if "failed" in outcomes else "skipped" if "skipped" in outcomes else "passed"] += 1
    return f"tests: {counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped"


def engine_lines(runs: list[Run]) -> list[str]:
    """The engines' start-up lines the integration conftest prints at the end of each run."""
    starts = ("slurm cluster:", "test sshd", "docker engine:", "ray head:", "kubernetes cluster:")
    found = []
    for run in runs:
        if run.log.is_file():
            found += [f"{run.name:<11} {line.strip()}" for line in run.log.read_text(errors="replace").splitlines()
                      if line.startswith(starts)]
    return found


def report(runs: list[Run], t0: float) -> None:
    """Each run's span on one clock, the engines' start-up, and the slowest tests."""
    print("\n== test runs (wall clock, from the start of .ci/run when it runs this, else of this plan) ==")
    print(f"{'run':<11} {'tests':>5}  {'start':>6} {'end':>6} {'took':>6}  result")
    for run in runs:
        result = "passed" if run.returncode == 0 else f"FAILED (exit {run.returncode})"
        print(f"{run.name:<11} {run.tests or '':>5}  {clock(run.started - t0):>6} {clock(run.ended - t0):>6} "
              f"{clock(run.ended - run.started):>6}  {result}")
    print(f"all runs: {clock(max(r.ended for r in runs) - t0)}")
    lines = engine_lines(runs)
    if lines:
        print("\n== engines (each run's fixture: started, or found running, and how long having it took) ==")
        print("\n".join(lines))
    table = slowest(runs)
    print(f"\n{outcome_line(runs)}")
    if table:
        print("\n== the 20 slowest tests (setup + call + teardown; a run's first test's setup includes its "
              "engine's start) ==")
        print("\n".join(table))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="", help="comma-separated runs to run (kubernetes,slurm,docker,ray,main)")
    ap.add_argument("--make", action="append", default=[], metavar="TARGET", help="a make target run beside")
    ap.add_argument("--workers", type=int, default=int(os.environ.get("SUITES_WORKERS", os.cpu_count() or 1)),
                    help="pytest-xdist workers of the main run (default: one per core, or $SUITES_WORKERS)")
    ap.add_argument("pytest_args", nargs="*", help="more pytest arguments for every run (after --)")
    args = ap.parse_args(argv)
    # the runs start with SIGINT and SIGQUIT at their defaults even when this was started ignoring them (a
    # background job of a non-interactive shell), as the tests of what a replica inherits expect of their caller
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)
    t0 = float(os.environ.get("SUITES_CLOCK_START") or time.time())  # .ci/run's start: one clock for its log
    wanted = set(args.only.split(",")) if args.only else {*ENGINES, "main"}
    for stale in [*OUT.glob("*.timings.json"), OUT / "outcome.txt"]:
        stale.unlink(missing_ok=True)
    # the engine-free run needs no file list: it starts at once, beside the make targets, and the collection
    # pass that plans the engines' runs overlaps them
    runs = [pytest_run("main", args.pytest_args, workers=args.workers)] if "main" in wanted else []
    runs += [Run(f"make-{t}", ["make", "--no-print-directory", t], log=OUT / f"make-{t}.log") for t in args.make]
    for run in runs:
        start(run, t0)
    files, wrong = collect(args.pytest_args)
    print(f"[{clock(time.time() - t0)}] collected: "
          + ", ".join(f"{name} {sum(f.values())} tests" for name, f in files.items()), flush=True)
    engine_runs = [pytest_run(name, args.pytest_args, files[name]) for name in ENGINES
                   if name in wanted and files.get(name)]
    for run in engine_runs:
        start(run, t0)
    runs = engine_runs + runs
    wait_all(runs, t0)
    report(runs, t0)
    (OUT / "outcome.txt").write_text(outcome_line(runs) + "\n")
    if wrong:
        print("\nsuites: each engine's tests run in that engine's run, and `make test-fast` leaves out the "
              "integration marker; mark these tests:\n  " + "\n  ".join(wrong))
    return 0 if all(r.returncode == 0 for r in runs) and not wrong else 1


if __name__ == "__main__":
    sys.exit(main())
