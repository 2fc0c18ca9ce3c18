"""What a config file or a shared folder can make tsm's SSH connections do (``tsm.schedulers.common.ssh``).

What must hold: a config file found in the working directory (``.torchxconfig``, ``tsm.toml``, ``[tool.tsm]``)
never makes a ``tsm`` command run a program, whatever ssh option it names; host names never carry shell
syntax; the folder of the control sockets is this user's own, made with a name nobody could guess, and one
that is not is never used. The rest of the SSH kit is tested with Slurm over SSH
(``tests/schedulers/slurm/test_slurm_ssh.py``, ``tests/integration/test_slurm_ssh.py``).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from testutil import HANG
from tsm.errors import InvalidRunOptionError, SchedulerUnavailableError
from tsm.schedulers.common.ssh import SshConnection, SshTarget, parse_ssh_options

#: ssh options that run or load a program on this machine, as a config file would spell them
RUNNING = {
    "ProxyCommand": "ProxyCommand sh -c 'touch {mark}'",
    "LocalCommand": "LocalCommand touch {mark}",
    "PKCS11Provider": "PKCS11Provider {mark}.so",
    "SecurityKeyProvider": "SecurityKeyProvider {mark}.so",
    "KnownHostsCommand": "KnownHostsCommand /bin/sh -c 'touch {mark}'",
    "XAuthLocation": "XAuthLocation {mark}",
    "Match": "Match exec \"touch {mark}\"",
    "Include": "Include {mark}.conf",
}


def _project(folder: Path, kind: str, option: str) -> None:
    """A project folder whose config file (``kind``) makes Slurm go over SSH with ``option``."""
    table = f"ssh = \"login\"\nssh_options = [\'\'\'{option}\'\'\']\n"  # a TOML literal string: quotes kept
    if kind == ".torchxconfig":
        (folder / kind).write_text(f"[cli:run]\nscheduler = slurm\n\n[slurm]\nssh = login\nssh_options = {option}\n")
    elif kind == "tsm.toml":
        (folder / kind).write_text(f"default_scheduler = \"slurm\"\n[scheduler.slurm]\n{table}")
    else:
        (folder / kind).write_text(f"[tool.tsm]\ndefault_scheduler = \"slurm\"\n[tool.tsm.scheduler.slurm]\n{table}")


@pytest.mark.reliability(
    "a config file in the working directory never makes tsm run a command",
    expect="a .torchxconfig, tsm.toml or [tool.tsm] setting Slurm over SSH with ProxyCommand, LocalCommand, "
    "PKCS11Provider, KnownHostsCommand, Match exec, ...: `tsm run --dryrun` refuses it in one line (exit 2), "
    "nothing runs",
    group="Security",
)
def test_a_config_in_the_working_directory_cannot_make_a_dry_run_run_a_command(tmp_path: Path, figure) -> None:  # type: ignore[no-untyped-def]
    if shutil.which("ssh") is None:
        pytest.skip("needs OpenSSH's client (what a dry run over SSH would start)")
    (tmp_path / "home").mkdir()  # a home of the test's: no ~/.torchxconfig or ~/.ssh/config of the machine's
    env = {k: v for k, v in os.environ.items() if k not in ("TORCHXCONFIG", "XDG_CONFIG_HOME")}
    env["HOME"] = str(tmp_path / "home")
    wrong = []
    for kind in (".torchxconfig", "tsm.toml", "pyproject.toml"):
        for key, option in RUNNING.items():
            folder = tmp_path / f"{kind}-{key}"
            folder.mkdir()
            mark = tmp_path / f"ran-{kind}-{key}"
            _project(folder, kind, option.format(mark=mark))
            r = subprocess.run([sys.executable, "-m", "tsm.cli.main", "run", "--dryrun", "utils.sh", "--", "true"],
                               cwd=folder, capture_output=True, text=True, timeout=HANG, env=env)
            if list(tmp_path.glob(f"ran-{kind}-{key}*")):
                wrong.append(f"{key} from {kind} ran a command: {r.stderr}")
            elif r.returncode != 2 or "Traceback" in r.stderr or len(r.stderr.splitlines()) != 1:
                wrong.append(f"{key} from {kind}: exit {r.returncode}, {r.stderr!r}")
            elif key not in r.stderr or "~/.ssh/config" not in r.stderr:
                wrong.append(f"{key} from {kind}: the error does not say what to do: {r.stderr!r}")
    assert wrong == [], "\n".join(wrong)
    figure("config files refused", 3 * len(RUNNING), "")


def test_options_that_forward_this_machine_to_the_host_are_refused_everywhere() -> None:
    for word in ("ForwardAgent yes", "ForwardX11=yes", "LocalForward 8080 localhost:80", "DynamicForward 1080",
                 "RemoteForward 9000 localhost:22", "proxycommand nc %h %p", "Tunnel yes"):
        with pytest.raises(InvalidRunOptionError, match="~/.ssh/config"):
            parse_ssh_options([word])
    assert parse_ssh_options(["ProxyJump alice@bastion:2222,gw", "IdentityFile ~/.ssh/k"]) == [
        "ProxyJump=alice@bastion:2222,gw", "IdentityFile=~/.ssh/k"]


@pytest.mark.reliability(
    "a known_hosts file planted beside a project cannot make a stranger's host trusted",
    expect="UserKnownHostsFile/GlobalKnownHostsFile naming a file (or in a folder) others may write, or another "
    "user's, and VerifyHostKeyDNS, are refused with InvalidRunOptionError; the user's own private file is taken",
    group="Security",
)
def test_known_hosts_files_must_be_the_users_alone(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    planted = shared / "known_hosts"
    planted.write_text("")
    shared.chmod(0o777)  # a folder others may write to: they could swap the file
    for word in (f"UserKnownHostsFile {planted}", f"GlobalKnownHostsFile={planted}"):
        with pytest.raises(InvalidRunOptionError, match="not yours alone"):
            parse_ssh_options([word])
    shared.chmod(0o755)
    planted.chmod(0o666)
    with pytest.raises(InvalidRunOptionError, match="not yours alone"):
        parse_ssh_options([f"UserKnownHostsFile {planted}"])
    planted.chmod(0o644)
    if os.geteuid() == 0:
        os.chown(planted, 65534, 65534)
        with pytest.raises(InvalidRunOptionError, match="owner uid 65534"):
            parse_ssh_options([f"UserKnownHostsFile {planted}"])
        os.chown(planted, 0, 0)
    assert parse_ssh_options([f"UserKnownHostsFile {shared / 'missing'}"])  # no key known: ssh refuses every host
    with pytest.raises(InvalidRunOptionError, match="DNS"):
        parse_ssh_options(["VerifyHostKeyDNS yes"])
    assert parse_ssh_options([f"UserKnownHostsFile {planted}"]) == [f"UserKnownHostsFile={planted}"]


@pytest.mark.parametrize("text", ["login$(touch x)", "login;id", "log`id`in", "a b", "alice'@login", "x|y",
                                  "al$ice@login", "login&"])
def test_a_host_or_user_with_shell_syntax_is_refused(text: str) -> None:
    """OpenSSH hands the host to ``%h`` of the user's own ``ProxyCommand``, which a shell runs."""
    with pytest.raises(InvalidRunOptionError):
        SshTarget.parse(text)
    with pytest.raises(InvalidRunOptionError):
        parse_ssh_options([f"ProxyJump {text}"])


