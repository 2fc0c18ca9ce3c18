"""Long runs on the real Slurm cluster (issue 25): warnings, preemption, cancels and lost nodes.

- ``time_limit=1m`` with ``warn_before=45s``: Slurm sends USR1 to the batch shell (``--signal=B:USR1@45``)
  between 15 and 45 s in (its controller checks limits every 30 s), the batch shell forwards it to every task
  of the job, each task's ``tsm.lifecycle.on_warning`` handler writes a line, and at the limit Slurm ends the
  job (TIMEOUT); takes one to two minutes.
- Preemption: ``scripts/slurm-up`` configures ``preempt/partition_prio`` with ``PreemptMode=REQUEUE``, a
  ``low`` partition (``GraceTime=5``) and a ``high`` one over the same nodes, and
  ``SlurmctldParameters=preempt_send_user_signal``. An app in ``low`` holding a whole node is preempted by a
  ``high`` job on that node: Slurm sends the app's ``--signal`` to its batch shell, which forwards it to every
  task, then after the grace time ends and requeues the job; the next attempt sees
  ``TSM_LAST_EXIT=preempted`` and ``max_retries=0`` is never touched. The worked example of
  docs/long-runs.md (checkpoint on the warning, resume from ``TSM_RESTART_COUNT``) runs the same way.
- ``tsm cancel`` of an app with a ``warn_signal`` warns every task before it ``scancel``s the job.
- A node set DOWN under a replica: NODE_FAIL, a restart as a preemption, and a retry given that node again
  (the only one it may use) that moves the job off it (``ExcNodeList``) and finishes elsewhere.
- Stalls: restarted as the replica's failure, or failing the app even when the task exits 0 on the warning.
- A time limit after a preemption still requeues with ``requeue_on_time_limit`` (Slurm clears
  ``PreemptTime`` when it requeues a job).

Each asserts from what the tasks wrote and the recorded states, never from timing.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from testutil import MemoryCgroup, memory_cgroup_unavailable, wait_until
from tsm.schedulers.api import Stream
from tsm.schedulers.slurm import SlurmScheduler, create_scheduler
from tsm.schedulers.slurm.jobdir import JobDir
from tsm.specs.api import AppDef, AppState, Resource, Role

from .conftest import SlurmCluster

pytestmark = [pytest.mark.integration, pytest.mark.slurm]

WARNED = textwrap.dedent(
    """\
    import os, sys, time
    import tsm.lifecycle as lc
    lc.on_warning(lambda: print("warned", os.environ["TSM_REPLICA_ID"], flush=True))
    print("ready", lc.attempt(), lc.restart_count(), repr(lc.last_exit()), os.environ.get("TSM_WARN_SIGNAL"),
          flush=True)
    while True:
        time.sleep(0.5)
    """
)


@pytest.fixture(autouse=True)
def cluster(slurm_cluster: SlurmCluster, monkeypatch: pytest.MonkeyPatch) -> SlurmCluster:
    """The cluster, with this venv's python first on PATH: jobs carry the submitter's PATH."""
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    return slurm_cluster


def test_time_limit_warns_every_task_before_the_end() -> None:
    sched: SlurmScheduler = create_scheduler("it")
    app = AppDef("tlimit", [Role("w", entrypoint=sys.executable, args=["-c", WARNED], num_replicas=2,
                                 resource=Resource(cpu=1, memMB=200))])  # fmt: skip
    app_id = sched.submit(app, {"time_limit": "1m", "warn_signal": "USR1", "warn_before": "45s",
                                "max_preemptions": 0})  # fmt: skip
    try:
        desc = sched.wait(app_id, timeout=240)
    finally:
        sched.cancel(app_id)
    assert desc is not None and desc.state == AppState.FAILED, desc
    assert desc.msg.startswith("TIMEOUT"), desc.msg
    for k in (0, 1):
        lines = list(sched.log_iter(app_id, "w", k, streams=Stream.STDOUT))
        assert lines[0] == "ready 0 0 None USR1\n", lines
        assert lines.count(f"warned {k}\n") == 1, lines  # the warning came once, before Slurm ended the job


# -- preemption ------------------------------------------------------------------------------------------

#: The CPUs each node of scripts/slurm-up advertises (NODE_CPUS): an app asking for all of them holds its
#: node alone, so a job of the high partition on that node must preempt it.
NODE_CPUS = 2

PREEMPTED = textwrap.dedent(
    """\
    import sys, time
    import tsm.lifecycle as lc
    lc.on_warning(lambda: print("warned", lc.attempt(), flush=True))
    print("attempt", lc.attempt(), "restarts", lc.restart_count(), "last", lc.last_exit(), flush=True)
    if lc.restart_count():
        sys.exit(0)
    while True:
        time.sleep(0.2)
    """
)


def stdout_lines(sched: SlurmScheduler, app_id: str, role: str) -> list[str]:
    return list(sched.log_iter(app_id, role, 0, streams=Stream.STDOUT))


def node_of(sched: SlurmScheduler, app_id: str, role: str) -> str:
    """The node replica 0 runs on (its status file names it once it started)."""
    desc = sched.describe(app_id, max_age=0.0)
    assert desc is not None
    host = next(r for r in desc.roles_statuses if r.role == role).replicas[0].hostname
    assert host, desc
    return host


@pytest.fixture
def high_jobs() -> Iterator[list[str]]:
    """Job ids of the high-priority jobs a test submits; cancelled after it."""
    ids: list[str] = []
    yield ids
    if ids:
        subprocess.run(["scancel", *ids], capture_output=True, check=False)


def preempt(node: str, high_jobs: list[str]) -> None:
    """Submit a one-second job of the high partition on ``node``: Slurm preempts the low job holding it."""
    proc = subprocess.run(["sbatch", "--parsable", "--partition=high", f"--nodelist={node}", "--ntasks=1",
                           "--cpus-per-task=1", "--output=/dev/null", "--wrap=sleep 1"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    high_jobs.append(proc.stdout.strip().split(";")[0])


def test_preempted_app_is_warned_then_restarts_as_a_preemption(high_jobs: list[str]) -> None:
    sched: SlurmScheduler = create_scheduler("it")
    app = AppDef("preempt", [Role("w", entrypoint=sys.executable, args=["-c", PREEMPTED], max_retries=0,
                                  resource=Resource(cpu=NODE_CPUS, memMB=200))])  # fmt: skip
    app_id = sched.submit(app, {"partition": "low", "warn_signal": "USR1", "warn_before": "60s",
                                "max_preemptions": 1})  # fmt: skip
    try:
        wait_until(lambda: "attempt 0 restarts 0 last None\n" in stdout_lines(sched, app_id, "w"),
                   "the first attempt to start", timeout=120)  # fmt: skip
        preempt(node_of(sched, app_id, "w"), high_jobs)
        desc = sched.wait(app_id, timeout=300)
    finally:
        sched.cancel(app_id)
    assert desc is not None and desc.state == AppState.SUCCEEDED, desc
    assert desc.num_restarts == 1, desc
    # warned before it was stopped, then restarted knowing why; its own max_retries=0 was never spent
    assert stdout_lines(sched, app_id, "w") == [
        "attempt 0 restarts 0 last None\n", "warned 0\n", "attempt 1 restarts 1 last preempted\n"
    ]
    job_dir = sched.job_dir(app_id)
    assert job_dir is not None
    assert not (job_dir / "failures").exists() and not (job_dir / "requeue_cause").exists()
    assert "tsm: the job is preempted: SIGUSR1 to every task" in (job_dir / "batch.out").read_text()


#: The worked example of docs/long-runs.md: 20 steps; on the warning, a checkpoint at the next step boundary,
#: then wait to be stopped; a restart resumes from the checkpoint.
TRAIN = textwrap.dedent(
    """\
    import json, os, sys, time
    import tsm.lifecycle

    ckpt, steps = sys.argv[1], 20
    tsm.lifecycle.on_warning(lambda: print("warned: checkpointing at the next step", flush=True))
    start = 0
    if tsm.lifecycle.restart_count() and os.path.exists(ckpt):  # a restart: resume
        with open(ckpt) as f:
            start = json.load(f)["next_step"]
        print(f"resumed at step {start} after {tsm.lifecycle.last_exit()}", flush=True)
    for step in range(start, steps):
        if tsm.lifecycle.warned():  # checkpoint at a step boundary, then wait to be stopped
            with open(ckpt + ".tmp", "w") as f:
                json.dump({"next_step": step}, f)
            os.replace(ckpt + ".tmp", ckpt)
            print(f"checkpointed: next step {step}", flush=True)
            time.sleep(3600)
        print(f"step {step}", flush=True)
        time.sleep(0.5)  # the work of one step
    """
)


def test_worked_example_checkpoints_on_preemption_and_does_every_step_once(
    tmp_path: Path, high_jobs: list[str]
) -> None:
    (tmp_path / "train_resume.py").write_text(TRAIN)
    sched: SlurmScheduler = create_scheduler("it")
    app = AppDef("resume", [Role("trainer", entrypoint=sys.executable,
                                 args=[str(tmp_path / "train_resume.py"), str(tmp_path / "ckpt.json")],
                                 resource=Resource(cpu=NODE_CPUS, memMB=200))])  # fmt: skip
    app_id = sched.submit(app, {"partition": "low", "warn_signal": "USR1", "warn_before": "60s",
                                "max_preemptions": 2})  # fmt: skip
    try:
        wait_until(lambda: "step 2\n" in stdout_lines(sched, app_id, "trainer"), "step 2", timeout=120)
        preempt(node_of(sched, app_id, "trainer"), high_jobs)
        desc = sched.wait(app_id, timeout=300)
    finally:
        sched.cancel(app_id)
    lines = stdout_lines(sched, app_id, "trainer")
    assert desc is not None and desc.state == AppState.SUCCEEDED, (desc, lines)
    assert [ln for ln in lines if ln.startswith("step ")] == [f"step {i}\n" for i in range(20)]  # each once
    assert desc.num_restarts == 1
    checkpointed = [ln for ln in lines if ln.startswith("checkpointed: next step ")]
    assert len(checkpointed) == 1, lines
    step = checkpointed[0].split()[-1]
    assert f"resumed at step {step} after preempted\n" in lines, lines


# -- a warning before a cancel -------------------------------------------------------------------------

CANCELLED = textwrap.dedent(
    """\
    import os, sys, time
    import tsm.lifecycle as lc
    lc.on_warning(lambda: None)
    print("ready", flush=True)
    while not lc.warned():
        time.sleep(0.1)
    print("warned: saving", os.environ["TSM_REPLICA_ID"], flush=True)
    sys.exit(0)
    """
)


@pytest.mark.parametrize("wrapped", [False, True], ids=["plain", "under-sh"])
def test_cancel_warns_every_task_before_scancel(wrapped: bool) -> None:
    """Under ``sh -c "python ...; echo"`` (a launcher without a handler, as torchrun is) the warning reaches
    python and spares sh, which goes on after python exits."""
    sched: SlurmScheduler = create_scheduler("it")
    if wrapped:
        cmd = ["sh", "-c", f'{shlex.quote(sys.executable)} -c {shlex.quote(CANCELLED)}; echo "launcher $?"']
    else:
        cmd = [sys.executable, "-c", CANCELLED]
    app = AppDef("cwarn", [Role("w", entrypoint=cmd[0], args=cmd[1:], num_replicas=2,
                                resource=Resource(cpu=1, memMB=200))])  # fmt: skip
    app_id = sched.submit(app, {"warn_signal": "USR1", "warn_before": "60s", "max_preemptions": 0})
    try:
        for k in (0, 1):
            wait_until(lambda k=k: "ready\n" in list(sched.log_iter(app_id, "w", k, streams=Stream.STDOUT)),
                       f"replica {k} ready", timeout=120)  # fmt: skip
    finally:
        sched.cancel(app_id)
    desc = sched.describe(app_id, max_age=0.0)
    assert desc is not None and desc.state.is_terminal, desc
    for k in (0, 1):
        lines = list(sched.log_iter(app_id, "w", k, streams=Stream.STDOUT))
        tail = ["launcher 0\n"] if wrapped else []
        assert lines == ["ready\n", f"warned: saving {k}\n", *tail], lines  # warned once, had time to save
    job_dir = sched.job_dir(app_id)
    assert job_dir is not None
    assert "tsm: cancelled: SIGUSR1 to every task" in (job_dir / "batch.out").read_text()


# -- a node lost under a replica -------------------------------------------------------------------------

ON_NODE = textwrap.dedent(
    """\
    import os, sys, time
    import tsm.lifecycle as lc
    print("attempt", lc.attempt(), "last", lc.last_exit(), "on", os.environ["SLURMD_NODENAME"], flush=True)
    if lc.restart_count():
        sys.exit(0)
    while True:
        time.sleep(0.2)
    """
)


def node_in_service(node: str) -> bool:
    states = subprocess.run(["sinfo", "-h", "-N", "-n", node, "-o", "%t"], capture_output=True, text=True).stdout
    return bool(states.strip()) and all(s.strip() in ("idle", "mix", "alloc") for s in states.splitlines())


def slowly(pred: Callable[[], bool]) -> Callable[[], bool]:
    """``pred`` asked at most about three times a second (it runs Slurm commands)."""

    def ask() -> bool:
        time.sleep(0.3)
        return pred()

    return ask


def job_field(job_id: str, name: str) -> str:
    """One field of ``scontrol show job`` (its first component's), "" when absent."""
    out = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True).stdout
    m = re.search(rf"\b{name}=(\S*)", out)
    return m.group(1) if m else ""


