"""Commands on another host over one multiplexed OpenSSH connection per host.

A backend that can run its engine's commands from a remote login node (Slurm's ``-c ssh=login``) builds an
:class:`SshConnection` from an :class:`SshTarget` (``[user@]host[:port]``) and the user's extra options
(:func:`parse_ssh_options`), then calls :meth:`SshConnection.run` with an argument list, exactly as it
would run the command locally. Every call goes through the system's ``ssh`` with::

    BatchMode=yes                 never prompt: the user's agent or key authenticates, tsm keeps no secret
    StrictHostKeyChecking=yes     the host key must already be in the user's known_hosts; unknown or
                                  changed keys are refused (:class:`SshHostKeyError`), never accepted
    ControlMaster=auto            the first call opens a master connection; every later call (status,
    ControlPath=$TSM_HOME/ssh/%C  views, log reads, other tsm processes) rides on it, so a call costs one
    ControlPersist=<seconds>      round trip instead of a TCP + key exchange + authentication
    ServerAliveInterval/CountMax  a dead connection is noticed in seconds, not at the TCP timeout

Each word of the command is quoted with :func:`shlex.quote` and joined into the one string ``ssh`` sends to
the remote shell (which must be a POSIX shell: sh, bash, zsh, dash), so a value is never read as shell
syntax there. ``ssh``'s own failures (exit status 255) become one typed, one-line error each
(:func:`classify`): host not answering (:class:`SshUnreachableError`), host key unknown or changed
(:class:`SshHostKeyError`), key refused (:class:`SshAuthError`), connection lost mid-command
(:class:`SshConnectionLostError`, which keeps the bytes received before the loss). All are
:class:`~tsm.errors.SchedulerUnavailableError` (CLI exit code 1: the scheduler could not do what was asked).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tsm.errors import InvalidRunOptionError, SchedulerError, SchedulerUnavailableError

#: ``ssh -o`` keys tsm sets itself and a user may not override: they are what makes the connection safe
#: (host keys checked, no prompt) and shared (one master per host).
RESERVED_OPTIONS = frozenset(
    k.lower()
    for k in (
        "BatchMode",
        "StrictHostKeyChecking",
        "ControlMaster",
        "ControlPath",
        "ControlPersist",
        "RemoteCommand",
        "RequestTTY",
    )
)

#: ``ssh -o`` keys refused wherever they come from (``-c``, ``tsm.toml``, a ``.torchxconfig`` in the working
#: directory): each makes ``ssh`` run or load a program on this machine (a proxy or local command, a PKCS#11
#: or security-key library, an ``xauth``, a ``Match exec``, another config file), or hands the remote host
#: this machine's agent, X display or ports. A host that needs one is set up in the user's own
#: ``~/.ssh/config`` (``Host cluster`` ... ``ProxyCommand ...``), which ssh reads itself, and named with
#: ``ssh=cluster``: no file tsm finds by walking into a folder can then make a ``tsm`` command run anything.
COMMAND_OPTIONS = frozenset(
    k.lower()
    for k in (
        "ProxyCommand",
        "ProxyUseFdpass",
        "LocalCommand",
        "PermitLocalCommand",
        "KnownHostsCommand",
        "PKCS11Provider",
        "SecurityKeyProvider",
        "XAuthLocation",
        "Match",
        "Host",
        "Include",
        "ForwardAgent",
        "ForwardX11",
        "ForwardX11Trusted",
        "LocalForward",
        "RemoteForward",
        "DynamicForward",
        "Tunnel",
        "TunnelDevice",
        "GatewayPorts",
    )
)

#: ``ssh -o`` keys that choose which host keys count as known: a ``known_hosts`` file planted beside a
#: project would make a stranger's host trusted, so each file named must be this user's alone, in a folder
#: nobody else may write to (:func:`_check_known_hosts`).
KNOWN_HOSTS_OPTIONS = frozenset(k.lower() for k in ("UserKnownHostsFile", "GlobalKnownHostsFile"))

#: A host name, or one hop of ``ProxyJump``, as tsm passes it to ssh: nothing a shell would read (OpenSSH
#: puts the host into ``%h`` of the user's own ``ProxyCommand``, which a shell runs).
_HOST_CHARS = re.compile(r"[A-Za-z0-9._-]+")
_USER_CHARS = re.compile(r"[A-Za-z0-9._+-]+")

#: Seconds a master connection outlives its last use (later tsm commands reuse it within that time).
CONTROL_PERSIST = 120


class SshError(SchedulerUnavailableError):
    """``ssh`` itself failed (exit 255): the remote command did not run, or did not finish."""

    def __init__(self, message: str, *, stdout: bytes = b"", stderr: str = "") -> None:
        super().__init__(message)
        #: what the remote command wrote before the failure (a lost connection keeps a valid prefix)
        self.stdout = stdout
        self.stderr = stderr


class SshUnreachableError(SshError):
    """The host did not answer (refused, timed out, no route, unknown name)."""


class SshHostKeyError(SshError):
    """The host's key is not in known_hosts, or differs from the one recorded there: refused, never accepted."""


