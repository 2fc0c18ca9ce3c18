"""dist.ddp and dist.spmd: -j parsing, the exact torchrun command, and that it runs without shell injection."""

from __future__ import annotations

import os
import re
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tsm.components import materialize
from tsm.components.dist import LAUNCH_SCRIPT, JobShape, ddp, parse_j, spmd
from tsm.errors import ComponentArgumentError
from tsm.specs.api import AppDef, Resource, Role, macros
from tsm.specs.named_resources import get_named_resource
from tsm.specs.validate import validate_app


def only_role(app: AppDef) -> Role:
    validate_app(app)
    assert len(app.roles) == 1
    return app.roles[0]


# -- -j ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("j", "shape"),
    [
        ("1x2", JobShape(1, 2)),
        ("2x4", JobShape(2, 4)),
        ("16x8", JobShape(16, 8)),
        ("1:4x8", JobShape(4, 8, 1)),
        ("2:2x1", JobShape(2, 1, 2)),
        ("1:1x1", JobShape(1, 1, 1)),
        (" 2x3 ", JobShape(2, 3)),
    ],
)
def test_parse_j(j: str, shape: JobShape) -> None:
    assert parse_j(j) == shape


@pytest.mark.parametrize(
    ("j", "why"),
    [
        ("x2", "expected \\[min:\\]NxM"),
        ("2x", "expected \\[min:\\]NxM"),
        ("2", "expected \\[min:\\]NxM"),
        ("2*4", "expected \\[min:\\]NxM"),
        ("a:2x4", "expected \\[min:\\]NxM"),
        ("-1x2", "expected \\[min:\\]NxM"),
        ("", "expected \\[min:\\]NxM"),
        ("0x1", "must be at least 1"),
        ("1x0", "must be at least 1"),
        ("3:2x1", "the minimum number of nodes \\(3\\) must be between 1 and the number of nodes \\(2\\)"),
        ("0:2x1", "the minimum number of nodes \\(0\\) must be between 1"),
    ],
)
def test_bad_j_is_a_clear_argument_error(j: str, why: str) -> None:
    with pytest.raises(
        ComponentArgumentError, match=f"^tsm run dist.ddp: -j {re.escape(repr(j))}: .*{why}"
    ) as info:
        materialize(ddp, [f"-j={j}", "--script", "train.py"], prog="tsm run dist.ddp")
    assert info.value.usage.startswith("usage: tsm run dist.ddp")


def test_nnodes_arg() -> None:
    assert (JobShape(2, 1).nnodes_arg, JobShape(4, 1, 2).nnodes_arg) == ("2", "2:4")
    assert JobShape(1, 8).single_node and not JobShape(1, 8, 1).single_node and not JobShape(2, 1).single_node


# -- the command ---------------------------------------------------------------------------------------
def test_multi_node_command_shape() -> None:
    app = materialize(
        ddp,
        [
            "-j",
            "2x4",
            "--script",
            "path/train.py",
            "--max_retries",
            "3",
            "--rdzv_port",
            "1234",
            "--",
            "--lr",
            "0.1",
        ],
    )
    role = only_role(app)
    assert app.name == "train"
    assert role.name == "ddp"
    assert role.entrypoint == "sh"
    assert role.args == [
        "-c",
        'exec python -m torch.distributed.run --rdzv_endpoint "$${rank0_env}:$0" "$@"',
        "1234",
        "--nnodes",
        "2",
        "--nproc_per_node",
        "4",
        "--rdzv_backend",
        "c10d",
        "--rdzv_id",
        "${app_id}",
        "--max_restarts",
        "3",
        "--role",
        "ddp",
        "path/train.py",
        "--lr",
        "0.1",
    ]
    assert (role.num_replicas, role.min_replicas, role.max_retries) == (2, None, 3)
    assert role.port_map == {"c10d": 1234}
    assert role.resource == Resource(cpu=2, gpu=0, memMB=1024)