def hostnames(expr: str) -> set[str]:
    out = subprocess.run(["scontrol", "show", "hostnames", expr], capture_output=True, text=True).stdout
    return set(out.split())


def nodes_for(n: int) -> tuple[list[str], list[str]]:
    """``n`` nodes of the ``low`` partition for an app (idle ones first) and the others, which it excludes."""
    nodes = sorted(hostnames(subprocess.run(["sinfo", "-h", "-p", "low", "-o", "%N"], capture_output=True,
                                            text=True, check=True).stdout.strip()))  # fmt: skip
    idle = [n for n in nodes if node_in_service(n) and "idle" in subprocess.run(
        ["sinfo", "-h", "-N", "-n", n, "-o", "%t"], capture_output=True, text=True).stdout]  # fmt: skip
    chosen = (idle + [n for n in nodes if n not in idle])[-n:]
    assert len(chosen) == n, nodes
    return chosen, [n for n in nodes if n not in chosen]


def take_whole(node: str, high_jobs: list[str]) -> str:
    """A debug-partition job that holds ``node`` whole, once it runs; its id (cancelled after the test)."""
    blocker = subprocess.run(["sbatch", "--parsable", "--partition=debug", f"--nodelist={node}", "--ntasks=1",
                              f"--cpus-per-task={NODE_CPUS}", "--output=/dev/null", "--wrap=sleep 600"],
                             capture_output=True, text=True, check=True).stdout.strip().split(";")[0]  # fmt: skip
    high_jobs.append(blocker)
    wait_until(slowly(lambda: job_field(blocker, "JobState") == "RUNNING"), f"the job taking {node}", timeout=120)
    return blocker


