"""Slurm scheduler figures on the local test cluster, one JSON object per line.

    .venv/bin/python benchmarks/slurm_bench.py          # as root it starts the cluster (scripts/slurm-up)

Lines:

* ``slurm_latency``: for a trivial two-role app (trainer x2, ps x1, each ``true``), the seconds from
  submission to the first replica seen running and to the app seen SUCCEEDED (median of 3 runs; the app
  is watched with ``describe`` every 50 ms, so figures are within about 50 ms).
* ``slurm_wait_load``: the Slurm commands this process ran while 20 threads each ``wait`` on their own
  app for 30 s, against the number of ``describe`` polls those waits made: the shared
  :class:`tsm.schedulers.slurm.SlurmQueries` turns many polls into few ``squeue`` calls.

* ``slurm_status_many``: N apps submitted through tsm, held (``--hold``: they never take the shared
  cluster's nodes), then, interleaved and median of ``runs``: ``describe`` of every one of them with one fresh
  snapshot, ``list()`` and a views ``view_snapshot`` of all of them, each with the Slurm commands it ran,
  beside their floors run by hand on the same queue: ``squeue --json --me``, the ``squeue`` of the columns
  tsm asks for, and that ``squeue`` followed by the 7 days' ``sacct`` ``list()`` asks for (targets: describe
  <= 1.2 x the raw squeue, list <= 1.2 x the squeue and sacct by hand). The jobs are cancelled at the end.

* ``slurm_ssh``: issue 28, the same cluster reached over SSH (``-c ssh=...``) through the test sshd of
  ``scripts/sshd-up`` on 127.0.0.1 (started when root): the median seconds of a submission
  (``submit_dryrun`` + ``schedule``) and of a fresh ``describe`` (``max_age=0``: one ``squeue``, plus one
  ``tar`` of the job directory's small files while the job runs) over SSH against the same calls on the
  login node itself, and the first command's cost with no master connection (TCP, key exchange and
  authentication) against a command on the open master. Loopback hides network latency: add your
  round-trip time per remote command on a real network. Then a workspace of 200 files (10 KB each) is
  submitted new, unchanged and with one file edited: the objects and bytes of content sent each time
  (``content_bytes_sent``, the gzip-1 tar stream) and every byte written to remote commands' stdin
  (``all_stdin_bytes``: also the object names asked about and the job's own files).

Without a cluster and without root to start one, prints a single ``skipped`` line and exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def emit(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


def cluster_ready(start: bool = True) -> str | None:
    """None when a cluster answers (starting it if we are root and ``start``), else why not."""
    if start and os.geteuid() == 0:
        proc = subprocess.run(["bash", str(ROOT / "scripts" / "slurm-up")], capture_output=True, text=True)
        if proc.returncode != 0:
            return f"scripts/slurm-up failed: {proc.stderr.strip()[-300:]}"
    if shutil.which("sinfo") is None:
        return "no Slurm here: run scripts/slurm-up as root"
    proc = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True)
    if proc.returncode != 0 or not proc.stdout.strip():
        return "the Slurm controller does not answer: run scripts/slurm-up as root"
    return None


def latency(runs: int = 3) -> None:
    from tsm.schedulers.slurm import create_scheduler
    from tsm.specs.api import AppDef, AppState, Resource, Role

    sched = create_scheduler("bench")
    res = Resource(cpu=1, memMB=100)
    app = AppDef("bench", [Role("trainer", entrypoint="true", num_replicas=2, resource=res),
                           Role("ps", entrypoint="true", resource=res)])  # fmt: skip
    to_running: list[float] = []
    to_done: list[float] = []
    submit: list[float] = []
    for _ in range(runs):
        info = sched.submit_dryrun(app)
        t0 = time.monotonic()
        app_id = sched.schedule(info)
        submit.append(time.monotonic() - t0)
        first = None
        while True:
            d = sched.describe(app_id, max_age=0.0)
            now = time.monotonic() - t0
            started = d is not None and any(
                r.state in (AppState.RUNNING, AppState.SUCCEEDED) or r.exit_code is not None
                for rs in d.roles_statuses
                for r in rs.replicas
            )
            if first is None and started:
                first = now
            if d is not None and d.state.is_terminal:
                assert d.state == AppState.SUCCEEDED, d
                to_done.append(now)
                to_running.append(first if first is not None else now)
                break
            time.sleep(0.05)
    emit(
        bench="slurm_latency",
        app="trainer x2 + ps x1, each 'true'",
        runs=runs,
        sbatch_s=round(statistics.median(submit), 3),
        submit_to_first_replica_running_s=round(statistics.median(to_running), 3),
        submit_to_succeeded_s=round(statistics.median(to_done), 3),
        all_to_succeeded_s=[round(x, 3) for x in to_done],
    )


def wait_load(apps: int = 20, seconds: float = 30.0) -> None:
    from tsm.schedulers import slurm
    from tsm.specs.api import AppDef, Resource, Role

    sched = slurm.create_scheduler("bench")
    app = AppDef("waitload", [Role("w", entrypoint="sleep", args=["120"], resource=Resource(cpu=1, memMB=50))])
    ids = [sched.submit(app) for _ in range(apps)]
    polls = 0
    lock = threading.Lock()
    real_describe = sched.describe

    def counting_describe(app_id: str, max_age: float = 1.0) -> object:
        nonlocal polls
        with lock:
            polls += 1
        return real_describe(app_id, max_age=max_age)

    sched.describe = counting_describe  # type: ignore[method-assign,assignment]
    before = slurm.command_counts()
    threads = [threading.Thread(target=sched.wait, args=(i, seconds)) for i in ids]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - t0
    after = slurm.command_counts()
    used = {k: after.get(k, 0) - before.get(k, 0) for k in after if after.get(k, 0) - before.get(k, 0)}
    for app_id in ids:
        sched.cancel(app_id)
    emit(
        bench="slurm_wait_load",
        apps=apps,
        wait_s=round(elapsed, 1),
        describe_polls=polls,
        slurm_commands=used,
        slurm_commands_total=sum(used.values()),
        commands_per_second=round(sum(used.values()) / elapsed, 2),
    )


def status_many(n: int = 1000, runs: int = 5) -> None:
    """N held apps (they never run, so the shared cluster stays free), then, interleaved ``runs`` times: the
    floors by hand (``squeue --json``; the same ``squeue`` columns tsm asks for; that ``squeue`` and the
    ``sacct`` of 7 days ``list()`` asks for) beside ``describe`` of every app with one fresh snapshot,
    ``list()`` and a views ``view_snapshot``; medians, and the Slurm commands each made."""
    from tsm.schedulers import slurm
    from tsm.schedulers.slurm.cli import command_counts
    from tsm.schedulers.slurm.parse import SQUEUE_ARGS, sacct_args
    from tsm.specs.api import AppDef, Resource, Role

    sched = slurm.create_scheduler("bench")
    app = AppDef("many", [Role("w", entrypoint="sleep", args=["600"], resource=Resource(cpu=1, memMB=50))])
    ids: list[str] = []
    try:
        t0 = time.monotonic()
        for _ in range(n):  # a dry run each: every app has its own job directory
            ids.append(sched.schedule(sched.submit_dryrun(app, {"sbatch_args": ["--hold"]})))
        submit_s = time.monotonic() - t0

        def by_hand(*commands: list[str]) -> float:
            t = time.perf_counter()
            for args in commands:
                subprocess.run(args, capture_output=True, check=True)
            return time.perf_counter() - t

        def counted(fn: Any) -> tuple[float, dict[str, int]]:
            """``fn()``'s answer (its own timing) and the Slurm commands it ran."""
            before = command_counts()
            took = fn()
            after = command_counts()
            return took, {k: after[k] - before.get(k, 0) for k in after if after[k] - before.get(k, 0)}

        cpu: dict[str, list[float]] = {"tsm": [], "squeue": [], "list": []}

        def describe_all() -> float:
            time.sleep(1.05)  # the shared snapshot is older than describe's max_age: the first call refreshes
            own, kids = time.process_time(), os.times().children_user + os.times().children_system
            t = time.perf_counter()
            found = [sched.describe(i) for i in ids]
            took = time.perf_counter() - t
            cpu["tsm"].append(time.process_time() - own)  # this process's CPU: what the load cannot inflate
            cpu["squeue"].append(os.times().children_user + os.times().children_system - kids)
            assert all(d is not None for d in found), "an app Slurm holds was not described"
            return took

        def list_all() -> float:
            time.sleep(1.05)
            own = time.process_time()
            t = time.perf_counter()
            listed = sched.list()
            took = time.perf_counter() - t
            cpu["list"].append(time.process_time() - own)
            assert set(ids) <= {r.app_id for r in listed}, "list() left out an app"
            return took

        def view_all() -> float:
            time.sleep(1.05)
            t = time.perf_counter()
            sched.view_snapshot(ids)
            return time.perf_counter() - t

        rows: dict[str, list[tuple[float, dict[str, int]]]] = {}
        for _ in range(runs):  # interleaved: each round measures every row once
            for name, fn in (
                ("raw_squeue_json", lambda: by_hand(["squeue", "--json", "--me"])),
                ("raw_squeue_fields", lambda: by_hand(SQUEUE_ARGS)),
                ("describe_all", describe_all),
                ("raw_squeue_sacct", lambda: by_hand(SQUEUE_ARGS, sacct_args("-S", "now-7days"))),
                ("list", list_all),
                ("view_snapshot", view_all),
            ):
                rows.setdefault(name, []).append(counted(fn))
        med = {k: statistics.median(t for t, _ in v) for k, v in rows.items()}
        ms = {f"{k}_ms": round(v * 1000, 1) for k, v in med.items()}
        emit(
            bench="slurm_status_many", apps=n, runs=runs, submit_s=round(submit_s, 1), **ms,
            describe_all_commands=rows["describe_all"][-1][1], list_commands=rows["list"][-1][1],
            describe_all_tsm_cpu_ms=round(statistics.median(cpu["tsm"]) * 1000, 1),
            describe_all_squeue_cpu_ms=round(statistics.median(cpu["squeue"]) * 1000, 1),
            list_tsm_cpu_ms=round(statistics.median(cpu["list"]) * 1000, 1),
            load_average=round(os.getloadavg()[0], 1),
            view_snapshot_commands=rows["view_snapshot"][-1][1],
            describe_all_vs_squeue_json=round(med["describe_all"] / med["raw_squeue_json"], 2),
            describe_all_vs_squeue_fields=round(med["describe_all"] / med["raw_squeue_fields"], 2),
            list_vs_squeue_sacct=round(med["list"] / med["raw_squeue_sacct"], 2),
            view_snapshot_vs_squeue_fields=round(med["view_snapshot"] / med["raw_squeue_fields"], 2),
            target="describe of all <= 1.2 x one raw squeue; list() <= 1.2 x one squeue + one sacct by hand",
            met=med["describe_all"] <= 1.2 * med["raw_squeue_json"] and med["list"] <= 1.2 * med["raw_squeue_sacct"],
        )
    finally:
        for k in range(0, len(ids), 200):
            subprocess.run(["scancel", *ids[k:k + 200]], capture_output=True)


