"""Slurm over SSH without a server: target and option parsing, remote quoting, error classes, resuming reads.

The "remote" here is a fake ``ssh`` client (a shell script) that runs the command it is given with the local
``sh``, exactly as the remote login shell would, so quoting is tested end to end; the real server is in
``tests/integration/test_slurm_ssh.py``.
"""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from tsm.errors import InvalidRunOptionError, SchedulerUnavailableError, SubmissionError
from tsm.schedulers.common.logs import follow
from tsm.schedulers.common.ssh import (
    SshAuthError,
    SshConnection,
    SshConnectionLostError,
    SshHostKeyError,
    SshTarget,
    SshUnreachableError,
    classify,
    parse_ssh_options,
    quote_command,
)
from tsm.schedulers.slurm.script import SlurmBatchRequest
from tsm.schedulers.slurm.ssh_host import SshHost, SshOptions, is_remote_id

HOSTILE = [
    "plain",
    "",
    " spaced  out ",
    "it's",
    '"double"',
    "$(touch /tmp/pwned-by-tsm)",
    "`id`",
    "a;b&&c||d|e",
    "line\nbreak",
    "back\\slash",
    "*?[glob]",
    "~root",
    "-n",
    "--option=1",
    "ünïcödé ✓",
    "$HOME ${PATH}",
    "tab\there",
    "!bang",
]


def fake_ssh(tmp_path: Path, body: str = 'exec sh -c "$cmd"') -> str:
    """A stand-in for ``ssh``: finds the remote command (the word after the host) and runs ``body``."""
    path = tmp_path / "fake-ssh"
    path.write_text(
        "#!/bin/bash\n"
        '# the last argument is the remote command, as ssh gets it\n'
        'cmd="${@: -1}"\n'
        f"{body}\n"
    )
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


# -- parsing -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "host", "user", "port"),
    [
        ("login", "login", None, None),
        ("alice@login.example.org", "login.example.org", "alice", None),
        ("alice@login:2222", "login", "alice", 2222),
        ("[::1]:22", "::1", None, 22),
        ("bob@[fe80::1%eth0]", "fe80::1%eth0", "bob", None),
        (" login ", "login", None, None),
    ],
)
def test_target_parses_user_host_port(text: str, host: str, user: str | None, port: int | None) -> None:
    t = SshTarget.parse(text)
    assert (t.host, t.user, t.port) == (host, user, port)
    assert SshTarget.parse(str(t)) == t  # prints back to the same target


@pytest.mark.parametrize(
    "text", ["", "-oProxyCommand=touch x", "alice@-oProxyCommand=x", "a@b@c", "host:0", "host:70000",
             "host:port", "host name", "host/path", "-l"]
)  # fmt: skip
def test_target_refuses_what_ssh_could_read_as_an_option(text: str) -> None:
    with pytest.raises(InvalidRunOptionError):
        SshTarget.parse(text)


def test_slug_names_target_in_app_id_characters() -> None:
    assert SshTarget.parse("alice@login-1.x:2222").slug() == "alice_login-1.x_2222".replace("-", "_")
    assert is_remote_id(f"{SshTarget.parse('alice@[::1]:22').slug()}-4242")
    assert not is_remote_id("4242")


def test_ssh_options_accept_both_spellings_and_refuse_weakening_host_keys() -> None:
    assert parse_ssh_options(["IdentityFile ~/.ssh/k", "Port=22", " "]) == ["IdentityFile=~/.ssh/k", "Port=22"]
    assert parse_ssh_options("ProxyJump=bastion;ServerAliveInterval 9") == ["ProxyJump=bastion",
                                                                              "ServerAliveInterval=9"]
    for bad in ("StrictHostKeyChecking=no", "stricthostkeychecking accept-new", "BatchMode no",
                "ControlPath=/tmp/x", "LocalCommand=x", "=x", "Key", "-oX=y"):
        with pytest.raises(InvalidRunOptionError):
            parse_ssh_options([bad])