def fail_and_return(node: str, app_id: str) -> None:
    """Set ``node`` DOWN under the app (NODE_FAIL: Slurm requeues it), then back in service."""
    subprocess.run(["scontrol", "update", f"nodename={node}", "state=down", "reason=tsm-test"], check=True)
    wait_until(slowly(lambda: job_field(app_id, "Restarts") not in ("", "0")), "Slurm to requeue the app",
               timeout=120)  # fmt: skip
    back_in_service(node)


def back_in_service(node: str) -> None:
    """Resume ``node`` (ReturnToService=2 may have done it already: then resume is refused) and wait for it."""
    subprocess.run(["scontrol", "update", f"nodename={node}", "state=resume"], capture_output=True)
    wait_until(slowly(lambda: node_in_service(node)), f"{node} back in service", timeout=60)


def test_a_node_set_down_under_a_replica_is_a_preemption_and_the_retry_moves_off_it(high_jobs: list[str]) -> None:
    """The retry is given the failed node again, so the script must move it off (no condition on chance).

    The app may use two nodes only (``exclude`` names the others). Once it runs on one of them (X), a job of
    the debug partition takes the other (Y) whole; X is set DOWN (NODE_FAIL, Slurm requeues the app), then
    back in service: X is then the only node the retry can be given. Its batch script finds X failed under
    attempt 0, requeues the job held with ``ExcNodeList`` = the ``exclude`` nodes and X, and releases it; the
    app waits for Y, which is freed, and finishes there. Each step is asserted from Slurm's record and the
    replica's own output.
    """
    pair, others = nodes_for(2)
    sched: SlurmScheduler = create_scheduler("it")
    app = AppDef("nodefail", [Role("w", entrypoint=sys.executable, args=["-c", ON_NODE], max_retries=0,
                                   resource=Resource(cpu=NODE_CPUS, memMB=200))])  # fmt: skip
    app_id = sched.submit(app, {"partition": "low", "max_preemptions": 1, "exclude": ",".join(others)})
    node = ""
    try:
        wait_until(slowly(lambda: any(ln.startswith("attempt 0 last None on ")
                                      for ln in stdout_lines(sched, app_id, "w"))),
                   "the first attempt to start", timeout=120)  # fmt: skip
        node = node_of(sched, app_id, "w")
        other = next(n for n in pair if n != node)
        blocker = take_whole(other, high_jobs)
        fail_and_return(node, app_id)
        # the retry can only be given the failed node: it moves off it, and waits for the other one
        job_dir = sched.job_dir(app_id)
        assert job_dir is not None
        wait_until(slowly(lambda: (job_dir / "moves").exists() and job_field(app_id, "JobState") == "PENDING"
                          and job_field(app_id, "ExcNodeList") not in ("", "(null)")),
                   "the retry to move off the failed node", timeout=300)  # fmt: skip
        assert hostnames(job_field(app_id, "ExcNodeList")) == {node, *others}
        subprocess.run(["scancel", blocker], check=True)
        desc = sched.wait(app_id, timeout=300)
    finally:
        sched.cancel(app_id)
        if node:
            back_in_service(node)
    lines = stdout_lines(sched, app_id, "w")
    assert desc is not None and desc.state == AppState.SUCCEEDED, (desc, lines)
    # a preemption (max_retries=0 untouched); the attempt given the failed node ran nothing; the last ran on Y
    assert lines == [f"attempt 0 last None on {node}\n", f"attempt 2 last preempted on {other}\n"], lines
    assert desc.num_restarts == 2, desc
    assert not (job_dir / "failures").exists() and (job_dir / "moves").read_text().strip() == "1"
    excluded = JobDir(job_dir).excluded()
    assert len(excluded) == 1 and excluded[0].startswith(f"{node} NODE_FAIL"), excluded
    assert f"excluded nodes: {node} NODE_FAIL" in desc.msg, desc.msg
    batch = (job_dir / "batch.out").read_text()
    assert f"tsm: this attempt was given node(s) {node}, which failed under an earlier one: requeueing" in batch


