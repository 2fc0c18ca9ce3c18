"""The docker scheduler on the real engine of ``scripts/docker-up``: what the contract does not cover.

Images are the locally built ``tsm-test/python`` (busybox + python3) and ``tsm-test/torch`` (+ CPU torch).
"""

from __future__ import annotations

import json
import subprocess
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from integration.docker_engine import PYTHON_IMAGE, TORCH_IMAGE, DockerEngine
from tsm.errors import InvalidAppError, SchedulerUnavailableError
from tsm.schedulers.api import Stream
from tsm.schedulers.docker.scheduler import DockerScheduler
from tsm.specs.api import AppDef, AppState, Resource, RetryPolicy, Role
from tsm.specs.mounts import BindMount

pytestmark = [pytest.mark.integration, pytest.mark.docker]

HANG = 240.0
SMALL = Resource(cpu=1, memMB=256)


@pytest.fixture
def sched(docker_engine: DockerEngine) -> Iterator[DockerScheduler]:
    s = DockerScheduler("itest")
    yield s
    s.cleanup(include_running=True, session="itest")
    s.close()


def docker(*args: str) -> str:
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=True).stdout


def left_behind(app_id: str) -> tuple[str, str]:
    """The ids of containers and networks Docker still has for ``app_id``."""
    return (docker("ps", "-aq", "--filter", f"label=tsm.app-id={app_id}").strip(),
            docker("network", "ls", "-q", "--filter", f"label=tsm.app-id={app_id}").strip())


def sh(name: str, script: str, **kw: Any) -> Role:
    kw.setdefault("resource", SMALL)
    return Role(name, image=PYTHON_IMAGE, entrypoint="sh", args=["-c", script], **kw)


def ended(s: DockerScheduler, app_id: str) -> Any:
    desc = s.wait(app_id, timeout=HANG)
    assert desc is not None and desc.state.is_terminal, desc
    return desc


def test_sh_output_is_exact_and_streams_are_separate(sched: DockerScheduler) -> None:
    script = "echo 'hello world'; echo oops >&2; printf 'a\\tb\\n'; echo tail >&2; printf 'no newline'"
    app_id = sched.submit(AppDef("echo", [sh("r", script)]))
    assert ended(sched, app_id).state == AppState.SUCCEEDED
    assert list(sched.log_iter(app_id, "r", 0, streams=Stream.STDOUT)) == ["hello world\n", "a\tb\n", "no newline"]
    assert list(sched.log_iter(app_id, "r", 0, streams=Stream.STDERR)) == ["oops\n", "tail\n"]
    combined = list(sched.log_iter(app_id, "r", 0))
    assert sorted(combined) == sorted(["hello world\n", "a\tb\n", "no newline", "oops\n", "tail\n"])
    assert list(sched.log_iter(app_id, "r", 0, regex="^t")) == ["tail\n"]


def test_two_roles_reach_each_other_by_name(sched: DockerScheduler) -> None:
    server = (
        "import socket; s = socket.socket(); s.bind(('', 7000)); s.listen(); c, _ = s.accept(); "
        "c.sendall(b'pong from ' + socket.gethostname().encode()); c.close()"
    )
    client = (
        "import os, socket, time\n"
        "for _ in range(100):\n"
        "    try:\n"
        "        c = socket.create_connection(('server-0', 7000)); break\n"
        "    except OSError:\n"
        "        time.sleep(0.1)\n"
        "print(c.recv(100).decode(), os.environ['TSM_RANK0_HOST'])"
    )
    app = AppDef("pair", [
        Role("server", image=PYTHON_IMAGE, entrypoint="python3", args=["-c", server], resource=SMALL),
        Role("client", image=PYTHON_IMAGE, entrypoint="python3", args=["-c", client], resource=SMALL),
    ])
    app_id = sched.submit(app)
    assert ended(sched, app_id).state == AppState.SUCCEEDED
    assert "".join(sched.log_iter(app_id, "client", 0)) == "pong from server-0 server-0\n"


