"""Docker scheduler figures on the local engine of ``scripts/docker-up``, one JSON object per line.

    .venv/bin/python benchmarks/docker_bench.py          # as root it starts the engine (scripts/docker-up)

Lines:

* ``docker_latency`` (replicas 1 and 32): seconds from ``submit`` to every replica seen RUNNING and from
  the replicas' exit to ``wait`` returning SUCCEEDED, for a role running ``sleep 2`` (the exit time is
  the latest ``FinishedAt`` Docker recorded). ``baseline``: the same with ``docker run -d`` for each
  container and ``docker wait`` (the CLI, sequentially), so the figures say what tsm adds. Median of 3.
* ``docker_submit`` (replicas 32): seconds from ``submit`` to every replica seen RUNNING, for tsm as it is
  (the role's containers created at most ``CREATE_CONCURRENCY`` at once), tsm creating them one after the
  other (``CREATE_CONCURRENCY=1``: the code before issue 26), and the floor: 32 ``containers.run(detach=True)``
  of the same image issued at once through the SDK (the network made beforehand), until the list shows all
  running. Median of 3, interleaved; ``ratio`` is the median over the floor's (target: 1.2 or less).
* ``docker_workspace``: seconds of a dry run + schedule with ``--workspace`` for a workspace of 200 small
  files and 20 MB: the first time (image built) and unchanged (reused: no build), with the build count.

Without an engine and without root to start one, prints a single ``skipped`` line and exits 0.
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
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IMAGE = f"tsm-test/python:{os.environ.get('TSM_TEST_IMAGE_TAG', '3')}"


def emit(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


def engine_ready(start: bool = True) -> str | None:
    if start and os.geteuid() == 0:
        proc = subprocess.run(["bash", str(ROOT / "scripts" / "docker-up")], capture_output=True, text=True)
        if proc.returncode != 0:
            return f"scripts/docker-up failed: {proc.stderr[-500:]}"
    proc = subprocess.run(["docker", "image", "inspect", IMAGE], capture_output=True)
    return None if proc.returncode == 0 else "no Docker engine with the test image (run scripts/docker-up as root)"


def _finished_at(names: list[str]) -> float:
    out = subprocess.run(["docker", "inspect", "-f", "{{.State.FinishedAt}}", *names], capture_output=True,
                         text=True, check=True).stdout.split()
    latest = 0.0
    for text in out:
        base, _, frac = text.rstrip("Z").partition(".")
        latest = max(latest, datetime.fromisoformat(base + "+00:00").timestamp() + float("0." + (frac or "0")[:6]))
    return latest


def tsm_once(n: int) -> tuple[float, float]:
    from tsm.schedulers.docker.scheduler import DockerScheduler
    from tsm.specs.api import AppDef, AppState, Resource, Role

    s = DockerScheduler("bench")
    app = AppDef("bench", [Role("r", image=IMAGE, entrypoint="sleep", args=["2"], num_replicas=n,
                                resource=Resource(cpu=1, memMB=64))])
    t0 = time.time()
    app_id = s.submit(app)
    while True:
        d = s.describe(app_id)
        assert d is not None
        if all(r.state in (AppState.RUNNING, AppState.SUCCEEDED) for rs in d.roles_statuses for r in rs.replicas):
            break
        time.sleep(0.02)
    running = time.time() - t0
    d = s.wait(app_id, timeout=600)
    done = time.time()
    assert d is not None and d.state == AppState.SUCCEEDED, d
    exited = _finished_at([f"{app_id}-r-{k}" for k in range(n)])
    s.remove(app_id)
    s.close()
    return running, done - exited


def baseline_once(n: int) -> tuple[float, float]:
    net = f"bench-{os.getpid()}"
    subprocess.run(["docker", "network", "create", net], capture_output=True, check=True)
    names = [f"{net}-{k}" for k in range(n)]
    t0 = time.time()
    for name in names:
        subprocess.run(["docker", "run", "-d", "--name", name, "--network", net, IMAGE, "sleep", "2"],
                       capture_output=True, check=True)
    running = time.time() - t0
    subprocess.run(["docker", "wait", *names], capture_output=True, check=True)
    done = time.time()
    exited = _finished_at(names)
    subprocess.run(["docker", "rm", "-f", *names], capture_output=True)
    subprocess.run(["docker", "network", "rm", net], capture_output=True)
    return running, done - exited


def _all_running(listing: object, n: int) -> None:
    """Poll ``listing()`` (a list of states) until ``n`` are running."""
    while sum(1 for st in listing() if st == "running") < n:  # type: ignore[operator]
        time.sleep(0.02)


def submit_tsm_once(n: int, concurrency: int | None = None) -> float:
    from tsm.schedulers.docker import scheduler as mod
    from tsm.specs.api import AppDef, Resource, Role

    keep = mod.CREATE_CONCURRENCY
    if concurrency is not None:
        mod.CREATE_CONCURRENCY = concurrency
    s = mod.DockerScheduler("bench")
    try:
        s.client.list_containers()  # connected before the clock starts, as the floor's client is
        app = AppDef("sub", [Role("r", image=IMAGE, entrypoint="sleep", args=["60"], num_replicas=n,
                                  resource=Resource(cpu=1, memMB=64))])
        t0 = time.time()
        app_id = s.submit(app)
        _all_running(lambda: [r.state.name.lower() for d in [s.describe(app_id)] if d is not None
                              for rs in d.roles_statuses for r in rs.replicas], n)
        took = time.time() - t0
        s.cancel(app_id)
        s.remove(app_id)
        return took
    finally:
        mod.CREATE_CONCURRENCY = keep
        s.close()


def submit_floor_once(n: int) -> float:
    from concurrent.futures import ThreadPoolExecutor

    import docker

    client = docker.from_env(timeout=120)
    net = client.networks.create(f"bench-floor-{os.getpid()}", driver="bridge")
    label = {"tsm-bench-floor": str(os.getpid())}
    try:
        t0 = time.time()
        with ThreadPoolExecutor(max_workers=n) as pool:
            list(pool.map(lambda k: client.containers.run(IMAGE, ["sleep", "60"], detach=True, network=net.name,
                                                          labels=label, init=True), range(n)))
        _all_running(lambda: [c.status for c in client.containers.list(
            all=True, filters={"label": "tsm-bench-floor"}, sparse=True)], n)
        return time.time() - t0
    finally:
        for c in client.containers.list(all=True, filters={"label": "tsm-bench-floor"}):
            c.remove(force=True)
        net.remove()
        client.close()


def submit(n: int = 32, rounds: int = 3) -> None:
    runs: dict[str, list[float]] = {"tsm": [], "tsm_sequential": [], "floor": []}
    for _ in range(rounds):  # interleaved: a slow moment of the host touches every variant alike
        runs["floor"].append(submit_floor_once(n))
        runs["tsm"].append(submit_tsm_once(n))
        runs["tsm_sequential"].append(submit_tsm_once(n, concurrency=1))
    floor = statistics.median(runs["floor"])
    for how, times in runs.items():
        med = statistics.median(times)
        emit(bench="docker_submit", how=how, replicas=n, submit_to_running_s=round(med, 3),
             runs=[round(t, 3) for t in times], ratio=round(med / floor, 2))


def latency(sizes: tuple[int, ...] = (1, 32)) -> None:
    for n in sizes:
        for how, fn in (("tsm", tsm_once), ("baseline", baseline_once)):
            runs = [fn(n) for _ in range(3)]
            emit(bench="docker_latency", how=how, replicas=n,
                 submit_to_running_s=round(statistics.median(r[0] for r in runs), 3),
                 exit_to_wait_s=round(statistics.median(r[1] for r in runs), 3))


def workspace() -> None:
    from tsm.runner.api import Runner
    from tsm.schedulers.docker.scheduler import DockerScheduler
    from tsm.specs.api import AppDef, Resource, Role

    with tempfile.TemporaryDirectory() as tmp:
        ws = Path(tmp) / "ws"
        ws.mkdir()
        for i in range(200):
            (ws / f"f{i}.py").write_text(f"x = {i}\n")
        (ws / "data.bin").write_bytes(os.urandom(20 << 20))
        s = DockerScheduler("bench")
        runner = Runner("bench", scheduler_factories={"docker": lambda *a, **k: s})
        role = Role("r", image=IMAGE, entrypoint="true", resource=Resource(cpu=1, memMB=64))
        tags = []
        for label in ("first", "unchanged"):
            builds = s.images.calls.get("build", 0)
            t0 = time.time()
            info = runner.dryrun(AppDef("ws", [role]), "docker", workspace=str(ws))
            handle = runner.schedule(info)
            took = time.time() - t0
            runner.wait(handle, timeout=600)
            tags.append(info.request.containers[0].image)
            emit(bench="docker_workspace", run=label, files=201, mb=20, seconds=round(took, 3),
                 builds=s.images.calls.get("build", 0) - builds)
            s.remove(handle.rsplit("/", 1)[-1])
        subprocess.run(["docker", "rmi", "-f", *set(tags)], capture_output=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", "--smoke", action="store_true", help="tiny sizes; never starts the engine (smoke)")
    ap.add_argument("--only", choices=("latency", "submit", "workspace"), help="run one of the measures")
    args = ap.parse_args()
    tiny = args.tiny
    why = engine_ready(start=not tiny)
    if why:
        emit(bench="docker", skipped=why)
        return 0
    os.environ.setdefault("TSM_HOME", tempfile.mkdtemp(prefix="tsm-docker-bench-"))
    if args.only in (None, "latency"):
        latency((1,) if tiny else (1, 32))
    if args.only in (None, "submit"):
        submit(4 if tiny else 32, 1 if tiny else 3)
    if args.only in (None, "workspace"):
        workspace()
    return 0


if __name__ == "__main__":
    sys.exit(main())
