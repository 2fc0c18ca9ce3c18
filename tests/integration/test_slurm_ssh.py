"""Slurm from another machine over SSH, against a real OpenSSH server in front of the real Slurm cluster.

The server is ``scripts/sshd-up``'s (fixture ``ssh_server``): key authentication only, its own host key
and known_hosts, user ``tsmssh``, on the host of ``scripts/slurm-up``'s cluster. Everything tsm reads about
a remote app comes through the connection: the job directories are in ``tsmssh``'s home.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from testutil import wait_until
from tsm.schedulers.common.ssh import SshConnection, SshHostKeyError, SshTarget, SshUnreachableError
from tsm.schedulers.slurm import SlurmScheduler, create_scheduler, programs, ssh_host as ssh_mod
from tsm.schedulers.slurm.ssh_host import RemoteRecord, SshHost
from tsm.specs.api import AppDef, AppState, Role

from .conftest import SshServer

pytestmark = [pytest.mark.integration, pytest.mark.slurm]


@pytest.fixture
def sched() -> SlurmScheduler:
    return create_scheduler("it")


def bash_role(name: str, script: str, n: int = 1) -> Role:
    return Role(name=name, entrypoint="bash", args=["-c", script], num_replicas=n)


def run_app(sched: SlurmScheduler, app: AppDef, cfg: dict[str, object]) -> str:
    return sched.schedule(sched.submit_dryrun(app, cfg))  # type: ignore[arg-type]


def test_two_role_app_through_ssh_with_byte_exact_logs(sched: SlurmScheduler, ssh_server: SshServer) -> None:
    app = AppDef(
        name="ssh2",
        roles=[
            bash_role("a", r"""printf 'a %s $(not run) "q"\n' "$TSM_REPLICA_ID"; printf 'x\xffy\n'; printf 'e%s\n' "$TSM_REPLICA_ID" >&2; printf 'tail'""", n=2),
            bash_role("b", "echo b; echo \"$HOME\""),
        ],
    )
    app_id = run_app(sched, app, ssh_server.cfg())
    assert app_id.startswith("tsmssh_127.0.0.1_2222-")
    desc = sched.wait(app_id, timeout=120)
    assert desc is not None and desc.state == AppState.SUCCEEDED, desc
    assert {(r.role, r.id): r.state for rs in desc.roles_statuses for r in rs.replicas} == {
        ("a", 0): AppState.SUCCEEDED, ("a", 1): AppState.SUCCEEDED, ("b", 0): AppState.SUCCEEDED}
    assert all(r.hostname.startswith("node") for rs in desc.roles_statuses for r in rs.replicas)
    for k in (0, 1):
        assert list(sched.log_iter(app_id, "a", k)) == [
            f'a {k} $(not run) "q"\n', "x\udcffy\n", "tail", f"e{k}\n"]
    home = subprocess.run(["getent", "passwd", ssh_server.user], capture_output=True, text=True).stdout.split(":")[5]
    assert list(sched.log_iter(app_id, "b", 0)) == ["b\n", f"{home}\n"]
    rec = RemoteRecord.load(app_id)
    assert rec is not None and rec.job_dir.startswith(f"{home}/.tsm/slurm/jobs/ssh2-")
    assert not Path(rec.job_dir).exists() or os.stat(rec.job_dir).st_uid != os.getuid()  # files are the remote user's
    assert any(r.app_id == app_id and r.state == AppState.SUCCEEDED for r in sched.list())
    views = sched.view_snapshot([app_id])
    assert [v.app_id for v in views] == [app_id] and views[0].state == "SUCCEEDED"
    # a regex and a window work remotely too
    assert list(sched.log_iter(app_id, "a", 1, regex="^e")) == ["e1\n"]
    assert sched.remove(app_id) and sched.describe(app_id) is None


def test_follow_survives_killed_connections_with_no_line_lost_or_repeated(
    sched: SlurmScheduler, ssh_server: SshServer
) -> None:
    n = 150
    app = AppDef(name="sshfollow", roles=[bash_role("w", f"for i in $(seq 1 {n}); do echo line $i; sleep 0.04; done")])
    app_id = run_app(sched, app, ssh_server.cfg())
    got: list[str] = []
    killed: list[int] = []

    def killer() -> None:
        while len(got) < 20:
            time.sleep(0.05)
        killed.append(ssh_server.kill_sessions())
        while len(got) < 80:
            time.sleep(0.05)
        killed.append(ssh_server.kill_sessions())

    t = threading.Thread(target=killer, daemon=True)
    t.start()
    for line in sched.log_iter(app_id, "w", 0, should_tail=True):
        got.append(line)
    t.join(timeout=10)
    assert killed and all(k > 0 for k in killed), killed  # the connection was really cut, twice
    assert got == [f"line {i}\n" for i in range(1, n + 1)]


def test_changed_or_unknown_host_key_is_refused(sched: SlurmScheduler, ssh_server: SshServer, tmp_path: Path) -> None:
    other = tmp_path / "otherkey"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    changed = tmp_path / "known_changed"
    changed.write_text(f"[127.0.0.1]:2222 {' '.join(other.with_suffix('.pub').read_text().split()[:2])}\n")
    unknown = tmp_path / "known_empty"
    unknown.write_text("")
    app = AppDef(name="k", roles=[bash_role("r", "true")])
    for known, what in ((changed, "CHANGED"), (unknown, "not in known_hosts")):
        cfg = ssh_server.cfg(ssh_options=[f"UserKnownHostsFile {known}", f"IdentityFile {ssh_server.key}"])
        with pytest.raises(SshHostKeyError, match=what) as e:
            run_app(sched, app, cfg)
        assert "\n" not in str(e.value)
    assert changed.read_text().count("\n") == 1 and unknown.read_text() == ""  # nothing was accepted


def test_host_not_answering_is_one_line_and_exit_code_1(ssh_server: SshServer, tmp_path: Path) -> None:
    with pytest.raises(SshUnreachableError, match="does not answer"):
        run_app(create_scheduler("it"), AppDef(name="u", roles=[bash_role("r", "true")]),
                ssh_server.cfg(ssh="tsmssh@127.0.0.1:1"))
    proc = subprocess.run(
        [sys.executable, "-m", "tsm.cli.main", "run", "-s", "slurm", "-c", "ssh=tsmssh@127.0.0.1:1", "utils.echo"],
        capture_output=True, text=True, timeout=60, env={**os.environ, "TSM_HOME": str(tmp_path / "home")},
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and "does not answer" in proc.stderr, proc.stderr


def test_submission_whose_connection_dies_after_sbatch_is_not_repeated(
    sched: SlurmScheduler, ssh_server: SshServer, tmp_path: Path
) -> None:
    """The client's ssh reports a dropped connection after the remote sbatch ran: one job, found again."""
    marker = tmp_path / "dropped"
    wrapper = tmp_path / "ssh"
    wrapper.write_text(
        "#!/bin/bash\n"
        f'if [ ! -e {marker} ] && [[ "${{@: -1}}" == *tsm-submit* ]]; then\n'
        f"  : >{marker}; ssh \"$@\" >/dev/null 2>&1\n"
        '  echo "Connection to 127.0.0.1 closed by remote host." >&2; exit 255\n'
        "fi\n"
        'exec ssh "$@"\n'
    )
    wrapper.chmod(0o755)
    opts = tuple(ssh_mod.parse_ssh_options(ssh_server.options))
    key = (ssh_server.target, opts)
    conn = SshConnection(SshTarget.parse(ssh_server.target), opts, ssh=str(wrapper))
    ssh_mod._hosts[key] = SshHost(conn, ssh_server.target, opts)
    try:
        app = AppDef(name="once", roles=[bash_role("r", "echo once")])
        app_id = run_app(sched, app, ssh_server.cfg())
    finally:
        del ssh_mod._hosts[key]
    assert marker.exists()  # the connection did "drop" after sbatch
    rec = RemoteRecord.load(app_id)
    assert rec is not None
    desc = sched.wait(app_id, timeout=120)
    assert desc is not None and desc.state == AppState.SUCCEEDED
    # exactly one job ran from that job directory
    found = SshConnection(SshTarget.parse(ssh_server.target), opts).run(["sh", "-c", programs.text("find.sh")])
    ids = {line.split("|")[0] for line in found.stdout.splitlines() if line.split("|")[-1] == rec.job_dir}
    assert ids == {rec.job_id}, found.stdout


