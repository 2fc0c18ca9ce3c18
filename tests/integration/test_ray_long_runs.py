"""Issue 25 on the real Ray head of ``scripts/ray-up``, with a second Ray node the test starts: a node lost
under a replica is a preemption (the replica restarts elsewhere, ``TSM_LAST_EXIT=preempted``, ``max_retries=0``
untouched, the node excluded; with each retry policy, and holding no placement group bundle twice, as the
state API shows), ``exclude_nodes`` keeps replicas off a node, a time limit with ``requeue_on_time_limit``
restarts the app, and a silent replica is stalled (a failure even when it exits 0 on the warning). Asserted
from the recorded states, the replicas' own output and Ray's state API.

The second node joins the shared head (never stopped here) as a worker node of 1 CPU with the custom
resource ``tsm_lr_node`` (only to tell it apart). It is started from Python (``ray._private.node.Node``, as
``ray.cluster_utils`` adds nodes) in a session of its own: ``ray start --address`` cannot join a head bound
to 127.0.0.1 (with multi-node enabled Ray rewrites 127.0.0.1 to the host's IP), and ``ray stop`` would stop
every Ray process of the machine, the head included. Killing the node's session (its raylet and agents,
SIGKILL) is the node dying under the replica; Ray marks it dead once its health checks fail.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from integration.ray_cluster import RayCluster, ray_cluster  # noqa: F401 (the fixture test modules ask for)
from testutil import GPU_LOST, MemoryCgroup, fake_nvidia_smi, memory_cgroup_unavailable
from tsm.errors import InvalidRunOptionError
from tsm.schedulers.api import Stream
from tsm.specs.api import AppDef, AppState, Resource, RetryPolicy, Role

pytestmark = [pytest.mark.integration, pytest.mark.ray]
PY = sys.executable
HANG = 300.0
#: the head's GCS, which the extra node joins
GCS = os.environ.get("TSM_TEST_RAY_GCS", "127.0.0.1:6379")
MARK = "tsm_lr_node"

#: Runs one Ray worker node until killed: argv = GCS address, resources (JSON), GPUs it says it has.
NODE = (
    "import os, sys, json, time\n"
    "os.environ['RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER'] = '0'  # keep the node on 127.0.0.1, as the head\n"
    "from ray._private.parameter import RayParams\n"
    "from ray._private.node import Node\n"
    "p = RayParams(gcs_address=sys.argv[1], node_ip_address='127.0.0.1', num_cpus=1, num_gpus=int(sys.argv[3]),\n"
    "              resources=json.loads(sys.argv[2]), object_store_memory=100 * 1024 * 1024, min_worker_port=0,\n"
    "              max_worker_port=0, include_log_monitor=False, node_manager_port=0,\n"
    "              runtime_env_dir_name=f'runtime_resources_{os.getpid()}')  # its own, as on another machine\n"
    "p.dashboard_agent_listen_port = None  # a free port: the head's agent holds the default\n"
    "Node(p, head=False, shutdown_at_exit=False, spawn_reaper=False)\n"
    "print('node up', flush=True)\n"
    "while True:\n"
    "    time.sleep(3600)\n"
)


def nodes(address: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"{address}/api/v0/nodes?detail=1&limit=10000", timeout=30) as resp:
        return list(json.load(resp)["data"]["result"]["result"])


def live_groups(address: str, app_id: str) -> list[dict[str, Any]]:
    """The app's placement groups (the driver names them ``tsm/<app id>/<n>``) not removed, from the state API."""
    with urllib.request.urlopen(f"{address}/api/v0/placement_groups?detail=1&limit=10000", timeout=30) as resp:
        groups = json.load(resp)["data"]["result"]["result"]
    return [g for g in groups if str(g.get("name")).startswith(f"tsm/{app_id}/") and g.get("state") != "REMOVED"]


#: The worker nodes this test process started (a second one is told from the first by its id).
_joined: list[dict[str, Any]] = []


