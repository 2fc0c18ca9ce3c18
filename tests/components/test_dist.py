"""dist.ddp and dist.spmd: -j parsing, the exact torchrun command, and that it runs without shell injection."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tsm.components import component_help, materialize
from tsm.components.dist import (
    _TORCH_DEBUG_FLAGS,
    LAUNCHER,
    TORCH_DEBUG_FLAGS,
    JobShape,
    ddp,
    get_role_name,
    parse_j,
    parse_nnodes,
    spmd,
)
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
@pytest.fixture(autouse=True)
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Run in a folder holding the scripts the tests name (a missing --script is refused at dry run)."""
    for script in ("path/train.py", "train.py", "t.py", "prog.py", "a.py"):
        (tmp_path / script).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / script).write_text("")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def launcher_args(role: Role) -> list[str]:
    """The role's arguments after ``-c LAUNCHER``: tee, host variable, port, role, then torchrun's."""
    assert role.entrypoint == "python" and role.args[:2] == ["-c", LAUNCHER]
    return role.args[2:]


def nproc(role: Role) -> str:
    args = launcher_args(role)
    return args[args.index("--nproc_per_node") + 1]


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
    assert (app.name, role.name) == ("train", "train")  # both after the script's stem, as in TorchX
    assert launcher_args(role) == [
        "3",
        "${rank0_env}",
        "1234",
        "train",
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
        "train",
        "path/train.py",
        "--lr",
        "0.1",
    ]
    assert (role.num_replicas, role.min_replicas, role.max_retries) == (2, None, 3)
    assert role.port_map == {"c10d": 1234}
    assert role.resource == Resource(cpu=2, gpu=0, memMB=1024)


def test_elastic_module_command_shape() -> None:
    app = materialize(
        ddp, ["-j", "1:3x2", "-m", "trainer.main", "--rdzv_backend", "etcd", "--rdzv_conf", "timeout=60"]
    )
    role = only_role(app)
    assert (app.name, role.name) == ("main", "main")
    assert launcher_args(role)[3:] == [
        "main",
        "--nnodes",
        "1:3",
        "--nproc_per_node",
        "2",
        "--rdzv_backend",
        "etcd",
        "--rdzv_id",
        "${app_id}",
        "--rdzv_conf",
        "timeout=60",
        "--max_restarts",
        "0",
        "--role",
        "main",
        "-m",
        "trainer.main",
    ]
    assert (role.num_replicas, role.min_replicas) == (3, 1)


def test_single_node_uses_a_standalone_rendezvous() -> None:
    role = only_role(materialize(ddp, ["-j", "1x8", "--script", "train.py", "--", "a"]))
    assert launcher_args(role) == ["3", "", "29500", "train", "--standalone", "--nnodes", "1", "--nproc_per_node",
                                   "8", "--max_restarts", "0", "--role", "train", "train.py", "a"]  # fmt: skip
    assert role.port_map == {}
    assert (role.num_replicas, role.min_replicas) == (1, None)


@pytest.mark.parametrize(
    ("name", "app_name", "experiment", "run"),
    [
        ("/", "train", "default-experiment", "train"),
        ("experiment/run", "run", "experiment", "run"),
        ("exp/", "train", "exp", "train"),
        ("/solo", "solo", "default-experiment", "solo"),
        ("plain", "plain", "default-experiment", "plain"),
    ],
)
def test_name_is_experiment_slash_run(name: str, app_name: str, experiment: str, run: str) -> None:
    app = materialize(ddp, ["--script", "path/train.py", "--name", name])
    role = only_role(app)
    assert (app.name, role.name) == (app_name, "train")
    assert role.env["TORCHX_TRACKING_EXPERIMENT_NAME"] == experiment
    assert role.env["TORCHX_TRACKING_RUN_NAME"] == run


def test_static_rendezvous_passes_the_node_rank() -> None:
    role = only_role(materialize(ddp, ["-j", "2x1", "--script", "t.py", "--rdzv_backend", "static"]))
    args = launcher_args(role)
    assert args[args.index("--node_rank") + 1] == "${replica_id}"
    replica = macros.Values(img_root="/img", app_id="t-123", replica_id="1").apply(role)
    assert replica.args[replica.args.index("--node_rank") + 1] == "1"
    c10d = launcher_args(only_role(materialize(ddp, ["-j", "2x1", "--script", "t.py"])))
    assert "--node_rank" not in c10d