def test_workspace_is_sent_once_and_a_one_file_edit_sends_one_file(
    sched: SlurmScheduler, ssh_server: SshServer, tmp_path: Path
) -> None:
    ws = tmp_path / "ws"
    (ws / "pkg").mkdir(parents=True)
    token = os.urandom(8).hex()  # the cluster's store outlives the test: contents new to it
    (ws / "main.sh").write_text(f"echo main v1 # {token}\n")
    (ws / "pkg" / "data.txt").write_text(f"data {token}\n")
    (ws / "big.bin").write_bytes(os.urandom(100_000))
    (ws / "run").symlink_to("main.sh")
    app = lambda: AppDef(name="ws", roles=[bash_role("r", "bash run; cat pkg/data.txt; test ! -w main.sh && echo ro")])  # noqa: E731
    rem = ssh_mod.ssh_host(ssh_server.target, ssh_server.options)

    first = sched.submit(app(), ssh_server.cfg(), workspace=str(ws))
    assert [(r.files_sent, r.reused) for r in rem.last_ship] == [(3, False)]
    assert rem.last_ship[0].bytes_sent > 100_000
    second = sched.submit(app(), ssh_server.cfg(), workspace=str(ws))
    assert [(r.files_sent, r.bytes_sent, r.reused) for r in rem.last_ship] == [(0, 0, True)]
    (ws / "main.sh").write_text(f"echo main v2 # {token}\n")
    third = sched.submit(app(), ssh_server.cfg(), workspace=str(ws))
    assert [(r.files_sent, r.reused) for r in rem.last_ship] == [(1, False)]
    assert rem.last_ship[0].bytes_sent < 10_000  # the edited file and the manifest, not the big one
    for app_id, version in ((first, "v1"), (second, "v1"), (third, "v2")):
        desc = sched.wait(app_id, timeout=120)
        assert desc is not None and desc.state == AppState.SUCCEEDED, desc
        assert list(sched.log_iter(app_id, "r", 0)) == [f"main {version}\n", f"data {token}\n", "ro\n"]