class SshAuthError(SshError):
    """The host refused every key the agent or the options offered."""


class SshConnectionLostError(SshError):
    """The connection dropped while the command ran: it may or may not have finished remotely."""


@dataclass(frozen=True)
class SshTarget:
    """Where to connect: ``host``, with an optional ``user`` and ``port`` (``[user@]host[:port]``)."""

    host: str
    user: str | None = None
    port: int | None = None

    @classmethod
    def parse(cls, text: str) -> SshTarget:
        """``[user@]host[:port]``, where host may be an ``[IPv6]`` literal or an alias of ``~/.ssh/config``.

        Refuses anything ``ssh`` could read as an option (a leading ``-``) or that is not one host name.
        """
        raw = text.strip()
        m = re.fullmatch(r"(?:(?P<user>[^@\s:/]+)@)?(?:\[(?P<v6>[0-9A-Za-z:.%]+)\]|(?P<host>[^@\s:/\[\]]+))(?::(?P<port>\d+))?", raw)
        if not m:
            raise InvalidRunOptionError(f"ssh={text!r}: expected [user@]host[:port], e.g. ssh=alice@login.example.org:22")
        host = m.group("v6") or m.group("host")
        user = m.group("user")
        port = int(m.group("port")) if m.group("port") else None
        for part, what in ((host, "host"), (user, "user")):
            if part is not None and part.startswith("-"):
                raise InvalidRunOptionError(f"ssh={text!r}: the {what} may not start with '-'")
        if not m.group("v6") and not _HOST_CHARS.fullmatch(host):
            raise InvalidRunOptionError(
                f"ssh={text!r}: a host name or ~/.ssh/config alias is letters, digits, '.', '_' and '-' only")
        if user is not None and not _USER_CHARS.fullmatch(user):
            raise InvalidRunOptionError(f"ssh={text!r}: a user name is letters, digits, '.', '_', '+' and '-' only")
        if port is not None and not 0 < port < 65536:
            raise InvalidRunOptionError(f"ssh={text!r}: port {port} is not between 1 and 65535")
        return cls(host=host, user=user, port=port)

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return (f"{self.user}@" if self.user else "") + host + (f":{self.port}" if self.port else "")

    def slug(self) -> str:
        """A name made of letters, digits, ``_`` and ``.`` that tells targets apart (for app ids and files)."""
        text = (f"{self.user}_" if self.user else "") + self.host + (f"_{self.port}" if self.port else "")
        return re.sub(r"[^A-Za-z0-9_.]", "_", text)[:60]