@pytest.mark.parametrize(
    ("j", "shape"), [("4", JobShape(1, 4)), ("1", JobShape(1, 1)), (" 2 ", JobShape(1, 2))]
)
def test_ddp_j_alone_is_the_processes_of_one_node(j: str, shape: JobShape) -> None:
    assert parse_j(j) == shape
    role = only_role(materialize(ddp, ["-j", j, "--script", "t.py"]))
    assert (role.num_replicas, nproc(role)) == (1, str(shape.nproc_per_node))


def test_spmd_j_alone_is_the_nodes_with_a_process_per_gpu() -> None:
    role = only_role(materialize(spmd, ["-j", "2", "--script", "t.py"]))  # no -h: one process per node
    assert (role.num_replicas, nproc(role)) == (2, "1")
    gpus = get_named_resource("gpu.medium").gpu
    role = only_role(materialize(spmd, ["-j", "3", "-h", "gpu.medium", "--script", "t.py"]))
    assert (role.num_replicas, nproc(role), role.resource.gpu) == (3, str(gpus), gpus)
    with pytest.raises(
        ComponentArgumentError, match=r"cpu.small has no GPU to count processes by; give -j 2xM"
    ):
        materialize(spmd, ["-j", "2", "-h", "cpu.small", "--script", "t.py"])
    role = only_role(materialize(spmd, ["-j", "2x3", "-h", "cpu.small", "--script", "t.py"]))
    assert (role.num_replicas, nproc(role)) == (2, "3")


def test_the_macro_becomes_the_rank0_variable() -> None:
    role = only_role(materialize(ddp, ["-j", "2x1", "--script", "t.py"]))
    replica = macros.Values(img_root="/img", app_id="t-123", replica_id="1").apply(role)
    assert replica.args[3] == "TSM_RANK0_HOST"
    assert replica.args[replica.args.index("--rdzv_id") + 1] == "t-123"


def test_ddp_resources_env_image_metadata() -> None:
    argv = [
        "--script",
        "t.py",
        "--cpu",
        "8",
        "--gpu",
        "2",
        "--memMB",
        "4096",
        "--env",
        "A=1,PYTHONUNBUFFERED=0",
    ]
    app = materialize(ddp, [*argv, "--image", "/img", "--metadata", "team=ml"])
    role = only_role(app)
    assert role.resource == Resource(cpu=8, gpu=2, memMB=4096)
    assert role.image == "/img"
    assert app.metadata == {"team": "ml"}
    assert role.env == {
        "A": "1",
        "PYTHONUNBUFFERED": "0",  # the user's value wins
        "LOGLEVEL": os.environ.get("LOGLEVEL", "WARNING"),
        "TORCHX_TRACKING_EXPERIMENT_NAME": "default-experiment",
        "TORCHX_TRACKING_RUN_NAME": "t",
    }
    role = only_role(materialize(ddp, ["--script", "t.py", "-h", "gpu.medium"]))
    assert role.resource == get_named_resource("gpu.medium")


def test_debug_sets_the_torch_debug_variables() -> None:
    role = only_role(materialize(ddp, ["--script", "t.py", "--debug"]))
    assert TORCH_DEBUG_FLAGS.items() <= role.env.items()
    assert TORCH_DEBUG_FLAGS["TORCH_DISTRIBUTED_DEBUG"] == "DETAIL"
    plain = only_role(materialize(ddp, ["--script", "t.py", "--debug", "False"]))
    assert "TORCH_DISTRIBUTED_DEBUG" not in plain.env
    assert "CUDA_LAUNCH_BLOCKING" in only_role(materialize(spmd, ["--script", "t.py", "--debug"])).env


def test_mounts_are_typed() -> None:
    from tsm.specs.mounts import BindMount

    role = only_role(
        materialize(ddp, ["--script", "t.py", "--mounts", "type=bind,src=/data,dst=/mnt,readonly"])
    )
    assert role.mounts == [BindMount("/data", "/mnt", read_only=True)]
    with pytest.raises(ComponentArgumentError, match="--mounts: .*type"):
        materialize(ddp, ["--script", "t.py", "--mounts", "src=/data,dst=/mnt"])