def test_running_app_is_seen_by_views_with_last_lines_and_cancelled_over_ssh(
    sched: SlurmScheduler, ssh_server: SshServer
) -> None:
    app = AppDef(name="sshlive", roles=[bash_role("w", "echo started; echo warm >&2; sleep 120", n=2)])
    app_id = run_app(sched, app, ssh_server.cfg())
    deadline = time.monotonic() + 60
    while True:
        views = sched.view_snapshot([app_id])
        reps = views[0].replicas if views else []
        if views and views[0].state == "RUNNING" and reps and all(r.last_line for r in reps):
            break
        assert time.monotonic() < deadline, views
        time.sleep(0.5)
    assert {r.last_line for r in reps} <= {"started", "warm"}
    desc = sched.describe(app_id)
    assert desc is not None and desc.state == AppState.RUNNING
    sched.cancel(app_id)
    desc = sched.describe(app_id, max_age=0.0)
    assert desc is not None and desc.state == AppState.CANCELLED, desc


def test_cancel_over_ssh_warns_every_task_before_scancel(sched: SlurmScheduler, ssh_server: SshServer) -> None:
    # as a local cancel does: the warning reaches each task (a bash trap here: the login node's python has no
    # tsm), each has warn_before to save and end, and the job's own record says the cancel warned it
    script = "trap 'echo \"warned $TSM_REPLICA_ID\"; exit 0' USR1; echo ready; while :; do sleep 0.1; done"
    app = AppDef(name="sshwarn", roles=[bash_role("w", script, n=2)])
    cfg = {**ssh_server.cfg(), "warn_signal": "USR1", "warn_before": "60s", "max_preemptions": 0}
    app_id = run_app(sched, app, cfg)
    try:
        for k in (0, 1):
            wait_until(lambda k=k: "ready\n" in list(sched.log_iter(app_id, "w", k)), f"replica {k} ready",
                       timeout=120)  # fmt: skip
    finally:
        sched.cancel(app_id)
    desc = sched.describe(app_id, max_age=0.0)
    assert desc is not None and desc.state.is_terminal, desc
    for k in (0, 1):
        lines = list(sched.log_iter(app_id, "w", k))  # bash says its "sleep", which does not trap it, got USR1
        assert lines[0] == "ready\n" and lines.count(f"warned {k}\n") == 1, lines  # warned once, had time to end
    rec = RemoteRecord.load(app_id)
    assert rec is not None
    batch = ssh_mod.ssh_host(rec.target, rec.options).read(f"{rec.job_dir}/batch.out")
    assert b"tsm: cancelled: SIGUSR1 to every task" in batch