def test_elastic_module_command_shape() -> None:
    app = materialize(
        ddp, ["-j", "1:3x2", "-m", "trainer.main", "--name", "workers", "--rdzv_backend", "etcd"]
    )
    role = only_role(app)
    assert app.name == "trainer-main"
    assert role.args[2:] == [
        "29500",
        "--nnodes",
        "1:3",
        "--nproc_per_node",
        "2",
        "--rdzv_backend",
        "etcd",
        "--rdzv_id",
        "${app_id}",
        "--max_restarts",
        "0",
        "--role",
        "workers",
        "-m",
        "trainer.main",
    ]
    assert (role.name, role.num_replicas, role.min_replicas) == ("workers", 3, 1)


def test_single_node_uses_a_standalone_rendezvous_without_a_shell() -> None:
    role = only_role(materialize(ddp, ["-j", "1x8", "--script", "train.py", "--", "a"]))
    assert role.entrypoint == "python"
    assert role.args == [
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nnodes",
        "1",
        "--nproc_per_node",
        "8",
        "--max_restarts",
        "0",
        "--role",
        "ddp",
        "train.py",
        "a",
    ]
    assert role.port_map == {}
    assert (role.num_replicas, role.min_replicas) == (1, None)


def test_the_macro_becomes_the_rank0_variable() -> None:
    role = only_role(materialize(ddp, ["-j", "2x1", "--script", "t.py"]))
    replica = macros.Values(img_root="/img", app_id="t-123", replica_id="1").apply(role)
    assert replica.args[1] == 'exec python -m torch.distributed.run --rdzv_endpoint "$TSM_RANK0_HOST:$0" "$@"'
    assert replica.args[replica.args.index("--rdzv_id") + 1] == "t-123"
    assert role.args[1] == LAUNCH_SCRIPT


def test_ddp_resources_env_image() -> None:
    role = only_role(
        materialize(
            ddp,
            [
                "--script",
                "t.py",
                "--cpu",
                "8",
                "--gpu",
                "2",
                "--memMB",
                "4096",
                "--env",
                "A=1",
                "--image",
                "/img",
            ],
        )
    )
    assert role.resource == Resource(cpu=8, gpu=2, memMB=4096)
    assert (role.env, role.image) == ({"A": "1"}, "/img")
    role = only_role(materialize(ddp, ["--script", "t.py", "-h", "gpu.medium"]))
    assert role.resource == get_named_resource("gpu.medium")


@pytest.mark.parametrize(("argv", "got"), [([], "none"), (["--script", "a.py", "-m", "b"], "--script, -m")])
def test_ddp_needs_exactly_one_of_script_or_m(argv: list[str], got: str) -> None:
    with pytest.raises(ComponentArgumentError, match=rf"give exactly one of --script or -m \(got {got}\)"):
        materialize(ddp, argv)


@pytest.mark.parametrize("port", ["0", "65536", "-1"])
def test_ddp_rejects_bad_ports(port: str) -> None:
    with pytest.raises(ComponentArgumentError, match="a port must be between 1 and 65535"):
        materialize(ddp, ["--script", "t.py", "-j", "2x1", f"--rdzv_port={port}"])


def test_spmd_defaults_to_one_process_on_one_node() -> None:
    app = materialize(spmd, ["--script", "prog.py", "--", "x"])
    role = only_role(app)
    assert (app.name, role.name, role.entrypoint) == ("prog", "spmd", "python")
    assert role.args == ["-m", "torch.distributed.run", "--standalone", "--nnodes", "1", "--nproc_per_node", "1",
                         "--max_restarts", "0", "--role", "spmd", "prog.py", "x"]  # fmt: skip
    assert role.resource == Resource()


def test_spmd_multi_node_is_the_ddp_launcher() -> None:
    spmd_app = materialize(spmd, ["-j", "3x2", "-m", "prog", "--max_retries", "1", "-h", "cpu.small"])
    ddp_app = materialize(
        ddp, ["-j", "3x2", "-m", "prog", "--max_retries", "1", "-h", "cpu.small", "--name", "spmd"]
    )
    assert spmd_app == ddp_app