def test_ssh_run_options_are_checked_at_dry_run() -> None:
    with pytest.raises(InvalidRunOptionError):
        SshOptions.from_cfg({"ssh": "-oProxyCommand=x"})
    with pytest.raises(InvalidRunOptionError):
        SshOptions.from_cfg({"ssh_options": ["IdentityFile x"]})  # options without a host
    with pytest.raises(InvalidRunOptionError):
        SshOptions.from_cfg({"ssh": "login", "ssh_options": ["StrictHostKeyChecking no"]})
    assert SshOptions.from_cfg({"ssh": "login", "remote_home": "/scratch/me"}).ssh == "login"


def test_run_options_reach_the_scheduler_from_the_command_line() -> None:
    from tsm.schedulers.slurm import SlurmScheduler

    cfg = SlurmScheduler("t").run_opts().cfg_from_str(
        "ssh=alice@login:2222,ssh_options=IdentityFile /k/id,UserKnownHostsFile /k/known,partition=gpu"
    )
    assert cfg["ssh"] == "alice@login:2222"
    assert cfg["ssh_options"] == ["IdentityFile /k/id", "UserKnownHostsFile /k/known"]
    assert parse_ssh_options(cfg["ssh_options"]) == ["IdentityFile=/k/id", "UserKnownHostsFile=/k/known"]  # type: ignore[arg-type]


# -- the ssh command line ------------------------------------------------------------------------------------
def test_ssh_args_check_host_keys_never_prompt_and_share_one_private_socket(tmp_path: Path) -> None:
    conn = SshConnection(SshTarget.parse("alice@login:2222"), ["IdentityFile=/k"], control_dir=tmp_path / "c")
    args = conn.ssh_args("true")
    opts = [args[i + 1] for i, a in enumerate(args) if a == "-o"]
    # ssh keeps the first value of an option: ours come before the user's
    assert opts[:5] == ["BatchMode=yes", "StrictHostKeyChecking=yes", "ControlMaster=auto",
                        f"ControlPath={tmp_path / 'c'}/%C", opts[4]]
    assert opts[4].startswith("ControlPersist=")
    assert opts.index("IdentityFile=/k") > opts.index("StrictHostKeyChecking=yes")
    assert args[-3:] == ["--", "login", "true"] and args[args.index("-l"):args.index("-l") + 2] == ["-l", "alice"]
    assert stat.S_IMODE(os.stat(tmp_path / "c").st_mode) == 0o700


def test_hostile_arguments_reach_the_remote_command_byte_for_byte(tmp_path: Path) -> None:
    conn = SshConnection(SshTarget("h"), control_dir=tmp_path / "c", ssh=fake_ssh(tmp_path))
    proc = conn.run_bytes(["printf", "%s\\0", *HOSTILE])
    assert proc.returncode == 0
    assert proc.stdout.decode().split("\0")[:-1] == HOSTILE
    assert not Path("/tmp/pwned-by-tsm").exists()
    assert quote_command(["a b"]) == "'a b'"
    with pytest.raises(Exception, match="NUL"):
        quote_command(["a\0b"])


@pytest.mark.parametrize(
    ("stderr", "kind"),
    [
        ("@@@@@@@@@@@\n@    WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!     @\nHost key verification failed.\n",
         SshHostKeyError),
        ("No ED25519 host key is known for [127.0.0.1]:2222 and you have requested strict checking.\n"
         "Host key verification failed.\n", SshHostKeyError),
        ("alice@login: Permission denied (publickey).\n", SshAuthError),
        ("ssh: connect to host 127.0.0.1 port 1: Connection refused\n", SshUnreachableError),
        ("ssh: Could not resolve hostname nowhere: Name or service not known\n", SshUnreachableError),
        ("Connection to 127.0.0.1 closed by remote host.\n", SshConnectionLostError),
        ("client_loop: send disconnect: Broken pipe\n", SshConnectionLostError),
    ],
)
def test_ssh_failures_become_one_typed_one_line_error(stderr: str, kind: type[Exception]) -> None:
    err = classify(SshTarget.parse("alice@login"), stderr)
    assert type(err) is kind and isinstance(err, SchedulerUnavailableError)
    assert "\n" not in str(err) and "alice@login" in str(err)