def parse_ssh_options(values: Iterable[str] | str | None) -> list[str]:
    """``ssh -o`` options from ``Key=Value`` or ``Key Value`` words (a list, or one string separated by ``;``).

    On the command line (where ``,`` and ``;`` separate run options and ``=`` starts a new one) write them
    ``Key Value``: ``-c ssh_options='IdentityFile ~/.ssh/cluster,UserKnownHostsFile ~/.ssh/known_cluster'``;
    in ``tsm.toml`` a list of ``"Key=Value"`` strings works as well. A key tsm sets
    itself (:data:`RESERVED_OPTIONS`: host-key checking, batch mode, the control socket) is refused: tsm never
    weakens host-key checking, whatever the options say. So is a key that makes ssh run a program here or
    forward something to the host (:data:`COMMAND_OPTIONS`: those belong in ``~/.ssh/config``), and a
    ``ProxyJump`` hop that is not ``[user@]host[:port]``, ``VerifyHostKeyDNS``, and a known-hosts file that
    is not this user's alone (:data:`KNOWN_HOSTS_OPTIONS`).
    """
    if values is None:
        return []
    words = [w for w in (values.split(";") if isinstance(values, str) else values)]
    out = []
    for word in words:
        word = word.strip()
        if not word:
            continue
        m = re.fullmatch(r"([A-Za-z][A-Za-z0-9]*)\s*[= ]\s*(\S.*)", word)
        if not m or "\n" in word:
            raise InvalidRunOptionError(f"ssh_options entry {word!r}: expected Key=Value, e.g. IdentityFile=~/.ssh/id_ed25519")
        key = m.group(1).lower()
        if key in RESERVED_OPTIONS:
            raise InvalidRunOptionError(
                f"ssh_options entry {word!r}: tsm sets {m.group(1)} itself (host keys are always checked, "
                "never prompted for, and one control socket is shared)"
            )
        if key in COMMAND_OPTIONS:
            raise InvalidRunOptionError(
                f"ssh_options entry {word!r}: {m.group(1)} makes ssh run a program on this machine or forward "
                "it to the host, which no tsm option may ask for; set it for that host in your ~/.ssh/config "
                "(Host <alias> ...) and pass ssh=<alias>"
            )
        if key in KNOWN_HOSTS_OPTIONS:
            _check_known_hosts(word, m.group(2))
        if key == "verifyhostkeydns":
            raise InvalidRunOptionError(
                f"ssh_options entry {word!r}: host keys are checked against known_hosts only (a DNS answer could "
                "vouch for a stranger's host); set it for that host in your ~/.ssh/config if you must"
            )
        if key == "proxyjump":
            _check_jump(word, m.group(2))
        out.append(f"{m.group(1)}={m.group(2)}")
    return out


def _check_known_hosts(word: str, value: str) -> None:
    """Refuse a known-hosts file another user owns or may replace (the file or its folder writable by others).
    A file or folder that does not exist is let through: ssh then knows no key and refuses every host."""
    for name in value.split():
        path = os.path.expanduser(name)
        for p, what in ((path, "file"), (os.path.dirname(os.path.abspath(path)), "folder")):
            try:
                st = os.stat(p)
            except FileNotFoundError:
                continue
            except OSError as e:
                raise InvalidRunOptionError(f"ssh_options entry {word!r}: cannot read known-hosts {what} {p}: "
                                            f"{e.strerror}") from e
            owners = (os.geteuid(),) if what == "file" else (os.geteuid(), 0)
            if st.st_uid not in owners or st.st_mode & 0o022:
                raise InvalidRunOptionError(
                    f"ssh_options entry {word!r}: known-hosts {what} {p} is not yours alone (owner uid {st.st_uid}, "
                    f"mode {st.st_mode & 0o7777:04o}), so it could vouch for a stranger's host; use a file of yours "
                    "that only you can write"
                )


def _check_jump(word: str, value: str) -> None:
    """Each hop of a ``ProxyJump`` value must be a target :meth:`SshTarget.parse` takes (``none`` is ssh's own)."""
    if value.strip().lower() == "none":
        return
    for hop in value.split(","):
        try:
            SshTarget.parse(hop.removeprefix("ssh://"))
        except InvalidRunOptionError as e:
            raise InvalidRunOptionError(f"ssh_options entry {word!r}: jump host {hop!r}: {e}") from None


def quote_command(args: Sequence[str]) -> str:
    """The one string the remote shell runs for ``args``: every word ``shlex.quote``-d, so none is syntax."""
    if not args:
        raise SchedulerError("no remote command to run")
    for a in args:
        if "\0" in a:
            raise SchedulerError(f"a remote command argument holds a NUL byte: {a!r}")
    return " ".join(shlex.quote(a) for a in args)


_UNREACHABLE = (
    "connection refused",
    "connection timed out",
    "operation timed out",
    "no route to host",
    "could not resolve hostname",
    "name or service not known",
    "network is unreachable",
    "connection reset by peer",
    "kex_exchange_identification",
)
_HOSTKEY = ("host key verification failed", "remote host identification has changed", "no matching host key")
_AUTH = ("permission denied", "too many authentication failures", "no more authentication methods")