def test_a_heterogeneous_app_moves_every_component_off_the_node_that_failed(high_jobs: list[str]) -> None:
    """The same move for an app of two roles (a heterogeneous job, one node each): the exclusion is set on
    every component (``JobId=<id>+<k>``) before the job is released, so neither role is given the failed node.

    The app may use three nodes. Once both roles run (``w`` on X, ``p`` on Y), a debug-partition job takes the
    third (Z) whole; X is set DOWN (NODE_FAIL: Slurm requeues the whole job), then back in service, so the
    retry can only be given X and Y: its batch script moves it off X, and it finishes on Y and Z once Z is
    freed. Asserted from Slurm's record and each role's own output."""
    three, others = nodes_for(3)
    sched: SlurmScheduler = create_scheduler("it")
    roles = [Role(name, entrypoint=sys.executable, args=["-c", ON_NODE], max_retries=0,
                  resource=Resource(cpu=NODE_CPUS, memMB=200)) for name in ("w", "p")]  # fmt: skip
    app_id = sched.submit(AppDef("hetfail", roles), {"partition": "low", "max_preemptions": 1,
                                                     "exclude": ",".join(others)})  # fmt: skip
    node = ""
    try:
        wait_until(slowly(lambda: all(any(ln.startswith("attempt 0 last None on ")
                                          for ln in stdout_lines(sched, app_id, r)) for r in ("w", "p"))),
                   "both roles' first attempt to start", timeout=120)  # fmt: skip
        node, second = node_of(sched, app_id, "w"), node_of(sched, app_id, "p")
        third = next(n for n in three if n not in (node, second))
        blocker = take_whole(third, high_jobs)
        fail_and_return(node, app_id)
        job_dir = sched.job_dir(app_id)
        assert job_dir is not None
        # Slurm requeued w's component only; p's ended (FAILED, JobLaunchFailure) and the job would wait for
        # ever: a look (here describe) requeues p's too
        wait_until(slowly(lambda: sched.describe(app_id, max_age=0.0) is not None and (job_dir / "moves").exists()
                          and job_field(app_id, "JobState") == "PENDING"
                          and job_field(f"{app_id}+1", "ExcNodeList") not in ("", "(null)")),
                   "the retry to move off the failed node", timeout=300)  # fmt: skip
        for component in (f"{app_id}+0", f"{app_id}+1"):
            assert hostnames(job_field(component, "ExcNodeList")) == {node, *others}, component
        subprocess.run(["scancel", blocker], check=True)
        desc = sched.wait(app_id, timeout=300)
    finally:
        sched.cancel(app_id)
        if node:
            back_in_service(node)
    lines = {r: stdout_lines(sched, app_id, r) for r in ("w", "p")}
    assert desc is not None and desc.state == AppState.SUCCEEDED, (desc, lines)
    assert lines["w"][0] == f"attempt 0 last None on {node}\n", lines
    assert lines["p"][0] == f"attempt 0 last None on {second}\n", lines
    last = {r: lines[r][-1].split() for r in lines}
    for r in ("w", "p"):
        assert len(lines[r]) == 2 and last[r][:4] == ["attempt", "2", "last", "preempted"], lines
    assert {last["w"][-1], last["p"][-1]} == {second, third}, lines  # off X, on the two nodes left
    assert (job_dir / "moves").read_text().strip() == "1" and not (job_dir / "failures").exists()
    assert JobDir(job_dir).excluded()[0].startswith(f"{node} NODE_FAIL"), JobDir(job_dir).excluded()


