"""The kubernetes scheduler on the real single-node cluster of ``scripts/k8s-up`` (API server, kubelet on Docker).

Pods run the locally built ``tsm-test/python`` image (``imagePullPolicy: IfNotPresent``: no registry). The
scheduler's contract (:mod:`conformance`) runs first; four of its checks run here in a Kubernetes form,
because their premise differs:

* ``log_iter_names_valid_roles_and_replicas`` / ``logs_follow_filter_and_split_streams`` read stdout alone;
  Kubernetes keeps one combined log per container, so they read the combined stream here and the split
  streams are checked to be refused clearly.
* ``cancel_ends_the_whole_process_tree`` reads pids from inside the pod's pid namespace: here the
  container's host pid (``docker inspect``) is watched instead.
* ``args_and_env_arrive_byte_exact``: the API carries UTF-8 JSON and refuses env names outside
  ``[-._a-zA-Z][-._a-zA-Z0-9]*``; those are refused at dry run (checked), every other value arrives byte for byte.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import hostile
from integration.k8s_cluster import K8sCluster, kubectl
from schedulers import conformance
from schedulers.conformance import CHECKS, Backend
from tsm.errors import InvalidAppError, NotSupportedError, SubmissionError
from tsm.schedulers.api import Stream
from tsm.schedulers.kubernetes.request import host_name
from tsm.schedulers.kubernetes.scheduler import KubernetesScheduler
from tsm.specs.api import AppDef, AppDryRunInfo, AppState, Resource, RetryPolicy, Role
from tsm.specs.mounts import BindMount

pytestmark = [pytest.mark.integration, pytest.mark.kubernetes]

HANG = 240.0
SMALL = Resource(cpu=1, memMB=200)
#: requests a tenth of the limits, so several test apps fit the 2-CPU node at once
CFG: dict[str, Any] = {"request_fraction": 0.1, "gang_timeout": 120.0, "grace_period": 2}
REPLACED = {"cancel_ends_the_whole_process_tree", "args_and_env_arrive_byte_exact",
            "log_iter_names_valid_roles_and_replicas", "logs_follow_filter_and_split_streams"}


def objects(app_id: str) -> str:
    """What the cluster still holds for ``app_id`` (jobs, pods, services, secrets), as kubectl names."""
    out = kubectl("get", "jobs,pods,services,secrets", "-l", f"tsm/app-id={app_id}", "-o", "name")
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def gone(app_id: str) -> None:
    conformance._wait_until(lambda: objects(app_id) == "", f"every object of {app_id} to be deleted", 120)


class K8sBackend(Backend):
    """The contract's backend: roles run ``python3`` in the test image and see ``tmp_path`` (hostPath)."""

    tmp_path: Path = Path("/tmp")
    image: str = ""

    def role(self, name: str, *args: str, **kw: Any) -> Role:
        return Role(name, image=self.image, entrypoint="python3", args=list(args), resource=conformance.SMALL,
                    mounts=[BindMount(str(self.tmp_path), str(self.tmp_path))], **kw)


def check_submitted(app_id: str, info: AppDryRunInfo[Any]) -> None:
    """What the API server holds for each Job is exactly the request's manifest."""
    for job in info.request.jobs:
        held = json.loads(kubectl("get", "job", job["metadata"]["name"], "-o", "json").stdout)
        want = job["spec"]["template"]["spec"]["containers"][0]
        got = held["spec"]["template"]["spec"]["containers"][0]
        for key in ("image", "command", "args", "env", "imagePullPolicy", "resources"):
            assert got.get(key) == want.get(key), key
        assert held["metadata"]["labels"] == job["metadata"]["labels"]
        assert held["spec"]["backoffLimit"] == job["spec"]["backoffLimit"]
        assert held["metadata"]["ownerReferences"][0]["name"] == app_id


@pytest.fixture
def sched(k8s_cluster: K8sCluster) -> Iterator[KubernetesScheduler]:
    s = KubernetesScheduler("itest")
    yield s
    s.cleanup(include_running=True)
    s.close()


@pytest.fixture
def backend(sched: KubernetesScheduler, k8s_cluster: K8sCluster, tmp_path: Path) -> Backend:
    b = K8sBackend("kubernetes", sched, "nosuchapp-00000000", check_submitted, retries=True, cfg=dict(CFG))
    b.tmp_path = tmp_path
    b.image = k8s_cluster.python_image
    return b