ALLREDUCE = textwrap.dedent(
    """\
    import os, torch, torch.distributed as dist
    dist.init_process_group("gloo")
    r, w = dist.get_rank(), dist.get_world_size()
    t = torch.tensor([float(r + 1)])
    dist.all_reduce(t)
    print(f"rank={r} world={w} allreduce={t.item()} host={os.uname().nodename}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    """
)


@pytest.mark.torch
def test_dist_ddp_all_reduces_across_two_containers(sched: DockerScheduler, tmp_path: Path) -> None:
    from integration.docker_engine import unavailable
    from tsm.components.dist import ddp

    if subprocess.run(["docker", "image", "inspect", TORCH_IMAGE], capture_output=True).returncode != 0:
        unavailable(f"no {TORCH_IMAGE} image (scripts/docker-up builds it from the venv's torch: make test installs it)")
    script = tmp_path / "allreduce.py"
    script.write_text(ALLREDUCE)
    app = ddp(script=str(script), image=TORCH_IMAGE, j="2x1", cpu=1, memMB=2000, env={"OMP_NUM_THREADS": "1"},
              mounts=[f"type=bind,src={tmp_path},dst={tmp_path},readonly"])
    app_id = sched.submit(app)
    desc = ended(sched, app_id)
    role = app.roles[0].name
    logs = {k: "".join(sched.log_iter(app_id, role, k)) for k in range(2)}
    assert desc.state == AppState.SUCCEEDED, (desc, logs)
    lines = [ln.split("]:", 1)[-1] for text in logs.values() for ln in text.splitlines() if "allreduce=" in ln]
    assert sorted(lines) == [f"rank={r} world=2 allreduce=3.0 host={role}-{r}" for r in range(2)], logs


def test_replica_retries_use_docker_restart_policy(sched: DockerScheduler, tmp_path: Path) -> None:
    marker = tmp_path / "attempts"
    role = sh("r", f"echo x >> {marker}; echo attempt $(wc -l < {marker}); [ $(wc -l < {marker}) -ge 3 ]",
              max_retries=2, retry_policy=RetryPolicy.REPLICA, mounts=[BindMount(str(tmp_path), str(tmp_path))])
    info = sched.submit_dryrun(AppDef("rr", [role]))
    assert "--restart on-failure:2" in str(info)
    app_id = sched.schedule(info)
    # a follow goes on across Docker's restarts of the container, each line once
    assert list(sched.log_iter(app_id, "r", 0, should_tail=True)) == [f"attempt {i}\n" for i in (1, 2, 3)]
    desc = ended(sched, app_id)
    assert desc.state == AppState.SUCCEEDED, desc
    assert marker.read_text() == "x\nx\nx\n"
    assert desc.roles_statuses[0].replicas[0].restarts == 2  # Docker's RestartCount
    assert docker("inspect", "-f", "{{.RestartCount}}", f"{app_id}-r-0").strip() == "2"


def test_application_retries_recreate_every_container(sched: DockerScheduler, tmp_path: Path) -> None:
    marker = tmp_path / "attempts"
    ready = tmp_path / "good-printed"
    mount = [BindMount(str(tmp_path), str(tmp_path))]
    app = AppDef("ar", [
        # bad fails (once) only after good has printed, so each attempt of good has its line
        sh("bad", f"until [ -e {ready} ]; do sleep 0.05; done; echo x >> {marker}; [ $(wc -l < {marker}) -ge 2 ]",
           max_retries=1, mounts=mount),
        sh("good", f"echo attempt $TSM_APP_ID; touch {ready}; sleep 1", mounts=mount),
    ])
    app_id = sched.submit(app)
    desc = ended(sched, app_id)
    assert desc.state == AppState.SUCCEEDED, desc
    assert desc.num_restarts >= 1
    assert marker.read_text() == "x\nx\n"
    # the first attempt's logs were snapshotted before its container was replaced: both attempts read
    assert "".join(sched.log_iter(app_id, "good", 0)) == f"attempt {app_id}\n" * 2