# -- a replica the node's OOM killer ended ----------------------------------------------------------------

OOM_FIRST = textwrap.dedent(
    """\
    import os, sys
    import tsm.lifecycle as lc
    print("attempt", lc.attempt(), "last", lc.last_exit(), "on", os.environ["SLURMD_NODENAME"], flush=True)
    if lc.restart_count():
        sys.exit(0)
    hog = [bytearray(16 << 20) for _ in range(128)]  # 2 GiB, touched
    """
)


@pytest.mark.skipif(memory_cgroup_unavailable() is not None, reason=str(memory_cgroup_unavailable()))
def test_a_replica_the_nodes_oom_killer_ended_is_retried_off_that_node() -> None:
    """The nodes' memory is shared and short: every slurmd (so every job's processes) runs in one memory
    cgroup of 512 MiB for this test, and attempt 0 outgrows it. The kernel's OOM killer ends it; the wrapper
    records the node, and the retry (``max_retries=1``) runs elsewhere: given that node again, the batch script
    moves it off first. Asserted from the replica's own output and the job's records."""
    slurmds = [int(p) for p in subprocess.run(["pgrep", "-x", "slurmd"], capture_output=True, text=True).stdout.split()]
    assert slurmds
    sched: SlurmScheduler = create_scheduler("it")
    app = AppDef("oom", [Role("w", entrypoint=sys.executable, args=["-c", OOM_FIRST], max_retries=1,
                              resource=Resource(cpu=1, memMB=200))])  # fmt: skip
    nodes = MemoryCgroup(f"tsm-test-nodes-{os.getpid()}", 512 << 20)
    app_id = ""
    try:
        for pid in slurmds:
            nodes.add(pid)
        app_id = sched.submit(app, {"max_preemptions": 1})
        desc = sched.wait(app_id, timeout=300)
    finally:
        if app_id:
            sched.cancel(app_id)
        nodes.close()
    lines = stdout_lines(sched, app_id, "w")
    assert desc is not None and desc.state == AppState.SUCCEEDED, (desc, lines)
    first = lines[0].split()[-1]
    assert lines[0] == f"attempt 0 last None on {first}\n", lines
    assert lines[-1].startswith("attempt ") and " last failed:137 on " in lines[-1], lines
    assert lines[-1].split()[-1] != first, lines  # off the node whose OOM killer ended attempt 0
    job_dir = sched.job_dir(app_id)
    assert job_dir is not None
    assert JobDir(job_dir).excluded() == [f"{first} OOM (the kernel's OOM killer ended w/0)"]
    assert f"excluded nodes: {first} OOM" in desc.msg, desc.msg
    assert f"tsm: w/0 was killed by the kernel's OOM killer on {first}" in stderr_text(sched, app_id, "w")