#: Contract cases Kubernetes fails today, check -> reason; each a strict xfail, so a fix says so.
KNOWN_FAILURES: dict[str, str] = {}


@pytest.mark.parametrize("check", sorted(set(CHECKS) - REPLACED))
def test_contract(backend: Backend, check: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    if check in KNOWN_FAILURES:
        request.applymarker(pytest.mark.xfail(strict=True, reason=KNOWN_FAILURES[check]))
    fn = CHECKS[check]
    kwargs: dict[str, Any] = {"tmp_path": tmp_path} if "tmp_path" in fn.__code__.co_varnames else {}
    fn(backend, **kwargs)


def test_replaced_checks_exist() -> None:
    assert set(CHECKS) >= REPLACED


def ended(s: KubernetesScheduler, app_id: str) -> Any:
    desc = s.wait(app_id, timeout=HANG)
    assert desc is not None and desc.state.is_terminal, desc
    return desc


def sh(image: str, name: str, script: str, **kw: Any) -> Role:
    kw.setdefault("resource", SMALL)
    return Role(name, image=image, entrypoint="sh", args=["-c", script], **kw)


def test_log_iter_names_roles_and_refuses_split_streams(backend: Backend) -> None:
    s = backend.sched
    app_id = backend.submit(AppDef("logs", [backend.role("trainer", "-c", "print('hi')", num_replicas=2)]))
    conformance._ended(backend, app_id)
    with pytest.raises(conformance.UnknownAppError, match=r"no role 'nope'.*trainer"):
        list(s.log_iter(app_id, "nope", 0))
    with pytest.raises(conformance.UnknownAppError, match=r"replicas 0\.\.1, not 2"):
        list(s.log_iter(app_id, "trainer", 2))
    assert "".join(s.log_iter(app_id, "trainer", 1)) == "hi\n"
    for stream in (Stream.STDOUT, Stream.STDERR):
        with pytest.raises(NotSupportedError, match="combined"):
            list(s.log_iter(app_id, "trainer", 1, streams=stream))


def test_logs_follow_and_filter_combined(backend: Backend) -> None:
    s = backend.sched
    code = (
        "import sys, time\n"
        "for i in range(5):\n"
        "    print(f'out {i}', flush=True); time.sleep(0.2)\n"
        "sys.stdout.write('no newline')"
    )
    app_id = backend.submit(AppDef("tail", [backend.role("r", "-c", code)]))
    followed = list(s.log_iter(app_id, "r", 0, should_tail=True))
    assert followed == [f"out {i}\n" for i in range(5)] + ["no newline"]
    assert conformance._ended(backend, app_id) == AppState.SUCCEEDED
    assert list(s.log_iter(app_id, "r", 0, regex=r"[13]$")) == ["out 1\n", "out 3\n"]
    assert list(s.log_iter(app_id, "r", 0)) == followed  # from the snapshot: the pods are gone


def test_cancel_ends_every_process_of_the_pod(backend: Backend) -> None:
    code = "import subprocess; subprocess.Popen(['sleep', '600']); import time; time.sleep(600)"
    app_id = backend.submit(AppDef("tree", [backend.role("r", "-c", code)]))

    def host_pid() -> int:
        ids = subprocess.run(["docker", "ps", "-q", "--filter", f"label=io.kubernetes.pod.name={pod_name()}",
                              "--filter", "label=io.kubernetes.container.name=main"],
                             capture_output=True, text=True).stdout.split()
        if not ids:
            return 0
        return int(subprocess.run(["docker", "inspect", "-f", "{{.State.Pid}}", ids[0]], capture_output=True,
                                  text=True).stdout.strip() or 0)

    def pod_name() -> str:
        return kubectl("get", "pods", "-l", f"tsm/app-id={app_id}", "-o", "jsonpath={.items[0].metadata.name}").stdout

    conformance._wait_until(lambda: host_pid() > 0, "the container to run")
    pid = host_pid()
    assert conformance._alive(pid)
    backend.sched.cancel(app_id)
    assert conformance._ended(backend, app_id) == AppState.CANCELLED
    conformance._wait_until(lambda: not conformance._alive(pid), "the container's processes to end")
    gone(app_id)


def test_args_and_env_arrive_byte_exact_when_kubernetes_takes_them(backend: Backend, tmp_path: Path) -> None:
    import re

    marker = tmp_path / "pwned"

    ok_name = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
    all_args, all_env = hostile.args(str(marker)), hostile.env(str(marker))
    args = [a for a in all_args if hostile.is_utf8(a)]
    env = {k: v for k, v in all_env.items() if hostile.is_utf8(k) and hostile.is_utf8(v) and ok_name.match(k)}
    assert len(args) > 40 and len(env) > 40
    app_id = backend.submit(AppDef("hostile", [backend.role("r", "-c", hostile.DUMP, *args, env=env)]))
    assert conformance._ended(backend, app_id) == AppState.SUCCEEDED
    got_args, got_env = hostile.read_dump("".join(backend.sched.log_iter(app_id, "r", 0)))
    assert not hostile.mismatches(got_args, got_env, args, env)
    assert not marker.exists()
    bad = next(a for a in all_args if not hostile.is_utf8(a))
    with pytest.raises(InvalidAppError, match="not UTF-8"):
        backend.sched.submit_dryrun(AppDef("bytes", [backend.role("r", "-c", "pass", bad)]), backend.cfg)
    with pytest.raises(InvalidAppError, match="env name"):
        backend.sched.submit_dryrun(AppDef("names", [backend.role("r", env={"with space": "x"})]), backend.cfg)


def test_sh_output_is_exact(sched: KubernetesScheduler, k8s_cluster: K8sCluster) -> None:
    script = "echo 'hello world'; printf 'a\\tb\\n'; echo '$(HOME) $$ ${x}'; printf 'no newline'"
    app_id = sched.submit(AppDef("echo", [sh(k8s_cluster.python_image, "r", script)]), CFG)
    assert ended(sched, app_id).state == AppState.SUCCEEDED
    assert list(sched.log_iter(app_id, "r", 0)) == ["hello world\n", "a\tb\n", "$(HOME) $$ ${x}\n", "no newline"]
    gone(app_id)  # an ended app is deleted from the cluster; its logs were kept


def test_cli_echo_and_list(k8s_cluster: K8sCluster) -> None:
    tsm = [sys.executable, "-m", "tsm.cli.main"]
    run = subprocess.run([*tsm, "run", "-s", "kubernetes", "-c", "request_fraction=0.1", "utils.echo",
                          "--image", k8s_cluster.python_image, "--msg", "hello kubernetes"],
                         capture_output=True, text=True, timeout=HANG)
    assert run.returncode == 0, run.stderr
    handle = next(w for w in (run.stdout + run.stderr).split() if w.startswith("kubernetes://"))
    app_id = handle.rsplit("/", 1)[1]
    out = subprocess.run([*tsm, "wait", handle], capture_output=True, text=True, timeout=HANG)
    assert out.returncode == 0, out.stderr
    logs = subprocess.run([*tsm, "log", handle], capture_output=True, text=True, timeout=HANG)
    assert logs.returncode == 0, logs.stderr
    assert logs.stdout.rstrip("\n").endswith("hello kubernetes")
    listed = subprocess.run([*tsm, "list", "-s", "kubernetes"], capture_output=True, text=True, timeout=HANG)
    assert listed.returncode == 0, listed.stderr
    rows = [ln for ln in listed.stdout.splitlines() if app_id in ln]
    assert len(rows) == 1 and "SUCCEEDED" in rows[0]


def test_two_roles_reach_rank0(sched: KubernetesScheduler, k8s_cluster: K8sCluster) -> None:
    server = (
        "import socket; s = socket.socket(); s.bind(('', 7000)); s.listen(); c, _ = s.accept(); "
        "c.sendall(b'pong from ' + socket.gethostname().encode()); c.close()"
    )
    client = (
        "import os, socket, time\n"
        "for _ in range(300):\n"
        "    try:\n"
        "        c = socket.create_connection((os.environ['TSM_RANK0_HOST'], 7000)); break\n"
        "    except OSError:\n"
        "        time.sleep(0.1)\n"
        "print(c.recv(100).decode())"
    )
    img = k8s_cluster.python_image
    app = AppDef("pair", [Role("server", img, "python3", ["-c", server], resource=SMALL),
                          Role("client", img, "python3", ["-c", client], resource=SMALL)])
    app_id = sched.submit(app, CFG)
    assert ended(sched, app_id).state == AppState.SUCCEEDED
    assert "".join(sched.log_iter(app_id, "client", 0)) == "pong from server-0\n"


def test_replica_retries_use_backoff_limit(sched: KubernetesScheduler, k8s_cluster: K8sCluster, tmp_path: Path) -> None:
    marker = tmp_path / "n"
    script = f"echo try >> {marker}; [ $(wc -l < {marker}) -ge 2 ] || exit 5; echo done"
    role = sh(k8s_cluster.python_image, "r", script, max_retries=1, retry_policy=RetryPolicy.REPLICA,
              mounts=[BindMount(str(tmp_path), str(tmp_path))])
    app_id = sched.submit(AppDef("rretry", [role]), CFG)
    desc = ended(sched, app_id)
    assert desc.state == AppState.SUCCEEDED, desc
    assert desc.roles_statuses[0].replicas[0].restarts == 1
    assert "".join(sched.log_iter(app_id, "r", 0)) == "done\n"  # both tries: the first printed nothing


def test_application_retries_recreate_every_job(sched: KubernetesScheduler, k8s_cluster: K8sCluster,
                                                tmp_path: Path) -> None:
    marker = tmp_path / "n"
    img = k8s_cluster.python_image
    mounts = [BindMount(str(tmp_path), str(tmp_path))]
    fail_once = f"echo x >> {marker}; [ $(wc -l < {marker}) -ge 2 ] || exit 4; echo ok"
    app = AppDef("aretry", [sh(img, "a", fail_once, max_retries=1, mounts=mounts),
                            sh(img, "b", "echo b", max_retries=1, mounts=mounts)])
    app_id = sched.submit(app, CFG)
    desc = ended(sched, app_id)
    assert desc.state == AppState.SUCCEEDED, desc
    assert desc.num_restarts >= 1
    assert "".join(sched.log_iter(app_id, "a", 0)) == "ok\n"
    assert marker.read_text() == "x\nx\n"  # a failed once, then the app's Jobs were made again
    assert "".join(sched.log_iter(app_id, "b", 0)).endswith("b\n")


def test_missing_image_fails_with_err_image_pull_at_once(sched: KubernetesScheduler) -> None:
    role = Role("r", "tsm-test/no-such-image:404", "sh", resource=SMALL)
    app_id = sched.submit(AppDef("noimage", [role]), {**CFG, "gang_timeout": 3600.0})
    desc = ended(sched, app_id)
    assert desc.state == AppState.FAILED
    # the kubelet's pull error, not the gang timeout (an hour): the image exists in no registry
    assert "a replica cannot start: role 'r' replica 0: ErrImagePull" in desc.msg, desc.msg
    assert "gang_timeout" not in desc.msg
    gone(app_id)


def test_app_that_cannot_fit_is_refused_at_submit(sched: KubernetesScheduler, k8s_cluster: K8sCluster) -> None:
    big = Role("r", k8s_cluster.python_image, "sh", resource=Resource(cpu=64, memMB=100))
    with pytest.raises(SubmissionError, match="cannot fit.*largest node"):
        sched.submit(AppDef("huge", [big]), CFG)
    many = Role("r", k8s_cluster.python_image, "sh", resource=Resource(cpu=1, memMB=100), num_replicas=3)
    with pytest.raises(SubmissionError, match="cannot fit.*together"):
        sched.submit(AppDef("many", [many]), {**CFG, "request_fraction": 1.0})
    assert kubectl("get", "jobs", "-l", "tsm/scheduler=kubernetes", "-o", "name").stdout.count("huge-") == 0


def test_cancel_deletes_every_object_and_keeps_logs(sched: KubernetesScheduler, k8s_cluster: K8sCluster) -> None:
    app_id = sched.submit(AppDef("cancel", [sh(k8s_cluster.python_image, "r", "echo started; sleep 600",
                                                num_replicas=2)]), CFG)
    conformance._wait_until(lambda: "".join(sched.log_iter(app_id, "r", 1)) == "started\n", "the replica to start")
    assert objects(app_id)
    sched.cancel(app_id)
    assert ended(sched, app_id).state == AppState.CANCELLED
    gone(app_id)
    assert "".join(sched.log_iter(app_id, "r", 1)) == "started\n"


def test_one_pod_list_per_refresh(sched: KubernetesScheduler, k8s_cluster: K8sCluster) -> None:
    app_id = sched.submit(AppDef("many", [sh(k8s_cluster.python_image, "r", "sleep 600", num_replicas=4)]), CFG)
    client = sched.client
    time.sleep(1.5)  # past the watcher's cache age
    before = sum(client.calls.values())
    for _ in range(5):
        desc = sched.describe(app_id)
        assert desc is not None and len(desc.roles_statuses[0].replicas) == 4
    assert sum(client.calls.values()) - before == 1
    sched.cancel(app_id)


#: each rank contributes (r + 1, 10 (r + 1)): with 2 ranks the all-reduced sum is (3, 30) in every pod
GLOO_SUM = (
    "import os, socket, torch, torch.distributed as dist\n"
    "dist.init_process_group('gloo')\n"
    "r, w = dist.get_rank(), dist.get_world_size()\n"
    "t = torch.tensor([r + 1.0, 10.0 * (r + 1)])\n"
    "dist.all_reduce(t, op=dist.ReduceOp.SUM)\n"
    "print(f'rank {r}/{w} on {socket.gethostname()} via {os.environ[\"MASTER_ADDR\"]}: sum {t.tolist()}', flush=True)\n"
    "dist.barrier()\n"
    "dist.destroy_process_group()\n"
)


@pytest.mark.torch
def test_dist_ddp_gloo_all_reduce_across_two_pods(sched: KubernetesScheduler, k8s_cluster: K8sCluster,
                                                  tmp_path: Path) -> None:
    """``dist.ddp -j 2x1``: torchrun's c10d rendezvous on rank 0's pod, then a real gloo all-reduce between the
    two pods. On this DNS-less cluster the second pod reaches rank 0 by its pod IP, and rank 0's own FQDN
    (which c10d advertises as MASTER_ADDR) through the host aliases tsm adds."""
    from tsm.components.dist import ddp

    if subprocess.run(["docker", "image", "inspect", k8s_cluster.torch_image], capture_output=True).returncode:
        pytest.skip(f"no {k8s_cluster.torch_image} image (scripts/docker-up builds it with WITH_TORCH=1)")
    script = tmp_path / "gloo_sum.py"
    script.write_text(GLOO_SUM)
    app = ddp(script=str(script), image=k8s_cluster.torch_image, j="2x1", cpu=1, memMB=1500,
              env={"OMP_NUM_THREADS": "1"}, mounts=[f"type=bind,src={tmp_path},dst={tmp_path},readonly"])
    app_id = sched.submit(app, {**CFG, "gang_timeout": 200.0})
    desc = ended(sched, app_id)
    role = app.roles[0].name
    logs = {k: "".join(sched.log_iter(app_id, role, k)) for k in range(2)}
    assert desc.state == AppState.SUCCEEDED, (desc, logs)
    sums = {k: [ln.split("]:", 1)[-1] for ln in text.splitlines() if ": sum " in ln] for k, text in logs.items()}
    fqdn = f"{host_name(role, 0)}.{app_id}.default.svc.cluster.local"  # rank 0's agent advertises its FQDN
    ranks = []  # the c10d rendezvous numbers the pods in the order they joined: either may be rank 0
    for k in range(2):
        assert len(sums[k]) == 1, logs
        head, _, tail = sums[k][0].partition("/2 on ")
        ranks.append(head.removeprefix("rank "))
        assert tail == f"{host_name(role, k)} via {fqdn}: sum [3.0, 30.0]", logs
    assert sorted(ranks) == ["0", "1"], logs
    gone(app_id)


def _tsm(*args: str) -> subprocess.CompletedProcess[str]:
    run = subprocess.run([sys.executable, "-m", "tsm.cli.main", *args], capture_output=True, text=True, timeout=HANG)
    assert run.returncode == 0, run.stdout + run.stderr
    return run


def test_workspace_image_is_built_once_and_runs(k8s_cluster: K8sCluster, tmp_path: Path) -> None:
    """``--workspace``: an image of the workspace on the role's image, built by the local engine (the kubelet's
    runtime), runs the workspace's files; an unchanged workspace reuses the tag and builds nothing."""
    import secrets

    ws = tmp_path / "ws"
    ws.mkdir()
    token = secrets.token_hex(8)  # a new workspace content: a tag no earlier run built
    (ws / "data.txt").write_text(f"workspace {token}\n  two spaces, a tab\there\nno newline")
    (ws / "skipped.txt").write_text("left out\n")
    (ws / ".dockerignore").write_text("skipped.txt\n")
    cmd = ["run", "-s", "kubernetes", "-c", "request_fraction=0.1", "--workspace", str(ws), "utils.sh",
           "--image", k8s_cluster.python_image, "--", "cat data.txt; ls"]
    plan = _tsm(*cmd[:1], "--dryrun", *cmd[1:]).stdout
    line = next(ln for ln in plan.splitlines() if ln.startswith("# workspace image of role"))
    tag = line.split(": build ", 1)[1].split()[0]
    assert tag.startswith("tsm-workspace:") and f"image: \"{tag}\"" in plan, plan
    try:
        outputs, created = [], []
        for _ in range(2):
            run = _tsm(*cmd)
            handle = next(w for w in (run.stdout + run.stderr).split() if w.startswith("kubernetes://"))
            _tsm("wait", handle)
            outputs.append(_tsm("log", handle).stdout)
            created.append(subprocess.run(["docker", "image", "inspect", "-f", "{{.Id}} {{.Created}}", tag],
                                          capture_output=True, text=True).stdout)
        # the replica's lines, prefixed by the CLI with the replica's name
        bodies = [[ln.split(" ", 1)[1] if " " in ln else "" for ln in out.splitlines()] for out in outputs]
        assert bodies[0] == [f"workspace {token}", "  two spaces, a tab\there", "no newlinedata.txt"], outputs[0]
        assert bodies[1] == bodies[0]
        assert created[0] and created[0] == created[1]  # the same image: not rebuilt
        again = _tsm(*cmd[:1], "--dryrun", *cmd[1:]).stdout
        assert f": reuse (already built) {tag} " in again, again
    finally:
        subprocess.run(["docker", "image", "rm", "-f", tag], capture_output=True)


def _pods_ended(app_id: str, n: int) -> bool:
    phases = kubectl("get", "pods", "-l", f"tsm/app-id={app_id}", "-o", "jsonpath={.items[*].status.phase}").stdout
    return phases.split() == ["Succeeded"] * n


def test_tsm_rm_deletes_what_an_unwatched_app_left(k8s_cluster: K8sCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """``tsm run --detach`` and nobody looks again (the home's keeper off, as when the submitting machine
    restarted: else the keeper's look at the end deletes them): the ended app's objects stay on the cluster
    until ``tsm rm`` (which sees it ended, copies its logs, deletes every object, then forgets it)."""
    monkeypatch.setenv("TSM_KEEPER", "0")
    run = _tsm("run", "--detach", "-s", "kubernetes", "-c", "request_fraction=0.1", "utils.sh",
               "--image", k8s_cluster.python_image, "--num_replicas", "2", "--", "echo left behind")
    handle = next(w for w in (run.stdout + run.stderr).split() if w.startswith("kubernetes://"))
    app_id = handle.rsplit("/", 1)[1]
    conformance._wait_until(lambda: _pods_ended(app_id, 2), "both pods to end", HANG)
    assert objects(app_id).count("pod/") == 2  # nothing watched it: its objects are still there
    assert _tsm("rm", handle).stdout == f"removed {handle}\n"
    gone(app_id)
    gone_log = subprocess.run([sys.executable, "-m", "tsm.cli.main", "log", handle], capture_output=True, text=True)
    assert gone_log.returncode != 0


def test_cleanup_command_deletes_ended_apps_after_a_time(sched: KubernetesScheduler, k8s_cluster: K8sCluster,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """``python -m tsm.schedulers.kubernetes cleanup``: for apps whose launcher is gone (no local state, no
    keeper: the keeper's look at the end would have deleted the objects)."""
    import shutil

    monkeypatch.setenv("TSM_KEEPER", "0")
    from tsm.schedulers.kubernetes.scheduler import store_root

    app_id = sched.submit(AppDef("orphan", [sh(k8s_cluster.python_image, "r", "echo bye")]), CFG)
    conformance._wait_until(lambda: _pods_ended(app_id, 1), "the pod to end", HANG)
    shutil.rmtree(store_root() / app_id)  # the launcher's machine is gone: nothing local knows the app

    def cleanup(*args: str) -> list[str]:
        out = subprocess.run([sys.executable, "-m", "tsm.schedulers.kubernetes", "cleanup", *args],
                             capture_output=True, text=True, timeout=HANG)
        assert out.returncode == 0, out.stderr
        return out.stdout.splitlines()

    assert f"deleted {app_id}" not in cleanup("--older-than", "3600")  # ended seconds ago: kept
    assert f"would delete {app_id}" in cleanup("--dry-run")
    assert objects(app_id)
    assert f"deleted {app_id}" in cleanup("--older-than", "0")
    gone(app_id)
    bad = subprocess.run([sys.executable, "-m", "tsm.schedulers.kubernetes", "cleanup", "--older-than", "soon"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "not a number of seconds" in bad.stderr


def test_view_snapshot_is_one_pod_list_for_every_app(sched: KubernetesScheduler, k8s_cluster: K8sCluster) -> None:
    """The views' batched refresh (``tsm top``/``tsm serve``): one pod list for all the apps and their
    replicas, plus one metrics list only when the cluster serves ``metrics.k8s.io`` (this one does not:
    usage stays None, shown as n/a, and it is not asked again on the next refresh)."""
    from tsm.views.snapshot import BatchSnapshot

    assert isinstance(sched, BatchSnapshot)
    img = k8s_cluster.python_image
    many = sched.submit(AppDef("viewmany", [sh(img, "w", "sleep 600", num_replicas=3)]), CFG)
    one = sched.submit(AppDef("viewone", [sh(img, "x", "exit 3")]), CFG)
    conformance._wait_until(lambda: all(r.state == AppState.RUNNING for r in sched.describe(many).roles_statuses[0].replicas),
                            "the 3 replicas to run")
    conformance._wait_until(lambda: sched.describe(one).state == AppState.FAILED, "the other app to fail")
    client = sched.client
    ips = set(kubectl("get", "pods", "-l", f"tsm/app-id={many}", "-o", "jsonpath={.items[*].status.podIP}").stdout.split())
    for refresh in range(2):
        before = dict(client.calls)
        views = {v.app_id: v for v in sched.view_snapshot([many, one, "nosuchapp-00000000"])}
        made = {k: n - before.get(k, 0) for k, n in client.calls.items() if n != before.get(k, 0)}
        assert made.pop("list pods") == 1, made
        # the first refresh finds out the cluster serves no metrics; the second does not ask again
        assert made in ({"list pod metrics": 1}, {}) if refresh == 0 else not made, made
    assert set(views) == {many, one}
    v = views[many]
    assert (v.state, v.name, v.restarts, v.last_error) == ("RUNNING", "viewmany", 0, "")
    assert v.created is not None and v.started is not None and v.ended is None
    assert [(r.role, r.idx, r.state) for r in v.replicas] == [("w", k, "RUNNING") for k in range(3)]
    assert {r.host for r in v.replicas} == ips and len(ips) == 3
    for r in v.replicas:
        assert (r.cpu_req, r.mem_req_mb, r.gpu_req, r.exit_code, r.attempt) == (0.1, 20.0, None, None, 0)
        assert r.cpu_used is None and r.mem_used_mb is None  # no metrics-server: n/a, not an error
    failed = views[one]  # ended: answered from the final status kept in the store
    assert failed.state == "FAILED" and "exited with code 3" in failed.last_error
    assert [(r.state, r.exit_code) for r in failed.replicas] == [("FAILED", 3)]
    sched.cancel(many)
    before = sum(client.calls.values())
    (gone_view,) = sched.view_snapshot([many])
    assert gone_view.state == "CANCELLED" and sum(client.calls.values()) == before  # no API call for an ended app