def test_role_retries_stop_at_max_retries(sched: DockerScheduler) -> None:
    app_id = sched.submit(AppDef("rf", [sh("r", "exit 7", max_retries=1, retry_policy=RetryPolicy.ROLE)]))
    desc = ended(sched, app_id)
    assert desc.state == AppState.FAILED
    assert desc.roles_statuses[0].replicas[0].exit_code == 7
    assert docker("inspect", "-f", '{{index .Config.Labels "tsm.attempt"}}', f"{app_id}-r-0").strip() == "1"


def test_missing_image_with_pull_never_fails_clearly(sched: DockerScheduler) -> None:
    role = Role("r", image="tsm-test/no-such-image:1", entrypoint="true", resource=SMALL)
    start = time.monotonic()
    app_id = sched.submit(AppDef("noimg", [role]), {"pull": "never"})
    desc = ended(sched, app_id)
    assert desc.state == AppState.FAILED
    assert "tsm-test/no-such-image:1" in desc.msg and "pull=never" in desc.msg
    assert time.monotonic() - start < HANG
    assert left_behind(app_id) == ("", "")


def test_failed_pull_is_a_clear_failure(sched: DockerScheduler) -> None:
    role = Role("r", image="tsm-test/no-such-image:1", entrypoint="true", resource=SMALL)
    app_id = sched.submit(AppDef("nopull", [role]), {"pull": "missing"})
    desc = ended(sched, app_id)
    assert desc.state == AppState.FAILED and "pulling image 'tsm-test/no-such-image:1' failed" in desc.msg, desc
    # pull=always never runs a local copy silently: no registry answers here, so the app fails saying so
    role = Role("r", image=PYTHON_IMAGE, entrypoint="true", resource=SMALL)
    app_id = sched.submit(AppDef("always", [role]), {"pull": "always"})
    desc = ended(sched, app_id)
    assert desc.state == AppState.FAILED and f"pulling image '{PYTHON_IMAGE}' failed (pull=always)" in desc.msg, desc
    assert left_behind(app_id) == ("", "")


def test_out_of_memory_is_failed_with_the_reason(sched: DockerScheduler) -> None:
    hog = "x = []\nwhile True: x.append(bytearray(8 << 20))"
    role = Role("r", image=PYTHON_IMAGE, entrypoint="python3", args=["-c", hog], resource=Resource(cpu=1, memMB=64))
    app_id = sched.submit(AppDef("oom", [role]))
    desc = ended(sched, app_id)
    assert desc.state == AppState.FAILED
    assert "out of memory" in desc.msg, desc
    assert "out of memory" in desc.roles_statuses[0].replicas[0].error_msg


def test_cancel_leaves_no_container_and_no_network_and_keeps_logs(sched: DockerScheduler) -> None:
    app = AppDef("stop", [sh("r", "echo started; exec sleep 600", num_replicas=2)])
    app_id = sched.submit(app)
    deadline = time.monotonic() + HANG
    while "started" not in "".join(sched.log_iter(app_id, "r", 1)):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    sched.cancel(app_id)
    assert left_behind(app_id) == ("", "")
    desc = sched.describe(app_id)
    assert desc is not None and desc.state == AppState.CANCELLED
    assert "".join(sched.log_iter(app_id, "r", 1)) == "started\n"  # from the snapshot: the container is gone
    assert [r.app_id for r in sched.list()].count(app_id) == 1


def test_finished_containers_are_kept_until_removed(sched: DockerScheduler) -> None:
    app_id = sched.submit(AppDef("keep", [sh("r", "echo kept")]))
    assert ended(sched, app_id).state == AppState.SUCCEEDED
    assert left_behind(app_id)[0]  # retained: docker inspect / docker logs still work
    assert sched.remove(app_id)
    assert left_behind(app_id) == ("", "")
    assert sched.describe(app_id) is None


