"""The Slurm scheduler against a real Slurm 22.05 cluster (``scripts/slurm-up``: 4 nodes on this host).

Every test submits real jobs through :class:`tsm.schedulers.slurm.SlurmScheduler` and checks what the
replicas saw (their environment and arguments, written to their logs), what ``describe``/``list``/
``log_iter`` report, from this process and from others, and that cancel leaves nothing in the queue.
The whole file takes about a minute and a half on a 2-core machine.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import hostile
from tsm.schedulers.api import Stream
from tsm.schedulers.slurm import SlurmScheduler, create_scheduler
from tsm.specs.api import AppDef, AppState, Resource, Role

from .conftest import SlurmCluster, in_ci

pytestmark = [pytest.mark.integration, pytest.mark.slurm]

SMALL = Resource(cpu=1, memMB=200)


#: A replica that reports what it was given: argv and its TSM_/E_ environment, as one JSON line on stdout.
REPORT = textwrap.dedent(
    """\
    import json, os, socket, sys
    env = {k: v for k, v in os.environ.items() if k.startswith(("TSM_", "E_"))}
    rank0 = os.environ["TSM_RANK0_HOST"]
    print(json.dumps({"argv": sys.argv[1:], "env": env, "cwd": os.getcwd(),
                      "rank0_addr": socket.gethostbyname(rank0)}), flush=True)
    print("to stderr", os.environ["TSM_REPLICA_ID"], file=sys.stderr)
    """
)


@pytest.fixture(autouse=True)
def cluster(slurm_cluster: SlurmCluster, monkeypatch: pytest.MonkeyPatch) -> SlurmCluster:
    """The cluster, with this venv's python first on PATH: jobs carry the submitter's PATH."""
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    return slurm_cluster


@pytest.fixture
def sched() -> SlurmScheduler:
    return create_scheduler("it")


def replicas(desc: Any) -> dict[tuple[str, int], Any]:
    return {(r.role, r.id): r for rs in desc.roles_statuses for r in rs.replicas}


def wait_until(pred: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.2)


def squeue_ids(app_id: str) -> str:
    return subprocess.run(["squeue", "-h", "-j", app_id], capture_output=True, text=True).stdout.strip()


def test_two_role_app_succeeds_with_env_and_logs_seen_from_anywhere(
    sched: SlurmScheduler, tmp_path: Path, tsm_home: Path
) -> None:
    env = {"E_ROLE": "r${replica_id}-a${app_id}", "E_PLAIN": "plain value"}
    app = AppDef(
        "hello",
        roles=[
            Role("trainer", entrypoint="python", args=["-c", REPORT, "--lr", "0.1", "${replica_id}"], env=env,
                 num_replicas=2, resource=SMALL),
            Role("ps", entrypoint="python", args=["-c", REPORT, "ps"], num_replicas=1, resource=SMALL),
        ],
    )  # fmt: skip
    app_id = sched.submit(app)
    desc = sched.wait(app_id, timeout=120)
    assert desc is not None and desc.state == AppState.SUCCEEDED, desc
    reps = replicas(desc)
    assert set(reps) == {("trainer", 0), ("trainer", 1), ("ps", 0)}
    assert all(r.state == AppState.SUCCEEDED and r.exit_code == 0 for r in reps.values())
    hosts = [reps[k].hostname for k in (("trainer", 0), ("trainer", 1), ("ps", 0))]
    assert len(set(hosts)) == 3, hosts  # one node per replica by default
    assert desc.app is not None and [r.name for r in desc.app.roles] == ["trainer", "ps"]

    seen = {}
    for role, n in (("trainer", 2), ("ps", 1)):
        for k in range(n):
            out = list(sched.log_iter(app_id, role, k, streams=Stream.STDOUT))
            assert len(out) == 1, out
            seen[role, k] = json.loads(out[0])
            assert list(sched.log_iter(app_id, role, k, streams=Stream.STDERR)) == [f"to stderr {k}\n"]
    for k in range(2):
        got = seen["trainer", k]
        assert got["argv"] == ["--lr", "0.1", str(k)]
        assert got["env"]["TSM_REPLICA_ID"] == str(k)
        assert got["env"]["TSM_ROLE_NAME"] == "trainer"
        assert got["env"]["TSM_NUM_REPLICAS"] == "2"
        assert got["env"]["TSM_APP_ID"] == app_id
        assert got["env"]["E_ROLE"] == f"r{k}-a{app_id}"
        assert got["env"]["E_PLAIN"] == "plain value"
        assert got["cwd"] == os.getcwd()  # replicas run where tsm was called
    assert {s["env"]["TSM_RANK0_HOST"] for s in seen.values()} == {hosts[0]}  # first node of the first role
    assert all(s["rank0_addr"] for s in seen.values())  # and it resolves
    assert seen["ps", 0]["env"]["TSM_NUM_REPLICAS"] == "1" and seen["ps", 0]["argv"] == ["ps"]

    job_dir = Path(sched.job_dir(app_id) or "")
    assert (job_dir.stat().st_mode & 0o777) == 0o700
    for f in list(job_dir.glob("*")) + list(job_dir.glob("*/*")):
        assert (f.stat().st_mode & 0o077) == 0, f"{f} is readable by others"

    # Another process in another directory: with this TSM_HOME (its index) and with a fresh one (WorkDir).
    code = textwrap.dedent(
        f"""
        import json
        from tsm.schedulers.slurm import create_scheduler
        s = create_scheduler("other")
        d = s.describe({app_id!r})
        print(json.dumps({{"state": d.state.name,
                          "replicas": sorted((r.role, r.id, r.state.name, r.hostname) for rs in d.roles_statuses for r in rs.replicas),
                          "log": "".join(s.log_iter({app_id!r}, "trainer", 1))}}))
        """
    )
    other = tmp_path / "elsewhere"
    other.mkdir()
    for home in (str(tsm_home), str(tmp_path / "fresh_home")):
        proc = subprocess.run(
            [sys.executable, "-c", code], cwd=other, env={**os.environ, "TSM_HOME": home},
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        got = json.loads(proc.stdout)
        assert got["state"] == "SUCCEEDED"
        assert [tuple(r) for r in got["replicas"]] == sorted(
            (r.role, r.id, r.state.name, r.hostname) for r in reps.values()
        )
        assert json.loads(got["log"].splitlines()[0]) == seen["trainer", 1]
        assert got["log"].endswith("to stderr 1\n")

    listed = {row.app_id: row for row in sched.list()}
    assert listed[app_id].name == "hello" and listed[app_id].state == AppState.SUCCEEDED
    assert listed[app_id].app_handle == f"slurm://it/{app_id}"


def test_failing_replica_fails_the_app_with_its_exit_code_after_retries(sched: SlurmScheduler) -> None:
    script = 'echo "attempt ${SLURM_RESTART_COUNT:-0} replica $TSM_REPLICA_ID"; [ "$TSM_REPLICA_ID" = 1 ] && exit 3; sleep 60'
    app = AppDef(
        "flaky",
        roles=[
            Role("trainer", entrypoint="bash", args=["-c", script], num_replicas=2, max_retries=1, resource=SMALL),
            Role("ps", entrypoint="sleep", args=["60"], resource=SMALL),
        ],
    )
    start = time.monotonic()
    app_id = sched.submit(app, {"kill_grace": 5})
    desc = sched.wait(app_id, timeout=150)
    assert desc is not None and desc.state == AppState.FAILED, desc
    assert desc.num_restarts == 1
    reps = replicas(desc)
    assert reps["trainer", 1].state == AppState.FAILED and reps["trainer", 1].exit_code == 3
    assert "role 'trainer' replica 1 exited with code 3" in desc.msg
    assert reps["trainer", 0].state == AppState.CANCELLED and reps["ps", 0].state == AppState.CANCELLED
    assert list(sched.log_iter(app_id, "trainer", 1, streams=Stream.STDOUT)) == [
        "attempt 0 replica 1\n",
        "attempt 1 replica 1\n",
    ]
    assert time.monotonic() - start < 120  # the other roles were stopped, not waited for


def test_cancel_leaves_nothing_in_the_queue(sched: SlurmScheduler) -> None:
    app = AppDef("sleeper", [Role("w", entrypoint="sleep", args=["300"], num_replicas=2, resource=SMALL),
                             Role("v", entrypoint="sleep", args=["300"], resource=SMALL)])  # fmt: skip
    app_id = sched.submit(app)
    wait_until(lambda: (d := sched.describe(app_id)) is not None and d.state == AppState.RUNNING, 60, "RUNNING")
    assert app_id in {row.app_id for row in sched.list() if row.state == AppState.RUNNING}
    sched.cancel(app_id)
    desc = sched.wait(app_id, timeout=60)
    assert desc is not None and desc.state == AppState.CANCELLED
    states = {k: (r.state.name, r.error_msg) for k, r in replicas(desc).items()}
    assert all(state == "CANCELLED" for state, _ in states.values()), states
    wait_until(lambda: squeue_ids(app_id) == "", 30, "the job to leave squeue")
    sched.cancel(app_id)  # idempotent
    assert sched.describe(app_id).state == AppState.CANCELLED  # type: ignore[union-attr]


def test_log_follow_tracks_a_running_job_and_stops_when_it_ends(sched: SlurmScheduler) -> None:
    app = AppDef("ticker", [Role("w", entrypoint="bash", resource=SMALL,
                                 args=["-c", 'for i in 1 2 3 4 5 6; do echo "tick $i"; sleep 0.7; done; printf last'])])  # fmt: skip
    app_id = sched.submit(app)
    got: list[tuple[float, str]] = []
    start = time.monotonic()
    for line in sched.log_iter(app_id, "w", 0, should_tail=True, streams=Stream.STDOUT):
        got.append((time.monotonic() - start, line))
    ended = time.monotonic() - start
    assert [line for _, line in got] == [f"tick {i}\n" for i in range(1, 7)] + ["last"]
    assert got[-1][0] - got[0][0] > 2.0  # lines arrived while the job ran, not all at the end
    desc = sched.describe(app_id)
    assert desc is not None and desc.state in (AppState.SUCCEEDED, AppState.RUNNING)
    assert ended < 30


@pytest.mark.reliability(
    "hostile arguments and env values reach Slurm replicas (real cluster)",
    expect="byte-exact on every replica, sbatch reads quoted directives as given; no shell runs them",
    group="Hostile input",
)
def test_hostile_arguments_and_env_round_trip_byte_exact(sched: SlurmScheduler, tmp_path: Path, figure: Any) -> None:
    marker = tmp_path / "pwned"
    args, env = hostile.args(str(marker)), hostile.env(str(marker))
    comment = "it's a \"test\" #1 $(whoami) `id` é %j"
    job_dir = tmp_path / "job dir with spaces 'and quotes' $(x)"
    app = AppDef("hostile", [Role("r", entrypoint="python", args=["-c", hostile.DUMP, *args], env=env,
                                  num_replicas=2, resource=SMALL)])  # fmt: skip
    app_id = sched.submit(app, {"comment": comment, "job_dir": str(job_dir), "pack_replicas": True})
    squeue = json.loads(subprocess.run(["squeue", "--json"], capture_output=True, text=True, check=True).stdout)
    rec = next(j for j in squeue["jobs"] if str(j["job_id"]) == app_id)
    assert rec["comment"] == comment  # sbatch read the quoted #SBATCH value as the shell would
    desc = sched.wait(app_id, timeout=120)
    assert desc is not None and desc.state == AppState.SUCCEEDED, desc
    for k in range(2):
        out = "".join(sched.log_iter(app_id, "r", k, streams=Stream.STDOUT))
        got_args, got_env = hostile.read_dump(out)
        assert not hostile.mismatches(got_args, got_env, args, env)
        assert b"PATH" in got_env  # env(1) took "--unset=PATH" as a variable, not as an option
    assert (job_dir / "r" / "0.stdout").exists()
    assert not marker.exists()
    assert sorted(os.listdir(tmp_path)) == [job_dir.name]  # no payload made a file
    figure("values delivered byte-exact", len(args) + len(env), "")
    figure("replicas", 2, "")


ALLREDUCE = textwrap.dedent(
    """\
    import os, torch, torch.distributed as dist
    dist.init_process_group("gloo")
    r, w = dist.get_rank(), dist.get_world_size()
    t = torch.tensor([float(r + 1)])
    dist.all_reduce(t)
    print(f"rank={r} world={w} group_rank={os.environ.get('GROUP_RANK')} allreduce={t.item()} ok={t.item() == w * (w + 1) / 2}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    """
)