@pytest.mark.parametrize("tee", ["0", "1", "2", "3"])
def test_tee_is_passed_to_the_launcher(tee: str) -> None:
    assert launcher_args(only_role(materialize(ddp, ["--script", "t.py", "--tee", tee])))[0] == tee


def test_bad_tee() -> None:
    with pytest.raises(ComponentArgumentError, match=r"--tee 4: use 0 \(none\)"):
        materialize(ddp, ["--script", "t.py", "--tee", "4"])


@pytest.mark.parametrize(("argv", "got"), [([], "none"), (["--script", "a.py", "-m", "b"], "--script, -m")])
def test_ddp_needs_exactly_one_of_script_or_m(argv: list[str], got: str) -> None:
    with pytest.raises(ComponentArgumentError, match=rf"give exactly one of --script or -m \(got {got}\)"):
        materialize(ddp, argv)


def test_a_missing_script_is_refused_at_dry_run(in_tmp: Path) -> None:
    with pytest.raises(
        ComponentArgumentError, match=rf"--script 'nope.py': no such file \({in_tmp}/nope.py\)"
    ):
        materialize(ddp, ["--script", "nope.py"])
    with pytest.raises(ComponentArgumentError, match="no such file"):
        materialize(spmd, ["--script", "nope.py"])
    # inside an image, or behind a variable, the script is only there at run time
    assert only_role(materialize(ddp, ["--script", "nope.py", "--image", "img:1"])).image == "img:1"
    materialize(ddp, ["--script", "${img_root}/nope.py"])


@pytest.mark.parametrize("port", ["0", "65536", "-1"])
def test_ddp_rejects_bad_ports(port: str) -> None:
    with pytest.raises(ComponentArgumentError, match="a port must be between 1 and 65535"):
        materialize(ddp, ["--script", "t.py", "-j", "2x1", f"--rdzv_port={port}"])


def test_spmd_defaults_to_one_process_on_one_node() -> None:
    app = materialize(spmd, ["--script", "prog.py", "--", "x"])
    role = only_role(app)
    assert (app.name, role.name) == ("prog", "prog")
    assert launcher_args(role) == ["3", "", "29500", "prog", "--standalone", "--nnodes", "1", "--nproc_per_node",
                                   "1", "--max_restarts", "0", "--role", "prog", "prog.py", "x"]  # fmt: skip
    assert role.resource == Resource()


def test_spmd_multi_node_is_the_ddp_launcher() -> None:
    spmd_app = materialize(spmd, ["-j", "3x2", "-m", "prog", "--max_retries", "1", "-h", "cpu.small"])
    ddp_app = materialize(ddp, ["-j", "3x2", "-m", "prog", "--max_retries", "1", "-h", "cpu.small"])
    assert spmd_app == ddp_app


def test_help_says_h_is_a_named_resource() -> None:
    text = component_help(ddp, prog="tsm run dist.ddp")
    assert "-h H, --h H" in text and "named resource" in text and "use --help" in text


# -- it really runs, and a hostile rank-0 host is never executed -----------------------------------------
@pytest.fixture
def fake_torchrun(tmp_path: Path) -> Path:
    """A folder for PYTHONPATH whose ``torch.distributed.run`` only prints its argv, NUL-separated."""
    root = tmp_path / "fake"
    (root / "torch" / "distributed").mkdir(parents=True)
    (root / "torch" / "__init__.py").write_text("")
    (root / "torch" / "distributed" / "__init__.py").write_text("")
    (root / "torch" / "distributed" / "run.py").write_text(
        "import os, sys\nos.write(1, b''.join(a.encode('utf-8', 'surrogateescape') + b'\\0' for a in sys.argv[1:]))\n"
    )
    return root


def run_replica(role: Role, fake: Path, cwd: Path, **env: str) -> list[str]:
    replica = macros.Values(img_root=str(cwd), app_id="train-1a2b", replica_id="0").apply(role)
    bindir = os.path.dirname(sys.executable)
    out = subprocess.run(
        [replica.entrypoint, *replica.args],
        env={"PATH": f"{bindir}{os.pathsep}/usr/bin{os.pathsep}/bin", "PYTHONPATH": str(fake), **env},
        cwd=cwd,
        capture_output=True,
        check=True,
        timeout=60,
    )
    return out.stdout.decode().split("\0")[:-1]


