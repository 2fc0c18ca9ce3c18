"""The original TSM program, as written, runs on the local scheduler from a virtualenv that is not activated.

The seed TSM example names its scripts relative to the image directory (``.runs("train_main.py")``) and
leaves them non-executable; its trainer is an ``ElasticRole`` whose torchrun must start with an
interpreter that has torch. These tests check what the local scheduler's dry run decides for such roles
(the command it shows is the command that runs) and run the whole example end to end: parameter servers,
a reader and an elastic trainer of 4 nodes x 2 processes on real torchrun, launched by the venv's python
by absolute path under a PATH that has no ``python`` at all.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import tsm
from tsm.errors import InvalidAppError
from tsm.schedulers.local.scheduler import LocalRequest, LocalScheduler

#: A PATH with no ``python`` and no interpreter that has torch (only the system ``python3``).
BARE_PATH = "/usr/bin:/bin"

PS_MAIN = """\
import os, sys
print(f"ps {os.environ['TSM_REPLICA_ID']} of {os.environ['TSM_NUM_REPLICAS']} serving shards={os.environ['NUM_SHARDS']}")
print(f"ps interpreter {sys.executable}")
"""

READER_MAIN = """\
import os, sys
print(f"reader {os.environ['TSM_REPLICA_ID']} read {' '.join(sys.argv[1:])}")
"""

#: Each worker joins the gloo group torchrun set up and all-reduces its rank + 1: the sum is W(W+1)/2.
TRAIN_MAIN = """\
import os, sys
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
print(f"trainer rank={rank} world={world} allreduce={int(t.item())} node={os.environ['TSM_REPLICA_ID']} "
      f"lr={sys.argv[sys.argv.index('--lr') + 1]}", flush=True)
dist.destroy_process_group()
"""

#: The seed TSM example: only its import line changed (``import tsm``). It prints what it saw as JSON.
PROGRAM = """\
import json, sys
import tsm

image = sys.argv[1]
container = tsm.Container(image=image).require(tsm.Resource(cpu=1, gpu=0, memMB=256))
ps = tsm.Role("ps").runs("ps_main.py", NUM_SHARDS="4").on(container).replicas(2)
reader = tsm.Role("reader").runs("reader/reader_main.py", "--shard", "0").on(container).replicas(1)
trainer = (
    tsm.ElasticRole("trainer", nproc_per_node=2, nnodes="4")
    .runs("train_main.py", "--lr", "0.1")
    .on(container)
    .replicas(4)
)
app = tsm.Application("tsm_example").of(ps, reader, trainer)
cfg = tsm.RunConfig()
cfg.set("grace_period", 5.0)
with tsm.session("tsm_example") as session:
    handle = session.run(app, scheduler="local", cfg=cfg)
    status = session.wait(handle)
    out = {"state": status.state.name, "roles": {}, "logs": {}}
    for role in status.roles:
        out["roles"][role.role] = [r.state.name for r in role.replicas]
        for r in role.replicas:
            out["logs"][f"{role.role}/{r.id}"] = list(session.log_lines(handle, role.role, r.id))
print(json.dumps(out))
"""


def _image(root: Path) -> Path:
    """The example's image: its scripts, none of them executable (mode 0644)."""
    image = root / "image"
    (image / "reader").mkdir(parents=True)
    for rel, text in (("ps_main.py", PS_MAIN), ("reader/reader_main.py", READER_MAIN), ("train_main.py", TRAIN_MAIN)):
        (image / rel).write_text(text)
        (image / rel).chmod(0o644)
    return image


def _dryrun(app: tsm.AppDef) -> LocalRequest:
    sched = LocalScheduler("test")
    try:
        req: LocalRequest = sched.submit_dryrun(app).request
    finally:
        sched.close()
    return req


def test_non_executable_py_entrypoint_runs_with_the_launching_interpreter(tmp_path: Path) -> None:
    image = _image(tmp_path)
    (image / "tool.py").write_text("#!/bin/sh\necho tool\n")
    (image / "tool.py").chmod(0o755)
    container = tsm.Container(image=str(image))
    app = tsm.Application("a").of(
        tsm.Role("ps").runs("ps_main.py", "--x", "1").on(container),
        tsm.Role("reader").runs("reader/reader_main.py").on(container),
        tsm.Role("tool").runs("tool.py", "y").on(container),
    )
    roles = {r.name: r for r in _dryrun(app).roles}
    assert roles["ps"].replicas[0].cmd == [sys.executable, str(image / "ps_main.py"), "--x", "1"]
    assert roles["reader"].replicas[0].cmd == [sys.executable, str(image / "reader" / "reader_main.py")]
    # an executable script runs itself (its own #! line), found on PATH through the image directory
    assert roles["tool"].replicas[0].cmd == ["tool.py", "y"]