def ssh_latency(runs: int, start: bool = True) -> None:
    """Submit and status over SSH against the same calls made locally (see the module doc)."""
    from tsm.schedulers.common.ssh import SshConnection, SshTarget, parse_ssh_options
    from tsm.schedulers.slurm import create_scheduler
    from tsm.specs.api import AppDef, Role

    sshd_dir = Path(os.environ.get("SSHD_DIR", "/var/lib/tsm-sshd"))
    if start and os.geteuid() == 0:
        proc = subprocess.run(["bash", str(ROOT / "scripts" / "sshd-up")], capture_output=True, text=True)
        if proc.returncode != 0:
            emit(bench="slurm_ssh", skipped=f"scripts/sshd-up failed: {proc.stderr.strip()[-300:]}")
            return
    if not (sshd_dir / "client" / "ssh_options").is_file():
        emit(bench="slurm_ssh", skipped="no test sshd: run scripts/sshd-up as root")
        return
    target = "tsmssh@127.0.0.1:2222"
    options = (sshd_dir / "client" / "ssh_options").read_text().strip().split(",")
    app = AppDef(name="bssh", roles=[Role(name="r", entrypoint="sleep", args=["2"])])
    local, remote = create_scheduler("bench"), create_scheduler("bench")
    cfg_remote: dict[str, Any] = {"ssh": target, "ssh_options": options}

    conn = SshConnection(SshTarget.parse(target), parse_ssh_options(options))
    conn.close()  # no master: the next command pays for the connection
    t = time.perf_counter()
    conn.run(["true"])
    cold = time.perf_counter() - t
    warm = statistics.median(_timed(lambda: conn.run(["true"])) for _ in range(10))

    def submit(sched: Any, cfg: dict[str, Any]) -> tuple[float, str]:
        t = time.perf_counter()
        app_id = sched.schedule(sched.submit_dryrun(app, cfg))
        return time.perf_counter() - t, app_id

    ids: list[tuple[Any, str]] = []
    sub_local, sub_ssh, st_local, st_ssh = [], [], [], []
    for _ in range(runs):
        dt, i = submit(local, {})
        sub_local.append(dt)
        ids.append((local, i))
        dt, j = submit(remote, cfg_remote)
        sub_ssh.append(dt)
        ids.append((remote, j))
        st_local.append(_timed(lambda i=i: local.describe(i, max_age=0.0)))
        st_ssh.append(_timed(lambda j=j: remote.describe(j, max_age=0.0)))
    # the workspace: 200 files of 10 KB, shipped new, unchanged, then with one file edited
    from tsm.schedulers.slurm import ssh_host as ssh_mod

    ws = Path(tempfile.mkdtemp(prefix="tsm-ws-bench-"))
    for k in range(200):
        (ws / f"f{k:03d}.py").write_bytes(os.urandom(5000).hex().encode())
    rem = ssh_mod.ssh_host(target, options)
    shipped = {}
    for case in ("new", "unchanged", "one_file_changed"):
        if case == "one_file_changed":
            (ws / "f007.py").write_bytes(os.urandom(5000).hex().encode())
        before = rem.conn.bytes_sent
        fresh = AppDef(name="bssh", roles=[Role(name="r", entrypoint="sleep", args=["2"])])
        ids.append((remote, remote.submit(fresh, cfg_remote, workspace=str(ws))))
        r = rem.last_ship[0]
        shipped[case] = {"files_sent": r.files_sent, "content_bytes_sent": r.bytes_sent,
                         "all_stdin_bytes": rem.conn.bytes_sent - before}
    shutil.rmtree(ws, ignore_errors=True)
    for sched, app_id in ids:
        sched.cancel(app_id)
    ms = lambda xs: round(statistics.median(xs) * 1000, 1)  # noqa: E731
    emit(
        bench="slurm_ssh", runs=runs, transport="OpenSSH ControlMaster over loopback (scripts/sshd-up)",
        first_command_no_master_ms=round(cold * 1000, 1), command_on_master_ms=ms([warm]),
        submit_local_ms=ms(sub_local), submit_ssh_ms=ms(sub_ssh),
        describe_local_ms=ms(st_local), describe_ssh_ms=ms(st_ssh),
        workspace_files=200, workspace_bytes=200 * 10_000, workspace=shipped,
    )


def _timed(fn: Any) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", "--smoke", action="store_true", help="tiny sizes; never starts the engine (smoke)")
    ap.add_argument("--only", choices=["latency", "wait_load", "status_many", "ssh"], action="append",
                    help="run only these lines (repeatable)")
    args = ap.parse_args()
    tiny, only = args.tiny, set(args.only or ["latency", "wait_load", "status_many", "ssh"])
    why = cluster_ready(start=not tiny)
    if why is not None:
        emit(bench="slurm", skipped=why)
        return 0
    os.environ["TSM_HOME"] = tempfile.mkdtemp(prefix="tsm-slurm-bench-")
    try:
        if "latency" in only:
            latency(1 if tiny else 3)
        if "wait_load" in only:
            wait_load(*((2, 5.0) if tiny else (20, 30.0)))
        if "status_many" in only:
            status_many(*((5, 1) if tiny else (1000, 5)))
        if "ssh" in only:
            ssh_latency(1 if tiny else 5, start=not tiny)
    finally:
        shutil.rmtree(os.environ["TSM_HOME"], ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