def stderr_text(sched: SlurmScheduler, app_id: str, role: str) -> str:
    return "".join(sched.log_iter(app_id, role, 0, streams=Stream.STDERR))


# -- stalls ---------------------------------------------------------------------------------------------

SILENT = textwrap.dedent(
    """\
    import sys, time
    import tsm.lifecycle as lc
    lc.on_warning(lambda: print("warned", lc.attempt(), flush=True))
    print("attempt", lc.attempt(), "last", lc.last_exit(), flush=True)
    if lc.restart_count():
        sys.exit(0)
    while True:  # silent and idle: no log line, no CPU
        time.sleep(0.5)
    """
)


def test_a_silent_replica_is_stalled_warned_and_restarted_as_its_failure() -> None:
    sched: SlurmScheduler = create_scheduler("it")
    app = AppDef("stall", [Role("w", entrypoint=sys.executable, args=["-c", SILENT], max_retries=1,
                                resource=Resource(cpu=1, memMB=200))])  # fmt: skip
    app_id = sched.submit(app, {"stall_timeout": "5s", "on_stall": "restart", "warn_signal": "USR1",
                                "warn_before": "2s", "kill_grace": 2, "max_preemptions": 0})  # fmt: skip
    try:
        desc = sched.wait(app_id, timeout=300)
    finally:
        sched.cancel(app_id)
    lines = stdout_lines(sched, app_id, "w")
    assert desc is not None and desc.state == AppState.SUCCEEDED, (desc, lines)
    assert lines == ["attempt 0 last None\n", "warned 0\n", "attempt 1 last stalled\n"], lines
    job_dir = sched.job_dir(app_id)
    assert job_dir is not None
    assert (job_dir / "failures").read_text().strip() == "1"  # a stall is the replica's own failure
    assert "tsm: replica w/0 stalled for 5s, last line: 'attempt 0 last None'" in (job_dir / "batch.out").read_text()