def test_remove_finished_removes_at_the_end_and_keeps_logs(sched: DockerScheduler) -> None:
    app_id = sched.submit(AppDef("rm", [sh("r", "echo bye")]), {"remove_finished": True})
    assert ended(sched, app_id).state == AppState.SUCCEEDED
    assert left_behind(app_id) == ("", "")
    assert "".join(sched.log_iter(app_id, "r", 0)) == "bye\n"
    desc = sched.describe(app_id)
    assert desc is not None and desc.state == AppState.SUCCEEDED


def test_cleanup_removes_what_a_crashed_launcher_left(docker_engine: DockerEngine) -> None:
    """A launcher killed after starting an app: its containers run on; cleanup --all removes them."""
    code = (
        "import sys; from tsm.schedulers.docker.scheduler import DockerScheduler; from tsm.specs.api import *\n"
        f"s = DockerScheduler('crash'); print(s.submit(AppDef('orphan', [Role('r', image='{PYTHON_IMAGE}', "
        "entrypoint='sleep', args=['600'])])), flush=True)\nimport os; os._exit(9)"
    )
    proc = subprocess.run([__import__("sys").executable, "-c", code], capture_output=True, text=True)
    app_id = proc.stdout.strip()
    assert proc.returncode == 9 and left_behind(app_id)[0], proc.stderr
    s = DockerScheduler("other")
    assert app_id in s.cleanup(include_running=True, session="crash")
    assert left_behind(app_id) == ("", "")


def test_list_has_one_row_per_app(sched: DockerScheduler) -> None:
    app_id = sched.submit(AppDef("rows", [sh("a", "sleep 600", num_replicas=3), sh("b", "sleep 600")]))
    rows = [r for r in sched.list() if r.app_id == app_id]
    assert len(rows) == 1 and rows[0].state == AppState.RUNNING


def test_one_list_call_serves_many_describes(sched: DockerScheduler) -> None:
    ids = [sched.submit(AppDef("many", [sh("r", "sleep 600", num_replicas=2)])) for _ in range(3)]
    sched.describe(ids[0])  # ended containers of other apps on a shared engine are inspected once, here
    before = dict(sched.client.calls)
    for _ in range(5):
        for app_id in ids:
            assert sched.describe(app_id) is not None
        time.sleep(0.3)
    lists = sched.client.calls.get("list", 0) - before.get("list", 0)
    assert lists <= 5, sched.client.calls
    assert sched.client.calls.get("inspect", 0) == before.get("inspect", 0)  # running: nothing inspected


def test_follow_reads_until_the_container_ends(sched: DockerScheduler) -> None:
    app_id = sched.submit(AppDef("f", [sh("r", "for i in 1 2 3; do echo line $i; sleep 0.3; done")]))
    assert list(sched.log_iter(app_id, "r", 0, should_tail=True)) == ["line 1\n", "line 2\n", "line 3\n"]


def test_unreachable_engine_says_how_to_start_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no.sock")
    s = DockerScheduler("x")
    with pytest.raises(SchedulerUnavailableError, match="docker-up"):
        s.describe("whatever-00000000")


def test_gpus_are_refused_without_gpus(sched: DockerScheduler) -> None:
    from tsm.schedulers.docker.scheduler import has_gpus

    if has_gpus():
        pytest.skip("this host has GPUs")
    role = Role("r", image=PYTHON_IMAGE, entrypoint="true", resource=Resource(cpu=1, gpu=1, memMB=100))
    with pytest.raises(InvalidAppError, match="GPU"):
        sched.submit_dryrun(AppDef("gpu", [role]))


# -- workspaces ------------------------------------------------------------------------------------------


def _all_workspace_images() -> list[str]:
    return docker("images", "--format", "{{.Repository}}:{{.Tag}}", "tsm-workspace").split()


