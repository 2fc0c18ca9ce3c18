"""The ray scheduler on a real Ray head (``scripts/ray-up``): the scheduler contract and what is Ray's own.

Replicas run on this host's Ray node, so the contract's checks that hand files and pids between the test
and a replica run unchanged.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from integration.ray_cluster import RayCluster, ray_cluster  # noqa: F401 (the fixture test modules ask for)
from schedulers import conformance
from schedulers.conformance import CHECKS, Backend
from tsm.errors import InvalidAppError
from tsm.schedulers.api import Stream
from tsm.specs.api import AppDef, AppDryRunInfo, AppState, Resource, RetryPolicy, Role

pytestmark = [pytest.mark.integration, pytest.mark.ray]
PY = sys.executable


def check_submitted(app_id: str, info: AppDryRunInfo[Any]) -> None:
    """What Ray holds for the job is exactly the request's: entrypoint, metadata, and the payload shipped."""
    from ray.job_submission import JobSubmissionClient

    from tsm.schedulers.ray.request import DriverPayload
    from tsm.schedulers.ray.scheduler import store_root

    req = info.request
    job = JobSubmissionClient(req.address).get_job_info(app_id)
    assert job.entrypoint == req.entrypoint
    assert job.metadata == req.metadata
    assert job.runtime_env["env_vars"] == req.runtime_env["env_vars"]
    shipped = store_root() / app_id / f"tsm_ray_payload_{app_id.replace('-', '_')}" / "payload.json"
    assert DriverPayload.from_json(shipped.read_text()) == req.payload