CHECKPOINT_THEN_EXIT = textwrap.dedent(
    """\
    import sys, time
    import tsm.lifecycle as lc
    lc.on_warning(lambda: None)
    print("attempt", lc.attempt(), "last", lc.last_exit(), flush=True)
    while not lc.warned():  # silent and idle until warned
        time.sleep(0.5)
    print("checkpointed", flush=True)
    sys.exit(0)
    """
)


def test_a_stalled_replica_that_exits_0_on_the_warning_still_fails_the_app() -> None:
    """on_stall=fail: the replica checkpoints and exits 0 on the warning, and the app fails as stalled."""
    sched: SlurmScheduler = create_scheduler("it")
    app = AppDef("stall0", [Role("w", entrypoint=sys.executable, args=["-c", CHECKPOINT_THEN_EXIT], max_retries=1,
                                 resource=Resource(cpu=1, memMB=200))])  # fmt: skip
    app_id = sched.submit(app, {"stall_timeout": "5s", "on_stall": "fail", "warn_signal": "USR1",
                                "warn_before": "10s", "kill_grace": 2, "max_preemptions": 0})  # fmt: skip
    try:
        desc = sched.wait(app_id, timeout=300)
    finally:
        sched.cancel(app_id)
    lines = stdout_lines(sched, app_id, "w")
    assert lines == ["attempt 0 last None\n", "checkpointed\n"], lines
    assert desc is not None and desc.state == AppState.FAILED, desc
    replica = desc.roles_statuses[0].replicas[0]
    assert replica.state == AppState.FAILED, replica
    assert replica.error_msg == "stalled for 5s, last line: 'attempt 0 last None'", replica
    job_dir = sched.job_dir(app_id)
    assert job_dir is not None and (job_dir / "exit").read_text().strip() == "1"
    assert not (job_dir / "failures").exists()  # on_stall=fail: never restarted, max_retries=1 or not