def _long_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> Path:
    home = tmp_path / ("h" * 60) / ("o" * 40)
    home.mkdir(parents=True)
    monkeypatch.setenv("TSM_HOME", str(home))
    import tempfile

    shared = Path(tempfile.mkdtemp(prefix="t-", dir="/tmp"))  # short: the test's own folder is too long a path
    request.addfinalizer(lambda: shutil.rmtree(shared, ignore_errors=True))
    shared.chmod(0o1777)  # as /tmp is
    monkeypatch.setenv("TMPDIR", str(shared))
    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again
    return home


@pytest.mark.reliability(
    "another user cannot lock anyone out of Slurm over SSH through the shared temporary directory",
    expect="with a TSM_HOME too long for a socket path, the control folder in $TMPDIR is made with a random "
    "name (0700, this user's); a folder or link squatting the old predictable name changes nothing",
    group="Security",
)
def test_the_control_folder_in_the_temporary_directory_is_made_not_guessed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    home = _long_home(tmp_path, monkeypatch, request)
    shared = Path(os.environ["TMPDIR"])
    # what another user could have made first under the name today's tree guesses
    tag = hashlib.sha256(str(home / "ssh").encode()).hexdigest()[:10]
    squat = shared / f"tsm-ssh-{os.getuid()}-{tag}"
    elsewhere = tmp_path / "theirs"
    elsewhere.mkdir()
    squat.symlink_to(elsewhere)
    if os.geteuid() == 0:
        os.chown(elsewhere, 65534, 65534)
    d = SshConnection(SshTarget("login")).control_dir()
    assert d.parent == shared and d != squat and d.name.startswith("tsm-ssh-")
    st = os.lstat(d)
    assert st.st_uid == os.geteuid() and st.st_mode & 0o777 == 0o700 and not d.is_symlink()
    assert SshConnection(SshTarget("other")).control_dir() == d  # kept for the next connection and process
    assert f"ControlPath={d}/%C" in SshConnection(SshTarget("login")).ssh_args("true")


def test_a_kept_control_folder_that_is_no_longer_ours_is_replaced(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    _long_home(tmp_path, monkeypatch, request)
    first = SshConnection(SshTarget("login")).control_dir()
    first.rmdir()  # the temporary directory was cleaned (a reboot) and someone made a link in its place
    first.symlink_to(tmp_path)
    second = SshConnection(SshTarget("login")).control_dir()
    assert second != first and not second.is_symlink() and os.lstat(second).st_mode & 0o777 == 0o700


def test_a_control_folder_in_tsm_home_that_is_not_ours_is_a_clear_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    # a home short enough that its ssh/ holds the sockets (a long one uses a temporary folder instead)
    tsm_home = Path(tempfile.mkdtemp(prefix="h", dir="/tmp"))
    request.addfinalizer(lambda: shutil.rmtree(tsm_home, ignore_errors=True))
    monkeypatch.setenv("TSM_HOME", str(tsm_home))
    monkeypatch.chdir(tmp_path)
    (tsm_home / "ssh").symlink_to(tmp_path)
    with pytest.raises(SchedulerUnavailableError, match="not a directory.*a folder of yours alone"):
        SshConnection(SshTarget("login")).control_dir()
    (tsm_home / "ssh").unlink()
    (tsm_home / "ssh").mkdir(mode=0o755)
    assert SshConnection(SshTarget("login")).control_dir() == tsm_home / "ssh"
    assert (tsm_home / "ssh").stat().st_mode & 0o777 == 0o700