def test_missing_py_entrypoint_is_still_refused(tmp_path: Path) -> None:
    image = _image(tmp_path)
    app = tsm.Application("a").of(tsm.Role("ps").runs("nope_main.py").on(tsm.Container(image=str(image))))
    with pytest.raises(InvalidAppError, match="entrypoint 'nope_main.py' is not an executable file"):
        _dryrun(app)


def test_replica_path_puts_the_launching_interpreter_before_the_callers_path(tmp_path: Path) -> None:
    image = _image(tmp_path)
    container = tsm.Container(image=str(image))
    app = tsm.Application("a").of(
        tsm.Role("plain").runs("ps_main.py").on(container),
        tsm.Role("own").runs("ps_main.py", PATH="/opt/x/bin:/bin").on(container),
    )
    roles = {r.name: r for r in _dryrun(app).roles}
    bindir = os.path.dirname(sys.executable)
    assert roles["plain"].replicas[0].env["PATH"].split(os.pathsep)[:2] == [str(image), bindir]
    assert roles["plain"].replicas[0].env["PATH"].endswith(os.environ["PATH"])
    # a role that sets PATH gets exactly its own after the image directory
    assert roles["own"].replicas[0].env["PATH"] == os.pathsep.join([str(image), "/opt/x/bin:/bin"])


def test_elastic_role_dryrun_resolves_python_to_the_launching_interpreter(tmp_path: Path) -> None:
    image = _image(tmp_path)
    trainer = tsm.ElasticRole("trainer", nproc_per_node=2, nnodes="4").runs("train_main.py")
    app = tsm.Application("a").of(trainer.on(tsm.Container(image=str(image))).replicas(4))
    rep = _dryrun(app).roles[0].replicas[0]
    # the ``python`` its shell script execs is the interpreter running this test
    found = shutil.which("python", path=rep.env["PATH"])
    assert found is not None and os.path.samefile(found, sys.executable)


@pytest.mark.torch
@pytest.mark.integration
def test_original_tsm_program_from_an_unactivated_venv(tmp_path: Path) -> None:
    image = _image(tmp_path)
    program = tmp_path / "tsm_example.py"
    program.write_text(PROGRAM)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    env["PATH"] = BARE_PATH
    # the precondition: nothing on this PATH is a python with torch
    probe = subprocess.run(["sh", "-c", "command -v python"], env=env, capture_output=True, text=True)
    assert probe.returncode != 0, probe.stdout
    venv_python = str(Path(sys.executable).absolute())
    proc = subprocess.run(
        [venv_python, str(program), str(image)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=420
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    logs = "\n".join(f"{k}: {''.join(v)}" for k, v in out["logs"].items())
    assert out["state"] == "SUCCEEDED", logs[-6000:]
    assert out["roles"] == {"ps": ["SUCCEEDED"] * 2, "reader": ["SUCCEEDED"], "trainer": ["SUCCEEDED"] * 4}
    assert any("ps 1 of 2 serving shards=4" in line for line in out["logs"]["ps/1"])
    assert any(f"ps interpreter {venv_python}" in line for line in out["logs"]["ps/0"])
    assert any("reader 0 read --shard 0" in line for line in out["logs"]["reader/0"])
    # a node's two workers share its stdout, and PYTHONUNBUFFERED (dist.ddp sets it) makes print() write the
    # text and its newline apart, so two reports can share a line: find each report wherever it is
    reports = [
        m.group(0)
        for k in range(4)
        for line in out["logs"][f"trainer/{k}"]
        for m in re.finditer(r"trainer rank=\d+ world=\d+ allreduce=\S+? node=\S+ lr=\d+(\.\d+)?", line)
    ]
    # every one of the 8 workers (4 nodes x 2) joined the same group and got the full sum 1+..+8 = 36
    assert len(reports) == 8, logs[-6000:]
    ranks = sorted(int(r.split()[1].removeprefix("rank=")) for r in reports)
    assert ranks == list(range(8))
    assert all("world=8 allreduce=36" in r and "lr=0.1" in r for r in reports), reports
    nodes = sorted(r.split("node=")[1].split()[0] for r in reports)
    assert nodes == ["0", "0", "1", "1", "2", "2", "3", "3"]