# -- a time limit after a preemption ---------------------------------------------------------------------

LIMITED = textwrap.dedent(
    """\
    import sys, time
    import tsm.lifecycle as lc
    lc.on_warning(lambda: print("warned", lc.attempt(), flush=True))
    print("attempt", lc.attempt(), "last", lc.last_exit(), flush=True)
    if lc.restart_count() >= 2:
        sys.exit(0)
    while True:
        time.sleep(0.2)
    """
)


def test_a_time_limit_after_a_preemption_still_requeues(high_jobs: list[str]) -> None:
    """A preemption after the time limit's warning, then a time limit: both restart the app.

    Attempt 0 gets its time limit's warning (due 30 s in; Slurm sends it up to 30 s early), then is
    preempted: as the job's --signal was sent already, Slurm sends the tasks SIGTERM at once instead, and
    requeues the job at the end of the GraceTime; the batch script must wait for that, not end the job as
    failed. The batch shell tells a preemption by the job's ``PreemptTime``, which Slurm clears when it
    requeues the job, so attempt 1's time limit is one again: it is warned and requeues itself
    (``requeue_on_time_limit``); attempt 2 ends the app.
    """
    sched: SlurmScheduler = create_scheduler("it")
    app = AppDef("prelimit", [Role("w", entrypoint=sys.executable, args=["-c", LIMITED], max_retries=0,
                                   resource=Resource(cpu=NODE_CPUS, memMB=200))])  # fmt: skip
    app_id = sched.submit(app, {"partition": "low", "time_limit": "1m", "warn_signal": "USR1", "warn_before": "30s",
                                "requeue_on_time_limit": True, "max_preemptions": 2})  # fmt: skip
    try:
        wait_until(slowly(lambda: "warned 0\n" in stdout_lines(sched, app_id, "w")),
                   "the first attempt's time limit warning", timeout=150)  # fmt: skip
        preempt(node_of(sched, app_id, "w"), high_jobs)
        desc = sched.wait(app_id, timeout=420)
    finally:
        sched.cancel(app_id)
    lines = stdout_lines(sched, app_id, "w")
    job_dir = sched.job_dir(app_id)
    assert job_dir is not None
    batch = (job_dir / "batch.out").read_text()
    errors = list(sched.log_iter(app_id, "w", 0, streams=Stream.STDERR))
    assert desc is not None and desc.state == AppState.SUCCEEDED, (desc.msg if desc else None, lines, batch, errors)
    assert lines == ["attempt 0 last None\n", "warned 0\n", "attempt 1 last preempted\n", "warned 1\n",
                     "attempt 2 last time_limit\n"], (lines, batch)  # fmt: skip
    assert not (job_dir / "failures").exists()
    assert batch.count("tsm: the time limit is near: SIGUSR1 to every task") == 2, batch
    assert "tsm: role w ended (srun exit code 143) as Slurm preempts the job; waiting for Slurm" in batch, batch
    assert "tsm: requeueing at the time limit (preemption 2 of 2)" in batch, batch