@pytest.mark.torch
def test_dist_ddp_runs_torchrun_across_two_slurm_nodes(sched: SlurmScheduler, tmp_path: Path) -> None:
    probe = subprocess.run([sys.executable, "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True)
    if probe.returncode != 0:
        msg = "torch is not installed in this venv: pip install torch==2.13.0 (a CPU wheel; make test does it)"
        if in_ci():
            pytest.fail(msg)
        pytest.skip(msg)
    from tsm.components.dist import ddp

    script = tmp_path / "allreduce.py"
    script.write_text(ALLREDUCE)
    with socket.socket() as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    app = ddp(script=str(script), j="2x1", cpu=1, memMB=1000, rdzv_port=port, env={"OMP_NUM_THREADS": "1"})
    app_id = sched.submit(app)
    desc = sched.wait(app_id, timeout=240)
    role = app.roles[0].name
    logs = {k: "".join(sched.log_iter(app_id, role, k)) for k in range(2)}
    assert desc is not None and desc.state == AppState.SUCCEEDED, (desc, logs)
    reps = replicas(desc)
    assert reps[role, 0].hostname != reps[role, 1].hostname  # two Slurm nodes
    # dist.ddp prefixes each worker's line with [<role><local rank>]: (whole lines per rank)
    lines = [line.split("]:", 1)[-1] for text in logs.values() for line in text.splitlines() if "allreduce=" in line]
    assert sorted(lines) == sorted(f"rank={r} world=2 group_rank={r} allreduce=3.0 ok=True" for r in range(2)), logs


def test_many_waiters_share_slurm_calls(sched: SlurmScheduler) -> None:
    from tsm.schedulers import slurm

    app = AppDef("quick", [Role("w", entrypoint="sleep", args=["3"], resource=SMALL)])
    ids = [sched.submit(app) for _ in range(4)]
    before = slurm.command_counts().get("squeue", 0)
    results: list[Any] = []
    threads = [threading.Thread(target=lambda i=i: results.append(sched.wait(i, timeout=120))) for i in ids * 10]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(r is not None and r.state == AppState.SUCCEEDED for r in results)
    used = slurm.command_counts().get("squeue", 0) - before
    assert used < 40, f"{used} squeue calls for 40 waiters"