def test_hostile_rank0_host_and_args_arrive_verbatim_and_nothing_runs(
    fake_torchrun: Path, tmp_path: Path
) -> None:
    marker = tmp_path / "pwned"
    hostile = f"h;$(touch {marker})`touch {marker}`\"'$IFS"
    script_args = ["--lr", f"$(touch {marker})", "a b", "*", "--", ""]
    role = only_role(
        materialize(ddp, ["-j", "2x3", "--script", "train.py", "--tee", "0", "--", *script_args])
    )
    argv = run_replica(role, fake_torchrun, tmp_path, TSM_RANK0_HOST=hostile)
    assert argv == [
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
        "train",
        "train.py",
        *script_args,
    ]
    assert not marker.exists()


def test_an_empty_rank0_host_means_localhost(fake_torchrun: Path, tmp_path: Path) -> None:
    role = only_role(materialize(ddp, ["-j", "2x1", "--script", "train.py", "--tee", "0"]))
    assert run_replica(role, fake_torchrun, tmp_path, TSM_RANK0_HOST="")[:2] == [
        "--rdzv_endpoint",
        "localhost:29500",
    ]


def test_with_tee_torchrun_writes_per_worker_files(fake_torchrun: Path, tmp_path: Path) -> None:
    role = only_role(materialize(ddp, ["-j", "1x2", "-m", "pkg.train", "--", "$(x)"]))
    argv = run_replica(role, fake_torchrun, tmp_path)
    assert argv[:2] == ["--redirects", "3"]
    assert argv[4:7] == ["--standalone", "--nnodes", "1"]
    logs = argv[argv.index("--log-dir") + 1]
    assert argv[-3:] == ["-m", "pkg.train", "$(x)"]
    assert not os.path.exists(logs)  # the launcher removes its folder when torchrun ends


SIGNALLED_TORCHRUN = """
import os, signal, sys, time
def stop(sig, frame):
    open(os.path.join(os.environ["OUT"], "got"), "w").write(str(sig))
    sys.exit(7)
signal.signal(signal.SIGTERM, stop)
open(os.path.join(os.environ["OUT"], "ready"), "w").write(str(os.getpgrp()))
time.sleep(60)
"""


def test_the_launcher_passes_sigterm_to_torchrun_and_exits_as_it_did(
    fake_torchrun: Path, tmp_path: Path
) -> None:
    (fake_torchrun / "torch" / "distributed" / "run.py").write_text(SIGNALLED_TORCHRUN)
    role = only_role(materialize(ddp, ["-j", "1x2", "--script", "train.py"]))
    replica = macros.Values(img_root=str(tmp_path), app_id="s-1", replica_id="0").apply(role)
    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / "tmp").mkdir()
    env = {"PATH": os.path.dirname(sys.executable), "PYTHONPATH": str(fake_torchrun), "OUT": str(out),
           "TMPDIR": str(tmp_path / "tmp")}  # fmt: skip
    proc = subprocess.Popen([replica.entrypoint, *replica.args], cwd=tmp_path, env=env)
    try:
        deadline = time.monotonic() + 60
        while not (out / "ready").exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (out / "ready").read_text() != str(os.getpgid(proc.pid))  # torchrun has its own group
        proc.send_signal(signal.SIGTERM)  # to the launcher alone, as a container runtime would
        assert proc.wait(timeout=30) == 7
    finally:
        proc.kill()
    assert (out / "got").read_text() == str(int(signal.SIGTERM))
    assert list((tmp_path / "tmp").iterdir()) == []


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


TWO_WRITERS = """
import os, sys
rank = os.environ["LOCAL_RANK"]
for i in range(int(sys.argv[1])):
    print(f"rank {rank} line {i} " + "x" * 60)
print(f"rank {rank} to stderr", file=sys.stderr)
sys.stdout.write(f"rank {rank} last words without a newline")
"""


