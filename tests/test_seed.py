"""The seed TSM program style (``tsm.Container``, ``tsm.Role(...).runs().on().replicas()``, ``tsm.ElasticRole``,
``tsm.Application``, ``tsm.session``) run end to end on the real local scheduler.

The one torchrun test is marked ``torch``: without torch it is skipped with a reason (a failure under CI,
which installs torch==2.13.0; see tests/conftest.py).
"""

from __future__ import annotations

import os
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

import tsm
from tsm.runner.api import Runner
from tsm.seed import ElasticRole
from tsm.specs.api import Role as SpecRole

HANG = 600  # seconds: a guard against a hang, never a performance claim


@pytest.fixture(autouse=True)
def workdir(tsm_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    yield work
    with tsm.session() as s:
        for app in s.list("local"):
            if not app.state.is_terminal:
                s.stop(app.app_handle)


@pytest.fixture
def image(tmp_path: Path) -> Path:
    """A directory of plain scripts: the local scheduler's "image" (replicas run in it)."""
    img = tmp_path / "img"
    img.mkdir()
    (img / "worker.py").write_text(textwrap.dedent("""\
        import os, sys
        role, k, n = os.environ["TSM_ROLE_NAME"], os.environ["TSM_REPLICA_ID"], os.environ["TSM_NUM_REPLICAS"]
        print(f"{role} {k}/{n} args={sys.argv[1:]} level={os.environ.get('LOGLEVEL')} cwd={os.getcwd()}")
        port = os.environ.get("TSM_PORT_RPC")
        if port:
            print(f"port {int(port) > 0}")
        """))
    return img


# -- the builders ------------------------------------------------------------------------------------------
def test_seed_names_are_exported() -> None:
    assert tsm.Application is tsm.AppDef
    assert tsm.Role is SpecRole and tsm.session is not None
    for name in ("Container", "ElasticRole", "Application", "RunConfig", "session", "Role", "Resource"):
        assert name in dir(tsm), name


def test_container_require_and_ports() -> None:
    res = tsm.Resource(cpu=2, gpu=0, memMB=512)
    c = tsm.Container(image="/tmp").require(res).ports(rpc=0, http=8080)
    assert c.image == "/tmp" and c.resources == res and c.resources is not res
    assert c.port_map == {"rpc": 0, "http": 8080}
    positional = tsm.Container("/img", tsm.Resource(cpu=4), {"a": 1})
    assert positional.resources.cpu == 4 and positional.port_map == {"a": 1}


def test_role_builder_chain() -> None:
    c = tsm.Container(image="/img").require(tsm.Resource(cpu=3, gpu=0, memMB=100)).ports(rpc=0)
    role = tsm.Role("trainer").runs("train.py", "--lr", 0.1, LOGLEVEL="INFO", SEED=3).on(c).replicas(4)  # type: ignore[arg-type]
    assert (role.name, role.entrypoint, role.args) == ("trainer", "train.py", ["--lr", "0.1"])
    assert role.env == {"LOGLEVEL": "INFO", "SEED": "3"}
    assert (role.image, role.resource.cpu, role.port_map, role.num_replicas) == ("/img", 3, {"rpc": 0}, 4)
    app = tsm.Application("my_app").of(role).of(tsm.Role("other").runs("x"))
    assert [r.name for r in app.roles] == ["trainer", "other"]


def test_run_config() -> None:
    cfg = tsm.RunConfig()
    cfg.set("grace_period", 2.0)
    assert cfg.get("grace_period") == 2.0 and cfg.get("log_dir") is None and cfg.get("x", 1) == 1
    assert dict(cfg) == {"grace_period": 2.0}


def test_session_is_a_runner() -> None:
    with tsm.session("seed_sess") as s:
        assert isinstance(s, Runner)
        assert s.session_name == "seed_sess"


# -- a multi-role program ----------------------------------------------------------------------------------
def test_multi_role_program_runs_locally(image: Path) -> None:
    python = sys.executable
    small = tsm.Container(image=str(image)).require(tsm.Resource(cpu=1, gpu=0, memMB=256))
    server = tsm.Container(image=str(image)).require(tsm.Resource(cpu=1, gpu=0, memMB=256)).ports(rpc=0)
    reader = tsm.Role("reader").runs(python, "worker.py", "--shards", "8", LOGLEVEL="INFO").on(small).replicas(1)
    trainer = tsm.Role("trainer").runs(python, "worker.py", "--lr", "0.1").on(small).replicas(3)
    ps = tsm.Role("ps").runs(python, "worker.py").on(server).replicas(2)
    app = tsm.Application("seed_app").of(reader, trainer, ps)

    cfg = tsm.RunConfig()
    cfg.set("grace_period", 5.0)
    session = tsm.session("seed_sess")
    try:
        handle = session.run(app, scheduler="local", cfg=cfg)
        assert handle.startswith("local://seed_sess/seed_app-")
        status = session.wait(handle)
        assert status.state == tsm.AppState.SUCCEEDED, status
        assert [(rs.role, len(rs.replicas)) for rs in status.roles] == [("reader", 1), ("trainer", 3), ("ps", 2)]
        assert session.status(handle).state == tsm.AppState.SUCCEEDED

        assert list(session.log_lines(handle, "reader", 0)) == [
            f"reader 0/1 args=['--shards', '8'] level=INFO cwd={image}\n"
        ]
        for k in range(3):
            assert list(session.log_lines(handle, "trainer", k)) == [
                f"trainer {k}/3 args=['--lr', '0.1'] level=None cwd={image}\n"
            ]
        for k in range(2):
            assert list(session.log_lines(handle, "ps", k)) == [f"ps {k}/2 args=[] level=None cwd={image}\n", "port True\n"]

        described = session.describe(handle)
        assert [r.name for r in described.roles] == ["reader", "trainer", "ps"]
        assert described.roles[1].resource.memMB == 256
        assert handle in [a.app_handle for a in session.list()]
    finally:
        session.close()


def test_session_stop(image: Path) -> None:
    role = tsm.Role("sleeper").runs("sh", "-c", "echo up; sleep 600").replicas(2)
    with tsm.session("seed_stop") as s:
        handle = s.run(tsm.Application("stopme").of(role), scheduler="local", cfg={"grace_period": 5.0})
        for k in range(2):
            assert next(iter(s.log_lines(handle, "sleeper", k, should_tail=True))) == "up\n"
        s.stop(handle)
        assert s.status(handle).state == tsm.AppState.CANCELLED


# -- ElasticRole ---------------------------------------------------------------------------------------------
def test_elastic_role_command_in_a_dryrun(image: Path) -> None:
    c = tsm.Container(image=str(image)).require(tsm.Resource(cpu=2, gpu=0, memMB=512))
    role = (
        tsm.ElasticRole("trainer", nproc_per_node=2, nnodes="1:2", max_restarts=3, rdzv_port=29511)
        .runs("train.py", "--epochs", "1", LOGLEVEL="INFO")
        .on(c)
        .replicas(2)
    )
    assert isinstance(role, ElasticRole)
    assert (role.num_replicas, role.min_replicas) == (2, 1)
    assert role.port_map["c10d"] == 29511
    with tsm.session("seed_dry") as s:
        info = s.dryrun(tsm.Application("elastic").of(role), scheduler="local")
    req = info.request
    app_id = req.app_id
    reps = req.roles[0].replicas
    assert len(reps) == 2
    for rep in reps:
        assert rep.cwd == str(image)
        assert rep.env["LOGLEVEL"] == "INFO"
        assert rep.cmd == [
            "sh", "-c", 'exec python -m torch.distributed.run --rdzv_endpoint "$TSM_RANK0_HOST:$0" "$@"',
            "29511",
            "--nnodes", "1:2", "--nproc_per_node", "2", "--max_restarts", "3",
            "--rdzv_backend", "c10d", "--rdzv_id", app_id, "--role", "trainer",
            "train.py", "--epochs", "1",
        ]
    assert "--rdzv_endpoint" in str(info)


def test_elastic_role_defaults_and_extra_options() -> None:
    role = tsm.ElasticRole("w", nnodes="2", rdzv_conf="timeout=30").runs("t.py").replicas(2)
    assert role.min_replicas is None  # static: exactly 2 nodes
    assert 0 < role.rdzv_port < 65536  # a free port, picked when built
    args = role.args
    assert args[args.index("--nnodes") + 1] == "2" and args[args.index("--nproc_per_node") + 1] == "1"
    assert args[args.index("--rdzv_conf") + 1] == "timeout=30"
    assert args[-1] == "t.py"
    elastic = tsm.ElasticRole("e", nnodes="2:4").runs("t.py").replicas(1)
    assert elastic.min_replicas == 1  # never more than the replicas asked for


ALLREDUCE = """\
import os
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
# One write per line: the node's workers share its stdout (see test_lines_of_processes_sharing_stdout_stay_whole)
os.write(1, f"rank {rank}/{world} node {os.environ['TSM_REPLICA_ID']} sum {t.item():g}\\n".encode())
dist.destroy_process_group()
"""


@pytest.mark.torch  # without torch: skipped with a reason (tests/conftest.py), and a failure under CI
@pytest.mark.integration
def test_elastic_role_runs_torchrun_allreduce(image: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (image / "allreduce.py").write_text(ALLREDUCE)
    # The replicas run ``python -m torch.distributed.run``: the interpreter that has torch comes first on PATH.
    monkeypatch.setenv("PATH", os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    container = tsm.Container(image=str(image)).require(tsm.Resource(cpu=1, gpu=0, memMB=1024))
    role = (
        tsm.ElasticRole("trainer", nproc_per_node=2, nnodes="1:2", max_restarts=0)
        .runs("allreduce.py", OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
        .on(container)
        .replicas(2)
    )
    with tsm.session("seed_torch") as s:
        handle = s.run(tsm.Application("allreduce").of(role), scheduler="local", cfg={"grace_period": 5.0})
        status = s.wait(handle, timeout=HANG)
        logs = {k: [ln for ln in s.log_lines(handle, "trainer", k) if ln.startswith("rank ")] for k in range(2)}
        assert status.state == tsm.AppState.SUCCEEDED, (status, {k: list(s.log_lines(handle, "trainer", k)) for k in range(2)})
    lines = sorted(ln for k in range(2) for ln in logs[k])
    # 4 workers (2 nodes x 2 processes) each add rank + 1: 1 + 2 + 3 + 4 = 10 everywhere.
    assert [ln.split()[1] for ln in lines] == ["0/4", "1/4", "2/4", "3/4"]
    assert all(ln.rstrip().endswith("sum 10") for ln in lines)
    assert {ln.split()[3] for ln in lines} == {"0", "1"}  # both replicas (nodes) took part