def test_exit_255_raises_the_classified_error_and_keeps_partial_output(tmp_path: Path) -> None:
    body = 'printf "part"; echo "Connection to h closed by remote host." >&2; exit 255'
    conn = SshConnection(SshTarget("h"), control_dir=tmp_path / "c", ssh=fake_ssh(tmp_path, body))
    with pytest.raises(SshConnectionLostError) as e:
        conn.run(["true"])
    assert e.value.stdout == b"part"


# -- the remote side -----------------------------------------------------------------------------------------
def test_follow_resumes_from_its_offset_across_dropped_connections(tmp_path: Path) -> None:
    """Every other read dies after half its bytes (exit 255): the lines still come once each, in order."""
    log = tmp_path / "replica.stdout"
    lines = [f"line {i} {'x' * (i % 7)}\n" for i in range(200)]
    log.write_text("".join(lines))
    count = tmp_path / "count"
    body = (
        f'n=$(cat {count} 2>/dev/null || echo 0); echo $((n+1)) >{count}\n'
        'out=$(sh -c "$cmd"; printf .); out=${out%.}\n'
        'if [ $((n % 2)) = 1 ]; then printf %s "${out:0:$(( ${#out} / 2 ))}"; '
        'echo "Connection to h closed by remote host." >&2; exit 255; fi\n'
        'printf %s "$out"'
    )
    rem = SshHost(SshConnection(SshTarget("h"), control_dir=tmp_path / "c", ssh=fake_ssh(tmp_path, body)))
    reader = rem.reader(str(log))
    reads = [0]

    def ended() -> bool:
        reads[0] += 1
        if reads[0] == 3:  # more lines appear while we follow
            with log.open("a") as f:
                f.write("".join(f"late {i}\n" for i in range(50)))
        return reads[0] > 12

    got = list(follow([reader], ended, busy=0.0, idle=0.0))
    assert got == lines + [f"late {i}\n" for i in range(50)]
    assert int(count.read_text()) > 4  # connections did drop


def test_submission_says_when_sbatch_is_missing_remotely(tmp_path: Path) -> None:
    body = 'PATH=/nonexistent /bin/sh -c "$cmd"'
    rem = SshHost(SshConnection(SshTarget("h"), control_dir=tmp_path / "c", ssh=fake_ssh(tmp_path, body)))
    req = SlurmBatchRequest(script="#!/bin/bash\n", job_dir=str(tmp_path / "job-abc"), app_name="a", roles=["r"],
                            app_json="{}")
    with pytest.raises(SchedulerUnavailableError, match="sbatch is not on the remote PATH"):
        rem.submit(req)