class WorkerNode:
    """A Ray worker node of this machine joined to the shared head; :meth:`kill` ends it (only it).

    It unpacks runtime environments in a folder of its own, as a node of another machine does: two nodes'
    agents unpacking and evicting one folder race (a job failed with its working_dir "does not exist")."""

    def __init__(self, address: str, log: Path, cgroup: MemoryCgroup | None = None, gpus: int = 0,
                 env: dict[str, str] | None = None) -> None:
        self.address = address
        self.out = open(log, "wb")  # noqa: SIM115 (closed in kill)
        self.proc = subprocess.Popen([PY, "-c", NODE, GCS, json.dumps({MARK: 1}), str(gpus)], stdout=self.out,
                                     stderr=subprocess.STDOUT, start_new_session=True, env=env,
                                     preexec_fn=(lambda: cgroup.add(os.getpid())) if cgroup else None)  # noqa: PLW1509
        self.node_id = ""
        deadline = time.monotonic() + 120
        while not self.node_id:
            assert self.proc.poll() is None, f"the worker node exited: {log.read_text()[-2000:]}"
            assert time.monotonic() < deadline, f"the worker node did not join in 120 s: {log.read_text()[-2000:]}"
            known = {str(n.get("node_id")) for n in _joined}
            alive = [n for n in nodes(address) if n.get("state") == "ALIVE" and MARK in (n.get("resources_total") or {})
                     and str(n.get("node_id")) not in known]  # fmt: skip
            self.node_id = str(alive[0]["node_id"]) if alive else ""
            if alive:
                _joined.append(alive[0])
            time.sleep(0.5)

    def kill(self) -> None:
        """SIGKILL every process of the node's session (raylet, agents, its workers): the node dies."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self.out.close()

    def state(self) -> str:
        return next((str(n.get("state")) for n in nodes(self.address) if n.get("node_id") == self.node_id), "")


@pytest.fixture
def sched(ray_cluster: RayCluster, tmp_path_factory: pytest.TempPathFactory,  # noqa: F811
          monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    from tsm.schedulers.ray import create_scheduler

    monkeypatch.chdir(tmp_path_factory.mktemp("ray-long-runs"))
    s = create_scheduler("ray-long-runs", address=ray_cluster.address)
    yield s
    s.close()


@pytest.fixture
def worker(ray_cluster: RayCluster, tmp_path: Path) -> Iterator[WorkerNode]:  # noqa: F811
    node = WorkerNode(ray_cluster.address, tmp_path / "worker-node.log")
    try:
        yield node
    finally:
        node.kill()


def lines(sched: Any, app_id: str, k: int = 0) -> list[str]:
    return [ln.rstrip("\n") for ln in sched.log_iter(app_id, "w", k, streams=Stream.STDOUT)]


def record(sched: Any, app_id: str, k: int) -> dict[str, Any]:
    rep, _ = sched._replica(app_id, "w", k)
    return dict(rep)


def wait_for(what: str, check: Any, timeout: float = HANG) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


#: prints its attempt; a restarted attempt ends at once, a first one waits for the file argv[1]
ATTEMPT = (
    "import os, sys, time\n"
    "print('start', os.environ['TSM_ATTEMPT'], repr(os.environ['TSM_LAST_EXIT']), os.environ['TSM_RESTART_COUNT'],"
    " flush=True)\n"
    "if os.environ['TSM_LAST_EXIT']:\n"
    "    raise SystemExit(0)\n"
    "while not os.path.exists(sys.argv[1]):\n"
    "    time.sleep(0.2)\n"
)


def two_replicas(flag: Path, policy: RetryPolicy = RetryPolicy.REPLICA) -> AppDef:
    return AppDef("lr", [Role("w", entrypoint=PY, args=["-c", ATTEMPT, str(flag)], num_replicas=2, max_retries=0,
                              retry_policy=policy, resource=Resource(cpu=0.5, memMB=100))])


@pytest.mark.parametrize(("policy", "budget"), [(RetryPolicy.REPLICA, 1), (RetryPolicy.APPLICATION, 1),
                                                (RetryPolicy.ROLE, 1), (RetryPolicy.REPLICA, 0)])
def test_node_lost_under_a_replica_restarts_it_elsewhere_as_a_preemption(
        sched: Any, worker: WorkerNode, tmp_path: Path, policy: RetryPolicy, budget: int) -> None:
    flag = tmp_path / "go"
    app_id = sched.submit(two_replicas(flag, policy), {"placement_strategy": "SPREAD", "max_preemptions": budget})
    reps = wait_for("both replicas running", lambda: (
        r if all(x.get("state") == "RUNNING" and x.get("pid") for x in r) else None)
        if (r := [record(sched, app_id, k) for k in (0, 1)]) else None)
    on_worker = [k for k in (0, 1) if reps[k]["node_id"] == worker.node_id]
    assert len(on_worker) == 1, f"SPREAD placed no replica on the worker node {worker.node_id}: {reps}"
    lost, kept = on_worker[0], 1 - on_worker[0]
    node = f"node {worker.node_id[:12]} (127.0.0.1)"
    worker.kill()
    excluded = f"excluded nodes: {worker.node_id[:12]} (127.0.0.1): lost under role 'w' replica {lost} (attempt 0)"
    if not budget:  # max_preemptions=0: the loss fails the app (max_retries=0 would have too, but says so)
        final = sched.wait(app_id, timeout=HANG)
        assert final is not None and final.state == AppState.FAILED, final
        assert final.msg.startswith(f"role 'w' replica {lost} preempted: {node} was lost"), final.msg
        assert final.msg.endswith(f" (no preemptions left: max_preemptions=0); {excluded}"), final.msg
        r_lost, r_kept = final.roles_statuses[0].replicas[lost], final.roles_statuses[0].replicas[kept]
        assert r_lost.state == AppState.FAILED and r_lost.preempted and r_lost.restarts == 0
        assert r_kept.state == AppState.CANCELLED and not r_kept.preempted
        assert r_kept.error_msg == f"stopped after role 'w' replica {lost} was lost with its node"
        assert worker.state() == "DEAD"
        return
    rep = wait_for("the lost replica's restart to end", lambda: (
        r if (r := record(sched, app_id, lost)).get("attempt") == 1 and r.get("state") == "SUCCEEDED" else None))
    assert worker.state() == "DEAD"
    assert rep["node_id"] != worker.node_id and rep["nodes"] == [worker.node_id, rep["node_id"]]
    # the restart holds no resources twice: one group of the app's 2 bundles, none left on the lost node
    groups = live_groups(worker.address, app_id)
    assert [len(g["bundles"]) for g in groups] == [2], groups
    assert worker.node_id not in {b.get("node_id") for b in groups[0]["bundles"]}, groups
    flag.write_text("go")  # the replica on the head may end now (REPLICA: it was not restarted)
    final = sched.wait(app_id, timeout=HANG)
    assert final is not None and final.state == AppState.SUCCEEDED, final
    assert final.num_restarts == 1
    assert final.msg == excluded
    r_lost, r_kept = final.roles_statuses[0].replicas[lost], final.roles_statuses[0].replicas[kept]
    assert r_lost.preempted and r_lost.restarts == 1
    assert r_lost.error_msg.startswith(f"preempted: {node} was lost"), r_lost
    assert r_lost.error_msg.endswith("; restarted elsewhere (preemption 1 of max_preemptions=1; max_retries untouched)")
    # the restarted attempt's own output; attempt 0's log was on the lost node (this machine's shared log dir
    # still has it, so it is read from the replica's current node)
    assert lines(sched, app_id, lost)[-1] == "start 1 'preempted' 1"
    if policy == RetryPolicy.REPLICA:
        assert not r_kept.preempted and r_kept.restarts == 0 and r_kept.error_msg == ""
        assert lines(sched, app_id, kept) == ["start 0 '' 0"]
    else:  # APPLICATION: the replica on the head was stopped and restarted with it, as a preemption too
        assert r_kept.preempted and r_kept.restarts == 1
        assert r_kept.error_msg == f"preempted: restarted with role 'w' replica {lost}, whose {node} was lost"
        assert lines(sched, app_id, kept) == ["start 0 '' 0", "start 1 'preempted' 1"]


def test_exclude_nodes_keeps_replicas_off_a_node(sched: Any, worker: WorkerNode, tmp_path: Path) -> None:
    flag = tmp_path / "go"
    flag.write_text("go")
    app_id = sched.submit(two_replicas(flag), {"placement_strategy": "SPREAD", "exclude_nodes": worker.node_id})
    final = sched.wait(app_id, timeout=HANG)
    assert final is not None and final.state == AppState.SUCCEEDED, final
    assert [record(sched, app_id, k)["node_id"] != worker.node_id for k in (0, 1)] == [True, True]
    assert final.msg == f"excluded nodes: {worker.node_id[:12]} (127.0.0.1): exclude_nodes={worker.node_id}"
    head = [str(n["node_id"]) for n in nodes(sched.client().address) if n.get("state") == "ALIVE"]
    with pytest.raises(InvalidRunOptionError, match="excludes every alive node of the Ray cluster"):
        sched.submit(two_replicas(flag), {"exclude_nodes": ",".join(head)})
    with pytest.raises(InvalidRunOptionError, match="'no-such-node' names no node of the Ray cluster"):
        sched.submit(two_replicas(flag), {"exclude_nodes": "no-such-node"})


#: prints its attempt and why the last ended; the first attempt runs until stopped, a restart ends at once
#: (its 10 s limit leaves a loaded machine's actor and Python start time to print first)
TIMED = (
    "import os, time\n"
    "print(os.environ['TSM_ATTEMPT'], repr(os.environ['TSM_LAST_EXIT']), flush=True)\n"
    "while os.environ['TSM_ATTEMPT'] == '0':\n"
    "    time.sleep(0.1)\n"
)


@pytest.mark.parametrize("budget", [1, 0])
def test_time_limit_requeues_the_app_as_a_preemption(sched: Any, budget: int) -> None:
    role = Role("w", entrypoint=PY, args=["-c", TIMED], max_retries=0, resource=Resource(cpu=0.5, memMB=100))
    app_id = sched.submit(AppDef("rq", [role]), {"time_limit": "10s", "requeue_on_time_limit": True,
                                                 "max_preemptions": budget, "grace_period": 2})
    final = sched.wait(app_id, timeout=HANG)
    assert final is not None
    rep = final.roles_statuses[0].replicas[0]
    if budget:
        assert final.state == AppState.SUCCEEDED, final
        assert final.num_restarts == 1 and rep.preempted
        assert rep.error_msg == ("preempted: time limit 10s reached; the app restarts (preemption 1 of "
                                 "max_preemptions=1; max_retries untouched)")
        assert lines(sched, app_id) == ["0 ''", "1 'time_limit'"]
    else:
        assert final.state == AppState.FAILED, final
        assert final.msg == "time limit 10s reached (no preemptions left: max_preemptions=0)"
        assert lines(sched, app_id) == ["0 ''"]


#: says which attempt it is, then a first attempt sleeps without output or CPU (printing "warned" on USR1,
#: then exiting 0 with argv[1] = "exit": a handler that checkpoints and ends)
SILENT = (
    "import os, signal, sys, time\n"
    "def warned(*a):\n"
    "    print('warned', flush=True)\n"
    "    if sys.argv[1:] == ['exit']:\n"
    "        raise SystemExit(0)\n"
    "signal.signal(signal.SIGUSR1, warned)\n"
    "print('attempt', os.environ['TSM_ATTEMPT'], repr(os.environ['TSM_LAST_EXIT']), flush=True)\n"
    "if os.environ['TSM_ATTEMPT'] == '0':\n"
    "    time.sleep(3600)\n"
)


@pytest.mark.parametrize(("on_stall", "on_warning"), [("restart", "print"), ("fail", "print"), ("restart", "exit"),
                                                    ("fail", "exit")])
def test_a_silent_replica_is_stalled(sched: Any, on_stall: str, on_warning: str) -> None:
    # exiting 0 on the warning is no success: the replica was stopped for a stall
    role = Role("w", entrypoint=PY, args=["-c", SILENT, on_warning], max_retries=1,
                resource=Resource(cpu=0.5, memMB=100))
    app_id = sched.submit(AppDef("st", [role]), {"stall_timeout": "3s", "on_stall": on_stall, "warn_signal": "USR1",
                                                 "warn_before": "1s", "grace_period": 2})
    final = sched.wait(app_id, timeout=HANG)
    assert final is not None
    rep = final.roles_statuses[0].replicas[0]
    why = "stalled for 3s, last line: \"attempt 0 ''\""
    if on_stall == "restart":  # the replica's own failure: retried (max_retries=1), told it stalled
        assert final.state == AppState.SUCCEEDED, final
        assert final.num_restarts == 1 and rep.restarts == 1 and not rep.preempted
        assert lines(sched, app_id) == ["attempt 0 ''", "warned", "attempt 1 'stalled'"]
    else:
        assert final.state == AppState.FAILED, final
        assert final.msg == f"role 'w' replica 0 {why}"
        assert rep.error_msg == why and final.num_restarts == 0
        assert lines(sched, app_id) == ["attempt 0 ''", "warned"]


#: attempt 0 outgrows its node's memory when it runs in the test's memory cgroup (argv[1]) and otherwise waits
#: to be stopped; a restart prints and ends
HOG = (
    "import os, sys, time\n"
    "print('start', os.environ['TSM_ATTEMPT'], repr(os.environ['TSM_LAST_EXIT']), flush=True)\n"
    "if os.environ['TSM_LAST_EXIT']:\n"
    "    raise SystemExit(0)\n"
    "if sys.argv[1] in open('/proc/self/cgroup').read():\n"
    "    hog = [bytearray(16 << 20) for _ in range(192)]  # 3 GiB, touched\n"
    "while True:\n"
    "    time.sleep(0.2)\n"
)


@pytest.mark.skipif(memory_cgroup_unavailable() is not None, reason=str(memory_cgroup_unavailable()))
def test_a_replica_the_nodes_oom_killer_ended_restarts_off_that_node(
        sched: Any, ray_cluster: RayCluster, tmp_path: Path) -> None:  # noqa: F811
    """The worker node runs in a memory cgroup of 1 GiB (its raylet, agents and workers: the node's memory);
    the replica SPREAD onto it outgrows it and the kernel's OOM killer ends it. The app (APPLICATION policy,
    ``max_retries=1``) restarts whole in a new placement group that keeps off that node."""
    group = f"tsm-test-raynode-{os.getpid()}"
    memory = MemoryCgroup(group, 1 << 30)
    node = None
    try:
        node = WorkerNode(ray_cluster.address, tmp_path / "worker-node.log", cgroup=memory)
        app = AppDef("oom", [Role("w", entrypoint=PY, args=["-c", HOG, group], num_replicas=2, max_retries=1,
                                  retry_policy=RetryPolicy.APPLICATION, resource=Resource(cpu=0.5, memMB=100))])
        app_id = sched.submit(app, {"placement_strategy": "SPREAD"})
        final = sched.wait(app_id, timeout=HANG)
        assert final is not None and final.state == AppState.SUCCEEDED, final
        assert node.state() == "ALIVE"  # the node lives on: only the replica was killed
    finally:
        if node is not None:
            node.kill()
        memory.close()
    reps = [record(sched, app_id, k) for k in (0, 1)]
    hogs = [k for k in (0, 1) if reps[k]["nodes"][0] == node.node_id]
    assert len(hogs) == 1, f"SPREAD placed no replica on the worker node {node.node_id}: {reps}"
    k = hogs[0]
    assert reps[k]["nodes"][1] != node.node_id and reps[1 - k]["nodes"][1] != node.node_id, reps
    assert final.num_restarts == 1
    assert final.msg == (f"excluded nodes: {node.node_id[:12]} (127.0.0.1): the kernel's OOM killer ended role 'w' "
                         f"replica {k} (attempt 0)"), final.msg
    assert lines(sched, app_id, k)[-1] == "start 1 'failed:-9'"


#: attempt 0 fails (its node's GPU falls off the bus meanwhile, as the node's fake nvidia-smi says); a
#: restarted attempt succeeds
GPU_FAILS_ONCE = (
    "import os\n"
    "print('start', os.environ['TSM_ATTEMPT'], os.environ.get('CUDA_VISIBLE_DEVICES'), flush=True)\n"
    "raise SystemExit(0 if os.environ['TSM_ATTEMPT'] != '0' else 3)\n"
)


def test_a_failure_with_a_gpu_fault_restarts_off_that_node(sched: Any, ray_cluster: RayCluster,  # noqa: F811
                                                           tmp_path: Path) -> None:
    """Two worker nodes that each say they have one GPU (Ray takes ``num_gpus`` as given; this machine has none),
    each with a fake ``nvidia-smi`` on its PATH whose second answer is a GPU fallen off the bus. The replica
    (``gpu=1``: never on the head) fails on one of them; its actor reads the fault, and the app's retry
    (APPLICATION, ``max_retries=1``) is placed off that node, on the other."""
    made: list[WorkerNode] = []
    try:
        for name in ("a", "b"):
            fake = fake_nvidia_smi(tmp_path / f"gpu-{name}", GPU_LOST + "\n", 15)
            env = {**os.environ, "PATH": f"{fake}{os.pathsep}{os.environ['PATH']}"}
            made.append(WorkerNode(ray_cluster.address, tmp_path / f"node-{name}.log", gpus=1, env=env))
        app = AppDef("gpu", [Role("w", entrypoint=PY, args=["-c", GPU_FAILS_ONCE], max_retries=1,
                                  retry_policy=RetryPolicy.APPLICATION, resource=Resource(cpu=0.5, gpu=1, memMB=100))])
        app_id = sched.submit(app)
        final = sched.wait(app_id, timeout=HANG)
        out = lines(sched, app_id)  # each attempt's log is on its node: read before the nodes go
    finally:
        for node in made:
            node.kill()
    assert final is not None and final.state == AppState.SUCCEEDED, final
    rep = record(sched, app_id, 0)
    first, second = rep["nodes"][0], rep["nodes"][1]
    assert first != second and {first, second} == {n.node_id for n in made}, rep
    assert final.num_restarts == 1
    assert final.msg == (f"excluded nodes: {first[:12]} (127.0.0.1): a GPU fault under role 'w' replica 0 (attempt 0):"
                         f" nvidia-smi: {GPU_LOST}"), final.msg
    assert out == ["start 0 0", "start 1 0"], out  # Ray gave each attempt its node's GPU 0