def test_workspace_builds_once_and_rebuilds_on_change(docker_engine: DockerEngine, tmp_path: Path) -> None:
    from tsm.runner.api import Runner

    ws = tmp_path / "ws"
    ws.mkdir()
    token = uuid.uuid4().hex  # a workspace no earlier run (on this engine's image cache) can have built
    (ws / "main.py").write_text(f"print('v1 {token}')\n")
    (ws / "big.bin").write_bytes(b"\0" * 1000)
    (ws / ".tsmignore").write_text("big.bin\n")
    (ws / "secret.txt").write_text("not for the image")
    (ws / ".dockerignore").write_text("secret.txt\n")
    s = DockerScheduler("itest")
    runner = Runner("ws", scheduler_factories={"docker": lambda *a, **k: s})
    role = Role("r", image=PYTHON_IMAGE, entrypoint="python3", args=["main.py"], resource=SMALL)
    mine: set[str] = set()  # the tags this test's dry runs name: other tests (other runs) build theirs meanwhile

    def _workspace_images() -> list[str]:
        return [tag for tag in _all_workspace_images() if tag in mine]

    def run() -> tuple[str, str]:
        info = runner.dryrun(AppDef("ws", [role]), "docker", workspace=str(ws))
        mine.update(w for w in str(info).split() if w.startswith("tsm-workspace:"))
        handle = runner.schedule(info)
        status = runner.wait(handle, timeout=HANG)
        assert status is not None and status.state == AppState.SUCCEEDED, status
        app_id = handle.rsplit("/", 1)[-1]
        return str(info), "".join(s.log_iter(app_id, "r", 0))

    try:
        before = set(_all_workspace_images())
        printed, out = run()
        assert out == f"v1 {token}\n" and "workspace of role 'r': build" in printed
        built = set(_workspace_images()) - before
        assert len(built) == 1
        assert docker("run", "--rm", "--entrypoint", "ls", *built, "-A", "/workspace").split() == [".tsmignore", "main.py"]
        # .tsmignore kept big.bin out of the snapshot, .dockerignore kept secret.txt (and itself) out of the image
        builds = s.images.calls.get("build", 0)
        printed, out = run()  # unchanged: no build at all
        assert "reuse (unchanged workspace, no build)" in printed and out == f"v1 {token}\n"
        assert s.images.calls.get("build", 0) == builds and set(_workspace_images()) - before == built
        (ws / "main.py").write_text(f"print('v2 {token}')\n")
        printed, out = run()
        assert "workspace of role 'r': build" in printed and out == f"v2 {token}\n"
        assert s.images.calls.get("build", 0) == builds + 1 and len(set(_workspace_images()) - before) == 2
    finally:
        s.cleanup(include_running=True, session="itest")
        new = set(_workspace_images()) - before
        if new:
            docker("rmi", "-f", *new)


def test_dockerfile_tsm_is_used(docker_engine: DockerEngine, tmp_path: Path) -> None:
    ws = tmp_path / "ws2"
    ws.mkdir()
    (ws / "Dockerfile.tsm").write_text(f"FROM {PYTHON_IMAGE}\nCOPY . /app\nENV FROM_DOCKERFILE={tmp_path.name}\n")
    s = DockerScheduler("itest")
    role = Role("r", image=PYTHON_IMAGE, entrypoint="sh", args=["-c", "echo $FROM_DOCKERFILE; ls /app"],
                resource=SMALL)
    s.build_workspace_and_update_role(role, str(ws), {})
    app_id = s.submit(AppDef("df", [role]))
    try:
        assert ended(s, app_id).state == AppState.SUCCEEDED
        assert "".join(s.log_iter(app_id, "r", 0)) == f"{tmp_path.name}\nDockerfile.tsm\n"
    finally:
        s.cleanup(include_running=True, session="itest")
        docker("rmi", "-f", role.image)