@pytest.fixture
def sched(ray_cluster: RayCluster, tmp_path_factory: pytest.TempPathFactory,  # noqa: F811
          monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    from tsm.schedulers.ray import create_scheduler

    # launched from a small directory: without a workspace the launching directory is the job's working_dir
    monkeypatch.chdir(tmp_path_factory.mktemp("ray-launch"))

    s = create_scheduler("ray-test", address=ray_cluster.address)
    yield s
    s.close()


@pytest.fixture
def backend(sched: Any) -> Backend:
    return Backend("ray", sched, "nosuchapp-00000000", check_submitted, retries=True)


@pytest.mark.parametrize("check", sorted(CHECKS))
def test_contract(backend: Backend, check: str, tmp_path: Path) -> None:
    fn = CHECKS[check]
    kwargs: dict[str, Any] = {"tmp_path": tmp_path} if "tmp_path" in fn.__code__.co_varnames else {}
    fn(backend, **kwargs)


def _role(name: str, code: str, *args: str, **kw: Any) -> Role:
    kw.setdefault("resource", Resource(cpu=1, memMB=100))
    return Role(name, entrypoint=PY, args=["-c", code, *args], **kw)


def _ended(sched: Any, app_id: str) -> Any:
    desc = sched.wait(app_id, timeout=conformance.HANG)
    assert desc is not None and desc.state.is_terminal, desc
    return desc


def test_echo_exact_output_per_stream(sched: Any) -> None:
    code = "import sys; print('hello'); print('oops', file=sys.stderr); sys.stdout.write('tail')"
    app_id = sched.submit(AppDef("echo", [_role("echo", code)]))
    assert _ended(sched, app_id).state == AppState.SUCCEEDED
    assert list(sched.log_iter(app_id, "echo", 0, streams=Stream.STDOUT)) == ["hello\n", "tail"]
    assert list(sched.log_iter(app_id, "echo", 0, streams=Stream.STDERR)) == ["oops\n"]
    assert sorted(sched.log_iter(app_id, "echo", 0)) == sorted(["hello\n", "oops\n", "tail"])
    future = list(sched.log_iter(app_id, "echo", 0, since=__import__("datetime").datetime.now()))
    assert future == []


def test_two_roles_three_replicas_each_have_their_own_status_and_log(sched: Any) -> None:
    code = "import os; print(os.environ['TSM_ROLE_NAME'], os.environ['TSM_REPLICA_ID'], os.environ['TSM_RANK0_HOST'])"
    small = Resource(cpu=0.5, memMB=50)
    app = AppDef("grid", [_role("a", code, num_replicas=3, resource=small),
                          _role("b", code + "; raise SystemExit(int(os.environ['TSM_REPLICA_ID']) == 2 and 0)",
                                num_replicas=3, resource=small)])
    app_id = sched.submit(app)
    desc = _ended(sched, app_id)
    assert desc.state == AppState.SUCCEEDED
    assert [rs.role for rs in desc.roles_statuses] == ["a", "b"]
    for rs in desc.roles_statuses:
        assert [r.id for r in rs.replicas] == [0, 1, 2]
        for r in rs.replicas:
            assert r.state == AppState.SUCCEEDED and r.exit_code == 0 and r.hostname and r.pid
            (line,) = sched.log_iter(app_id, rs.role, r.id, streams=Stream.STDOUT)
            role, k, rank0 = line.split()
            assert (role, int(k)) == (rs.role, r.id)
            assert rank0 == desc.roles_statuses[0].replicas[0].hostname  # rank 0 is role 0 replica 0's node
    assert len({r.pid for rs in desc.roles_statuses for r in rs.replicas}) == 6


@pytest.mark.parametrize("policy", [RetryPolicy.REPLICA, RetryPolicy.ROLE, RetryPolicy.APPLICATION])
def test_retries_restart_and_are_counted(sched: Any, tmp_path: Path, policy: RetryPolicy) -> None:
    marker = tmp_path / "attempts"
    fail_once = ("import os, sys; p = sys.argv[1]\nif os.environ['TSM_REPLICA_ID'] == '1':\n"
                 "    open(p, 'a').write('x')\n"
                 "    if len(open(p).read()) == 1: sys.exit(1)\n"
                 "print('attempt done')")
    app = AppDef("retry", [_role("w", fail_once, str(marker), num_replicas=2, max_retries=2, retry_policy=policy,
                                 resource=Resource(cpu=0.5, memMB=50))])
    app_id = sched.submit(app)
    desc = _ended(sched, app_id)
    assert desc.state == AppState.SUCCEEDED, desc
    assert marker.read_text() == "xx"
    assert desc.num_restarts == 1
    restarts = [r.restarts for r in desc.roles_statuses[0].replicas]
    assert restarts == ([0, 1] if policy == RetryPolicy.REPLICA else [1, 1])
    # every attempt's log is kept: the failed attempt's and the retry's
    assert list(sched.log_iter(app_id, "w", 1, streams=Stream.STDOUT)) == ["attempt done\n"]


def test_retries_exhausted_fail_with_the_replica_named(sched: Any) -> None:
    app = AppDef("exhaust", [_role("w", "raise SystemExit(7)", max_retries=1, retry_policy=RetryPolicy.REPLICA)])
    app_id = sched.submit(app)
    desc = _ended(sched, app_id)
    assert desc.state == AppState.FAILED
    assert "role 'w' replica 0" in desc.msg and "7" in desc.msg
    (r,) = desc.roles_statuses[0].replicas
    assert (r.state, r.exit_code, r.restarts) == (AppState.FAILED, 7, 1)


def test_infeasible_resources_are_refused_at_submit(sched: Any) -> None:
    app = AppDef("huge", [_role("w", "pass", resource=Resource(cpu=512, memMB=100))])
    with pytest.raises(InvalidAppError, match="role 'w' asks for CPU=512"):
        sched.submit(app)
    assert not [r for r in sched.list() if r.name == "huge"]


def test_gang_timeout_fails_with_the_reason(sched: Any) -> None:
    # each replica fits a node, all of them at once do not: the gang never starts
    app = AppDef("gang", [_role("w", "pass", num_replicas=3, resource=Resource(cpu=4, memMB=50))])
    app_id = sched.submit(app, {"gang_timeout": 3.0})
    desc = _ended(sched, app_id)
    assert desc.state == AppState.FAILED
    assert "gang start timed out after 3s" in desc.msg


def test_cancel_leaves_no_actor_and_no_process(sched: Any, tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    code = ("import os, subprocess, sys, time; c = subprocess.Popen(['sleep', '600']); "
            "open(sys.argv[1] + os.environ['TSM_REPLICA_ID'], 'w').write(f'{os.getpid()} {c.pid}'); time.sleep(600)")
    app_id = sched.submit(AppDef("cancel", [_role("w", code, str(pids), num_replicas=2,
                                                   resource=Resource(cpu=0.5, memMB=50))]))
    conformance._wait_until(lambda: all(Path(f"{pids}{k}").exists() for k in (0, 1)), "both replicas to start")
    procs = [int(p) for k in (0, 1) for p in Path(f"{pids}{k}").read_text().split()]
    assert all(conformance._alive(p) for p in procs)
    sched.cancel(app_id)
    assert _ended(sched, app_id).state == AppState.CANCELLED
    assert sched.client().actors(app_id) == []
    conformance._wait_until(lambda: not any(conformance._alive(p) for p in procs), "every replica process to end")


def test_cancel_honours_the_grace_period(sched: Any, tmp_path: Path) -> None:
    done = tmp_path / "cleaned"
    code = ("import signal, sys, time\n"
            "def term(*a):\n    time.sleep(1); open(sys.argv[1], 'w').write('ok'); sys.exit(0)\n"
            "signal.signal(signal.SIGTERM, term); print('ready', flush=True); time.sleep(600)")
    app_id = sched.submit(AppDef("grace", [_role("w", code, str(done))]), {"grace_period": 10.0})
    conformance._wait_until(lambda: list(sched.log_iter(app_id, "w", 0)) == ["ready\n"], "the replica to start")
    sched.cancel(app_id)
    assert done.read_text() == "ok"  # SIGTERM first, and time to clean up before SIGKILL


def test_list_shows_one_row_per_app_from_job_metadata(sched: Any) -> None:
    app_id = sched.submit(AppDef("rows", [_role("a", "pass", num_replicas=2), _role("b", "pass")]))
    _ended(sched, app_id)
    rows = [r for r in sched.list() if r.app_id == app_id]
    assert [(r.name, r.state) for r in rows] == [("rows", AppState.SUCCEEDED)]


def test_dry_run_prints_the_job_and_every_actor(sched: Any) -> None:
    info = sched.submit_dryrun(AppDef("dry", [_role("t", "pass", num_replicas=2)]), {"placement_strategy": "PACK"})
    text = str(info)
    assert "ray job submit" in text and "PACK" in text
    assert f"actor {info.request.app_id}/t/0 " in text and f"actor {info.request.app_id}/t/1 " in text


@pytest.mark.torch
def test_ddp_gloo_all_reduce_across_two_actors(sched: Any, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from tsm.components.dist import ddp

    script = tmp_path / "allreduce.py"
    script.write_text(
        "import os, torch, torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        "t = torch.tensor([float(dist.get_rank() + 1)])\n"
        "dist.all_reduce(t)\n"
        "print(f'rank {dist.get_rank()} of {dist.get_world_size()} sum {t.item():g}', flush=True)\n"
        "dist.destroy_process_group()\n"
    )
    app = ddp(script=str(script), j="2x1", cpu=1, memMB=500)
    app_id = sched.submit(app)
    desc = _ended(sched, app_id)
    role = desc.roles_statuses[0].role
    # torchrun's lines come prefixed "[<role><local rank>]:"
    out = [line.partition("]:")[2] for k in (0, 1) for line in sched.log_iter(app_id, role, k, streams=Stream.STDOUT)
           if "]:rank " in line]
    assert desc.state == AppState.SUCCEEDED, (desc, out)
    assert sorted(out) == ["rank 0 of 2 sum 3\n", "rank 1 of 2 sum 3\n"]


def test_follow_ends_with_the_replica(sched: Any) -> None:
    code = "import time\nfor i in range(3):\n    print(i, flush=True); time.sleep(0.5)"
    app_id = sched.submit(AppDef("follow", [_role("f", code)]))
    start = time.monotonic()
    assert list(sched.log_iter(app_id, "f", 0, should_tail=True)) == ["0\n", "1\n", "2\n"]
    assert time.monotonic() - start < conformance.HANG


def test_workspace_becomes_the_jobs_working_dir(sched: Any, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "data.txt").write_text("from the workspace\n")
    infos = []
    for _ in range(2):
        role = _role("w", "print(open('data.txt').read(), end='')")
        sched.build_workspace_and_update_role(role, str(ws), {})
        infos.append(sched.submit_dryrun(AppDef("ws", [role])))
    assert infos[0].request.working_dir == infos[1].request.working_dir  # unchanged: the same snapshot
    assert f"\"working_dir\": \"{infos[0].request.working_dir}\"" in str(infos[0])
    app_id = sched.schedule(infos[0])
    assert _ended(sched, app_id).state == AppState.SUCCEEDED
    assert list(sched.log_iter(app_id, "w", 0, streams=Stream.STDOUT)) == ["from the workspace\n"]