def classify(target: SshTarget, stderr: str, stdout: bytes = b"") -> SshError:
    """The typed error for a failed ``ssh`` (exit 255) from its stderr; one line, naming the host."""
    low = stderr.lower()
    last = next((ln.strip() for ln in reversed(stderr.splitlines()) if ln.strip() and not ln.startswith("@")), "")
    if "remote host identification has changed" in low:
        return SshHostKeyError(
            f"ssh {target}: the host key CHANGED since it was recorded in known_hosts; refused (check with the "
            "cluster's admins, then fix known_hosts with ssh-keygen -R)", stdout=stdout, stderr=stderr)
    if any(s in low for s in _HOSTKEY):
        return SshHostKeyError(
            f"ssh {target}: the host key is not in known_hosts; refused (tsm never accepts keys: connect once "
            "with ssh and check the fingerprint)", stdout=stdout, stderr=stderr)
    if any(s in low for s in _AUTH):
        return SshAuthError(
            f"ssh {target}: the host refused our keys ({last}); load the key into ssh-agent or set "
            "ssh_options=IdentityFile=...", stdout=stdout, stderr=stderr)
    if any(s in low for s in _UNREACHABLE) and not stdout:
        return SshUnreachableError(f"ssh {target}: the host does not answer ({last})", stdout=stdout, stderr=stderr)
    return SshConnectionLostError(
        f"ssh {target}: the connection was lost during the command ({last or 'ssh exited 255'})",
        stdout=stdout, stderr=stderr)


class SshConnection:
    """Runs commands on one host over the shared master connection (see the module docstring).

    ``control_dir`` holds the control socket (default ``$TSM_HOME/ssh``, made 0700: a socket there gives a
    shell on the host to whoever can open it). ``ssh`` names the client binary (tests). Thread-safe: the
    client processes are independent; OpenSSH multiplexes them over the master.
    """

    def __init__(
        self,
        target: SshTarget,
        options: Sequence[str] = (),
        *,
        control_dir: Path | None = None,
        ssh: str = "ssh",
        connect_timeout: int = 10,
    ) -> None:
        self.target = target
        self.options = list(options)
        self._control_dir = control_dir
        self._ssh = ssh
        self._connect_timeout = connect_timeout
        self._lock = threading.Lock()
        #: remote commands run, by their first word, for benchmarks
        self.calls: dict[str, int] = {}
        #: bytes written to remote commands' stdin, for benchmarks
        self.bytes_sent = 0

    def control_dir(self) -> Path:
        """The private directory of the control sockets (created 0700 on first use, checked on every one).

        ``$TSM_HOME/ssh`` unless that path is too long for a socket name (Unix sockets take about 104
        bytes, and ``/%C`` adds 41, ssh's temporary suffix 17 more): then a folder this process makes under
        the temporary directory with an unpredictable name (:func:`tempfile.mkdtemp`), whose path is kept in
        ``$TSM_HOME/ssh.dir`` so later tsm processes share its sockets. A folder that is not a real
        directory of this user's is never used: ``$TSM_HOME/ssh`` then raises one clear error; a kept
        temporary one is replaced by a new one.
        """
        from tsm.schedulers.common.files import NotPrivateError, own_private_dir

        if self._control_dir is None:
            from tsm.store import tsm_home

            home = tsm_home()
            d = home / "ssh"
            self._control_dir = d if _fits(d) else _short_control_dir(home)
        try:
            return own_private_dir(self._control_dir)
        except NotPrivateError as e:
            raise SchedulerUnavailableError(
                f"ssh control directory: {e}; tsm keeps its SSH connections only in a folder of yours alone "
                "(remove it, or set TSM_HOME elsewhere)") from e
        except OSError as e:
            raise SchedulerUnavailableError(f"ssh control directory {self._control_dir}: {e.strerror or e}") from e

    def ssh_args(self, command: str) -> list[str]:
        """The full ``ssh`` argument list that runs the (already quoted) ``command`` on the host."""
        args = [
            self._ssh,
            "-o", "BatchMode=yes",
            "-o", "StrictHostKeyChecking=yes",
            "-o", "ControlMaster=auto",
            "-o", f"ControlPath={self.control_dir()}/%C",
            "-o", f"ControlPersist={CONTROL_PERSIST}",
            "-o", f"ConnectTimeout={self._connect_timeout}",
            "-o", "ServerAliveInterval=5",
            "-o", "ServerAliveCountMax=3",
            "-o", "LogLevel=ERROR",
            "-T",
        ]  # fmt: skip
        for opt in self.options:
            args += ["-o", opt]
        if self.target.user:
            args += ["-l", self.target.user]
        if self.target.port:
            args += ["-p", str(self.target.port)]
        return [*args, "--", self.target.host, command]

    def run_bytes(
        self, args: Sequence[str], *, input: bytes | None = None, timeout: float = 60.0
    ) -> subprocess.CompletedProcess[bytes]:
        """Run ``args`` on the host; return it finished (any remote exit status) with bytes output.

        ``ssh``'s own failure (exit 255) raises the :class:`SshError` that :func:`classify` picks; no answer
        within ``timeout`` seconds is a :class:`SshConnectionLostError`.
        """
        name = os.path.basename(args[0]) if args else ""
        with self._lock:
            self.calls[name] = self.calls.get(name, 0) + 1
            self.bytes_sent += len(input or b"")
        argv = self.ssh_args(quote_command(args))
        try:
            proc = subprocess.run(
                argv, input=input, capture_output=True, timeout=timeout,
                stdin=None if input is not None else subprocess.DEVNULL,
            )  # fmt: skip
        except FileNotFoundError as e:
            raise SchedulerUnavailableError(
                f"ssh {self.target}: no ssh client found ({self._ssh}); install OpenSSH's client"
            ) from e
        except subprocess.TimeoutExpired as e:
            out = e.stdout if isinstance(e.stdout, bytes) else b""
            raise SshConnectionLostError(
                f"ssh {self.target}: no answer within {timeout:.0f}s while running {name}", stdout=out
            ) from e
        if proc.returncode == 255:
            raise classify(self.target, proc.stderr.decode("utf-8", "replace"), proc.stdout)
        return proc

    def run(
        self, args: Sequence[str], *, input: str | None = None, timeout: float = 60.0
    ) -> subprocess.CompletedProcess[str]:
        """:meth:`run_bytes` with text in and out (UTF-8, undecodable bytes kept as surrogate escapes)."""
        proc = self.run_bytes(
            args, input=input.encode("utf-8", "surrogateescape") if input is not None else None, timeout=timeout
        )
        return subprocess.CompletedProcess(
            proc.args, proc.returncode, proc.stdout.decode("utf-8", "surrogateescape"),
            proc.stderr.decode("utf-8", "replace"),
        )  # fmt: skip

    def close(self) -> None:
        """Stop the master connection (``ssh -O exit``); later calls open a new one."""
        argv = self.ssh_args("true")
        argv = [argv[0], "-O", "exit", *argv[1:-1]]
        subprocess.run(argv, capture_output=True, timeout=10, stdin=subprocess.DEVNULL, check=False)