# -- it really runs, and a hostile rank-0 host is never executed -----------------------------------------
@pytest.fixture
def fake_python(tmp_path: Path) -> Path:
    """A folder whose ``python`` only prints its argv, NUL-separated (so any byte survives)."""
    bindir = tmp_path / "fakebin"
    bindir.mkdir()
    shim = bindir / "python"
    shim.write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\0" "$a"; done\n')
    shim.chmod(shim.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return bindir


def run_replica(role: Role, bindir: Path, cwd: Path, **env: str) -> list[str]:
    replica = macros.Values(img_root=str(cwd), app_id="train-1a2b", replica_id="0").apply(role)
    out = subprocess.run(
        [replica.entrypoint, *replica.args],
        env={"PATH": f"{bindir}{os.pathsep}/usr/bin{os.pathsep}/bin", **env},
        cwd=cwd,
        capture_output=True,
        check=True,
        timeout=30,
    )
    return out.stdout.decode().split("\0")[:-1]


def test_hostile_rank0_host_and_args_arrive_verbatim_and_nothing_runs(
    fake_python: Path, tmp_path: Path
) -> None:
    marker = tmp_path / "pwned"
    hostile = f"h;$(touch {marker})`touch {marker}`\"'$IFS"
    script_args = ["--lr", f"$(touch {marker})", "a b", "*", "--", ""]
    role = only_role(materialize(ddp, ["-j", "2x3", "--script", "train.py", "--", *script_args]))
    argv = run_replica(role, fake_python, tmp_path, TSM_RANK0_HOST=hostile)
    assert argv == [
        "-m",
        "torch.distributed.run",
        "--rdzv_endpoint",
        f"{hostile}:29500",
        "--nnodes",
        "2",
        "--nproc_per_node",
        "3",
        "--rdzv_backend",
        "c10d",
        "--rdzv_id",
        "train-1a2b",
        "--max_restarts",
        "0",
        "--role",
        "ddp",
        "train.py",
        *script_args,
    ]
    assert not marker.exists()


def test_single_node_replica_runs_python_directly(fake_python: Path, tmp_path: Path) -> None:
    role = only_role(materialize(ddp, ["-j", "1x2", "-m", "pkg.train", "--", "$(x)"]))
    argv = run_replica(role, fake_python, tmp_path)
    assert argv == role.args
    assert argv[-3:] == ["-m", "pkg.train", "$(x)"]


# -- with the real torchrun ------------------------------------------------------------------------------
TORCH_SCRIPT = """
import os, sys
import torch.distributed as dist
dist.init_process_group("gloo")
t = __import__("torch").tensor([1])
dist.all_reduce(t)
out = os.path.join(sys.argv[1], f"rank{dist.get_rank()}")
with open(out, "w") as f:
    f.write(f"{dist.get_world_size()} {t.item()} {os.environ['TORCHELASTIC_RUN_ID'] != ''} {sys.argv[2]}")
dist.destroy_process_group()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.integration
@pytest.mark.torch
@pytest.mark.parametrize("j", ["1x2", "2x1"])
def test_real_torchrun(j: str, tmp_path: Path) -> None:
    """Each replica of the role, run as a scheduler would (macros applied, rank-0 host in the env), trains."""
    pytest.importorskip("torch")
    (tmp_path / "train.py").write_text(TORCH_SCRIPT)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    port = str(_free_port())
    role = only_role(
        materialize(ddp, ["-j", j, "--script", "train.py", "--rdzv_port", port, "--", str(out_dir), "$(x)"])
    )
    env = {
        **os.environ,
        "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""),
        "TSM_RANK0_HOST": "127.0.0.1",
    }
    procs = []
    for i in range(role.num_replicas):
        replica = macros.Values(img_root=str(tmp_path), app_id="train-1", replica_id=str(i)).apply(role)
        procs.append(subprocess.Popen([replica.entrypoint, *replica.args], cwd=tmp_path, env=env))
    try:
        assert [p.wait(timeout=240) for p in procs] == [0] * len(procs)
    finally:
        for p in procs:
            p.kill()
    results = sorted(f.read_text() for f in out_dir.iterdir())
    assert results == ["2 2 True $(x)", "2 2 True $(x)"]