@pytest.mark.integration
@pytest.mark.torch
def test_workers_of_one_node_keep_their_lines_whole(tmp_path: Path) -> None:
    """Two unbuffered workers print 5,000 lines each on one node: every line arrives whole, once, prefixed."""
    pytest.importorskip("torch")
    (tmp_path / "writers.py").write_text(TWO_WRITERS)
    n = 5000
    role = only_role(materialize(ddp, ["-j", "1x2", "--script", "writers.py", "--", str(n)]))
    replica = macros.Values(img_root=str(tmp_path), app_id="w-1", replica_id="0").apply(role)
    (tmp_path / "tmp").mkdir()
    path = os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]
    env = {**os.environ, **replica.env, "PATH": path, "TMPDIR": str(tmp_path / "tmp")}
    out = subprocess.run(
        [replica.entrypoint, *replica.args], cwd=tmp_path, env=env, capture_output=True, timeout=240
    )
    assert out.returncode == 0, out.stderr.decode()[-2000:]
    lines = out.stdout.decode().splitlines()
    expected = {f"[writers{r}]:rank {r} line {i} " + "x" * 60 for r in (0, 1) for i in range(n)}
    expected |= {f"[writers{r}]:rank {r} last words without a newline" for r in (0, 1)}
    assert len(lines) == len(expected) and set(lines) == expected, [ln for ln in lines if ln not in expected][
        :3
    ]
    for r in (0, 1):  # each worker's lines keep their order
        mine = [ln for ln in lines if ln.startswith(f"[writers{r}]:rank {r} line ")]
        assert mine == [f"[writers{r}]:rank {r} line {i} " + "x" * 60 for i in range(n)]
    assert {f"[writers{r}]:rank {r} to stderr" for r in (0, 1)} <= set(out.stderr.decode().splitlines())
    assert list((tmp_path / "tmp").iterdir()) == []  # the launcher's log folder is gone


@pytest.mark.integration
@pytest.mark.torch
def test_ddp_on_the_local_scheduler_logs_whole_lines_per_rank(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 11: two workers per node no longer tear each other's lines in the replica's log."""
    pytest.importorskip("torch")
    from tsm.runner.api import get_runner
    from tsm.schedulers.api import Stream
    from tsm.specs.api import AppState

    (tmp_path / "writers.py").write_text(TWO_WRITERS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    n = 3000
    app = materialize(ddp, ["-j", "1x2", "--script", "writers.py", "--", str(n)])
    with get_runner() as runner:
        handle = runner.run(app, "local")
        status = runner.wait(handle, timeout=240)
        assert status is not None and status.state == AppState.SUCCEEDED, status
        lines = [ln.rstrip("\n") for ln in runner.log_lines(handle, "writers", 0, streams=Stream.STDOUT)]
    expected = {f"[writers{r}]:rank {r} line {i} " + "x" * 60 for r in (0, 1) for i in range(n)}
    expected |= {f"[writers{r}]:rank {r} last words without a newline" for r in (0, 1)}
    torn = [ln for ln in lines if ln not in expected]
    assert not torn and len(lines) == len(expected), torn[:3]


@pytest.mark.parametrize(
    ("j", "expected"), [("2x4", (2, 2, 4, "2")), ("1:3x4", (1, 3, 4, "1:3")), ("4", (1, 1, 4, "1"))]
)
def test_parse_nnodes_as_torchx(j: str, expected: tuple[int, int, int, str]) -> None:
    assert parse_nnodes(j) == expected
    with pytest.raises(ValueError, match="expected"):
        parse_nnodes("2x")


def test_get_role_name_as_torchx() -> None:
    assert (get_role_name("a/b/train.py", None), get_role_name(None, "pkg.mod.main")) == ("train", "main")
    with pytest.raises(ValueError):
        get_role_name(None, None)
    assert _TORCH_DEBUG_FLAGS is TORCH_DEBUG_FLAGS


def test_the_role_names_torch_under_the_key_the_schedulers_check() -> None:
    """dist.ddp's role says its replicas import torch, under the kit's key (written out in dist.py: importing the
    kit there would cost every component's start), so the local scheduler checks it at dry run."""
    from tsm.components.dist import NEEDS_KEY
    from tsm.schedulers.common.interpreter import NEEDS_KEY as KIT_KEY

    assert NEEDS_KEY == KIT_KEY
    [role] = ddp(script="train.py").roles
    assert role.metadata[KIT_KEY] == "torch"