def _fits(folder: Path) -> bool:
    """Whether a control socket in ``folder`` (``/%C``, 41 bytes, plus ssh's 17-byte suffix) fits a socket name."""
    return len(os.fsencode(folder)) + 58 <= 104


def _short_control_dir(home: Path) -> Path:
    """The temporary folder this home's control sockets live in when ``$TSM_HOME/ssh`` is too long a path.

    Made by :func:`tempfile.mkdtemp` (a random name, created 0700 by this process, so nobody can have made it
    first), its path kept in ``$TSM_HOME/ssh.dir``; the kept one is used while it is still a folder of this
    user's that fits, else a new one is made (after a reboot cleared the temporary directory).
    """
    import tempfile

    from tsm.schedulers.common.files import NotPrivateError, own_private_dir, read_text, write_atomic

    pointer = home / "ssh.dir"
    kept = (read_text(pointer) or "").strip()
    if kept and os.path.isabs(kept) and _fits(Path(kept)):
        try:
            return own_private_dir(Path(kept))
        except OSError:  # gone, or not ours (any more): make another
            pass
    made = Path(tempfile.mkdtemp(prefix="tsm-ssh-"))
    if not _fits(made):
        os.rmdir(made)
        made = Path(tempfile.mkdtemp(prefix="tsm-ssh-", dir="/tmp"))
    if not _fits(made):
        os.rmdir(made)
        raise NotPrivateError(f"no temporary directory short enough for an ssh control socket ({made.parent})")
    write_atomic(pointer, f"{made}\n")
    return made


_connections: dict[tuple[SshTarget, tuple[str, ...]], SshConnection] = {}
_connections_lock = threading.Lock()


def connection(target: SshTarget, options: Sequence[str] = ()) -> SshConnection:
    """The process's one :class:`SshConnection` for ``target`` with ``options``."""
    key = (target, tuple(options))
    with _connections_lock:
        conn = _connections.get(key)
        if conn is None:
            conn = _connections[key] = SshConnection(target, options)
        return conn