def test_submission_is_idempotent_when_the_connection_drops_after_sbatch(tmp_path: Path) -> None:
    """The first submission's connection dies after ``sbatch`` ran: tsm finds the job and does not resubmit."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    jobs = tmp_path / "jobs"
    (bin_dir / "sbatch").write_text(f'#!/bin/sh\nn=$(( $(wc -l <{jobs} 2>/dev/null || echo 0) + 1 ))\n'
                                    f'echo "$n|$PWD" >>{jobs}\necho $n\n')
    (bin_dir / "squeue").write_text(f"#!/bin/sh\ncat {jobs}\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    first = tmp_path / "first"
    body = (
        f'export PATH={bin_dir}:$PATH\n'
        f'if [ ! -e {first} ] && [ "${{cmd#*tsm-submit}}" != "$cmd" ]; then : >{first}; sh -c "$cmd" >/dev/null; '
        'echo "Connection to h closed by remote host." >&2; exit 255; fi\n'
        'exec sh -c "$cmd"'
    )
    rem = SshHost(SshConnection(SshTarget("h"), control_dir=tmp_path / "c", ssh=fake_ssh(tmp_path, body)))
    job_dir = tmp_path / "remote" / "job-1234abcd"
    req = SlurmBatchRequest(script="#!/bin/bash\ntrue\n", job_dir=str(job_dir), app_name="a", roles=["r"],
                            app_json='{"x": 1}')
    assert rem.submit(req, pause=0.0) == "1"
    assert jobs.read_text().splitlines() == [f"1|{job_dir}"]  # sbatch ran once
    assert (job_dir / "app.json").read_text() == '{"x": 1}' and (job_dir / "r").is_dir()
    assert stat.S_IMODE((job_dir / "app.json").stat().st_mode) == 0o600
    # a second, different submission into the same directory is refused
    other = SlurmBatchRequest(script="x", job_dir=str(job_dir), app_name="a", roles=[], app_json="{}")
    (job_dir / "submit_token").write_text("someone else\n")
    with pytest.raises(SubmissionError, match="already holds an app"):
        rem.submit(other)


def test_remote_paths_resolve_against_the_remote_home(tmp_path: Path) -> None:
    body = 'HOME=/home/far exec sh -c "$cmd"'
    rem = SshHost(SshConnection(SshTarget("h"), control_dir=tmp_path / "c", ssh=fake_ssh(tmp_path, body)))
    assert rem.resolve("~/.tsm") == "/home/far/.tsm"
    assert rem.resolve("scratch") == "/home/far/scratch"
    assert rem.resolve("/abs") == "/abs"
    assert subprocess.run(["true"]).returncode == 0


def test_the_mirror_of_a_remote_job_directory_holds_what_describe_reads(tmp_path: Path, tsm_home: Path) -> None:
    """Every record of the batch script describe reads (a stall, excluded nodes, why a move failed, the last
    exit) is copied; one the job's next attempt removed goes from the mirror too; the app's record stays."""
    from tsm.schedulers.slurm.host import Where
    from tsm.schedulers.slurm.jobdir import JobDir

    job = tmp_path / "remote" / "job-1"
    (job / "w").mkdir(parents=True)
    (job / "app.json").write_text("{}")
    (job / "stalled").write_text("w/0 stalled for 15m, last line: 'step 7'\n")
    (job / "excluded").write_text("node3 NODE_FAIL (reason: gone)\n")
    (job / "last_exit").write_text("stalled\n")
    (job / "w" / "0.status").write_text("running node1 1 1\n")
    (job / "w" / "0.stdout").write_text("a\nlast\n")
    host = SshHost(SshConnection(SshTarget("h"), control_dir=tmp_path / "c", ssh=fake_ssh(tmp_path)))
    where = Where("h-5", "5", host, str(job))
    host.sync([where], tails=True)
    mirror = host.local_dir(where, None)
    assert mirror is not None
    seen = JobDir(mirror)
    assert seen.stalled() == ("w", 0, "stalled for 15m, last line: 'step 7'")
    assert seen.excluded() == ["node3 NODE_FAIL (reason: gone)"] and seen.last_exit() == "stalled"
    assert (mirror / "w" / "0.stdout").read_text() == "a\nlast\n"  # the tail, for the views
    (job / "stalled").unlink()  # the next attempt began
    (job / "w" / "0.status").write_text("exited 0 2 1 - node1\n")
    (job / "exit").write_text("0\n")
    host.sync([where])
    assert JobDir(mirror).stalled() is None and (mirror / "app.json").exists()
    assert JobDir(mirror).status("w", 0).exit_code == 0  # type: ignore[union-attr]
    (job / "excluded").unlink()
    host.sync([where])  # the final exit code is in the mirror: nothing changes after it
    assert JobDir(mirror).excluded() == ["node3 NODE_FAIL (reason: gone)"]