def test_docker_inspect_matches_the_request(sched: DockerScheduler, tmp_path: Path) -> None:
    vol = f"tsm-itest-{tmp_path.name}".lower()
    role = sh("r", "sleep 600", resource=Resource(cpu=1, memMB=300),
              mounts=[BindMount(str(tmp_path), "/data", read_only=True)])
    from tsm.specs.mounts import VolumeMount

    role.mounts.append(VolumeMount(vol, "/vol"))
    app_id = sched.submit(AppDef("res", [role]), {"shm_fraction": 0.25})
    try:
        held = json.loads(docker("inspect", f"{app_id}-r-0"))[0]["HostConfig"]
        assert held["NanoCpus"] == 10**9 and held["Memory"] == 300 << 20 and held["ShmSize"] == 75 << 20
        mounts = {(m["Type"], m["Target"], m.get("ReadOnly", False)) for m in held["Mounts"]}
        assert mounts == {("bind", "/data", True), ("volume", "/vol", False)}
    finally:
        sched.cancel(app_id)
        subprocess.run(["docker", "volume", "rm", vol], capture_output=True)


@pytest.mark.parametrize("removed", [False, True], ids=["live", "snapshot"])
def test_logs_since_and_until(sched: DockerScheduler, removed: bool) -> None:
    from datetime import datetime, timezone

    script = "echo early; echo early-err >&2; sleep 2; echo late; echo late-err >&2; sleep 2; echo last"
    app_id = sched.submit(AppDef("win", [sh("r", script)]), {"remove_finished": removed})
    assert ended(sched, app_id).state == AppState.SUCCEEDED
    assert bool(left_behind(app_id)[0]) is not removed  # read from Docker, or from the snapshot in $TSM_HOME
    lines = "".join(sched.log_iter(app_id, "r", 0))
    assert sorted(lines.splitlines()) == sorted(["early", "early-err", "late", "late-err", "last"])
    # a window around the middle lines, from Docker's own timestamps of each line
    if removed:
        snap = next((sched.app_dir(app_id).path / "logs").glob("*/attempt-0"))
        stamped = (snap / "stdout.ts").read_bytes() + (snap / "stderr.ts").read_bytes()
    else:
        stamped = sched.client.logs(f"{app_id}-r-0", True, True, timestamps=True)
    when = {}
    for raw in stamped.decode().splitlines():
        ts, _, text = raw.partition(" ")
        base, _, frac = ts.rstrip("Z").partition(".")
        when[text] = datetime.fromisoformat(base).replace(tzinfo=timezone.utc).timestamp() + float("0." + frac[:6])
    since = datetime.fromtimestamp(when["early-err"] + 1, tz=timezone.utc)
    until = datetime.fromtimestamp(when["late-err"] + 1, tz=timezone.utc)
    got = list(sched.log_iter(app_id, "r", 0, since=since, until=until))
    assert sorted(got) == ["late\n", "late-err\n"]
    assert list(sched.log_iter(app_id, "r", 0, since=since, until=until, streams=Stream.STDERR)) == ["late-err\n"]


def test_cleanup_command_removes_orphan_networks(docker_engine: DockerEngine) -> None:
    """A launcher killed between creating the network and its first container leaves a bare network."""
    import sys

    from tsm.schedulers.common.owner import owner
    from tsm.schedulers.docker import scheduler

    name = f"tsm-orphan-{time.time_ns()}"
    docker("network", "create", "--label", "tsm.scheduler=docker", "--label", f"tsm.app-id={name[4:]}",
           "--label", f"tsm.owner={owner()}", name)
    other = f"tsm-orphan-{time.time_ns()}"  # another user's: never removed by this user's cleanup
    docker("network", "create", "--label", "tsm.scheduler=docker", "--label", f"tsm.app-id={other[4:]}",
           "--label", "tsm.owner=someone-else", other)
    DockerScheduler("x").cleanup()
    assert docker("network", "ls", "-q", "--filter", f"name={name}").strip()  # young: its launcher may be busy
    code = "from tsm.schedulers.docker import scheduler, __main__ as m; scheduler.ORPHAN_AGE = 0; m.main(['cleanup'])"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert docker("network", "ls", "-q", "--filter", f"name={name}").strip() == ""
    assert docker("network", "ls", "-q", "--filter", f"name={other}").strip()
    docker("network", "rm", other)
    assert scheduler.ORPHAN_AGE == 60.0
    bad = subprocess.run([sys.executable, "-m", "tsm.schedulers.docker", "sweep"], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.startswith("usage:")
