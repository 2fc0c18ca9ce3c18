"""A login node reached over SSH (``-c ssh=[user@]host[:port]``) as a :class:`~.host.Host`.

Every command runs there through one multiplexed OpenSSH connection per host
(:mod:`tsm.schedulers.common.ssh`); the job directory and the logs are on the cluster, under ``remote_home``
(default ``~/.tsm`` there). This machine keeps the app's record, ``$TSM_HOME/slurm/remote/<app id>.json``
(the target, its ssh options and the remote job directory), and a mirror of the job directory's small files
beside it, ``$TSM_HOME/slurm/remote/<app id>/``, which ``describe`` reads as it reads a local job directory.
An app's id is ``<host slug>-<job id>``: it never collides with a local job id, and names where to ask.

* Submission is one remote command fed one tar stream (``programs/submit.sh``). The job directory's random
  name is its token, and Slurm records the directory as the job's ``WorkDir``: when the connection drops
  during that command, tsm reconnects and looks for a job with that ``WorkDir`` (``programs/find.sh``)
  before it submits again, so a job is never submitted twice.
* The mirror is refreshed with one ``tar`` call for all the apps asked together (``programs/files.sh``),
  until the batch script has written its final exit code.
* Logs are read with ``tail -c +<offset>``: a follow keeps the byte offset of what it has received and
  resumes from it after a dropped connection, so every line comes once and in order.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import subprocess
import tarfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from tsm.errors import InvalidRunOptionError, SchedulerUnavailableError
from tsm.schedulers.common.files import make_private_dirs, write_private
from tsm.schedulers.common.options import RunOptions, option
from tsm.schedulers.common.ssh import (
    SshConnection,
    SshConnectionLostError,
    SshError,
    SshTarget,
    connection,
    parse_ssh_options,
)
from tsm.schedulers.slurm import cli, programs, secrets as slurm_secrets
from tsm.schedulers.slurm.host import Host, Where
from tsm.schedulers.slurm.jobdir import DESCRIBED
from tsm.schedulers.slurm.parse import SlurmJob
from tsm.schedulers.slurm.queries import SlurmQueries
from tsm.schedulers.slurm.script import SlurmBatchRequest
from tsm.schedulers.slurm.workspace_ssh import remote_workspace_roles, ship
from tsm.specs.api import AppDef


@dataclass(frozen=True)
class SshOptions(RunOptions):
    """The run options that send a Slurm app to a remote login node."""

    ssh: str | None = option(
        "run on the cluster through this SSH login node: [user@]host[:port] (or a ~/.ssh/config alias); "
        "every Slurm command goes over one multiplexed connection"
    )
    ssh_options: list[str] | None = option(
        "extra ssh -o options, 'Key Value' each (e.g. 'IdentityFile ~/.ssh/hpc'); host keys are always checked"
    )
    remote_home: str | None = option("tsm's directory on the cluster, for job directories; default ~/.tsm there")

    def check(self) -> None:
        """Refuse a malformed target or option before anything is built."""
        if self.ssh is not None:
            SshTarget.parse(self.ssh)
        parse_ssh_options(self.ssh_options)
        if (self.ssh_options or self.remote_home) and not self.ssh:
            raise InvalidRunOptionError("ssh_options and remote_home need ssh=[user@]host[:port]")


#: tsm's id of an app on a login node: ``<host slug>-<job id>``.
REMOTE_ID = re.compile(r"[A-Za-z0-9_.]+-\d+")


def is_remote_id(app_id: str) -> bool:
    """True for ``<host slug>-<job id>``, the id of an app submitted over SSH."""
    return REMOTE_ID.fullmatch(app_id) is not None


def _records_dir() -> Path:
    from tsm.store import tsm_home

    return tsm_home() / "slurm" / "remote"


@dataclass(frozen=True)
class RemoteRecord:
    """What this machine keeps of a remote app: where it runs and where its files are."""

    app_id: str
    job_id: str
    target: str
    options: tuple[str, ...]
    job_dir: str

    def save(self) -> None:
        d = _records_dir()
        make_private_dirs(d)
        data = {"job_id": self.job_id, "ssh": self.target, "ssh_options": list(self.options), "job_dir": self.job_dir}
        write_private(d / f"{self.app_id}.json", json.dumps(data) + "\n")

    @classmethod
    def load(cls, app_id: str) -> RemoteRecord | None:
        if not is_remote_id(app_id):
            return None
        try:
            data = json.loads((_records_dir() / f"{app_id}.json").read_text())
        except (OSError, ValueError):
            return None
        return cls(app_id, str(data["job_id"]), str(data["ssh"]), tuple(data.get("ssh_options") or ()), str(data["job_dir"]))

    @classmethod
    def all(cls) -> list[RemoteRecord]:
        try:
            names = sorted(p.stem for p in _records_dir().glob("*.json"))
        except OSError:
            return []
        return [r for r in (cls.load(n) for n in names) if r is not None]



def _mirror_of(where: Where) -> Path:
    """The local copy of a remote app's job directory's small files."""
    return _records_dir() / where.app_id


def _final(mirror: Path) -> bool:
    """Whether a mirror holds the batch script's last word (its exit code: nothing changes after it)."""
    try:
        return (mirror / "exit").read_text().strip().isdigit()
    except OSError:
        return False


#: A file of a job directory a mirror keeps: the top's small files and the replicas' status (and log tails).
_MIRRORED = re.compile(r"(" + "|".join(re.escape(n) for n in DESCRIBED) + r"|[^/]+/\d+\.(status|stdout|stderr))")
#: Mirrored files an attempt of the job may remove (each attempt starts without its predecessor's records).
_KEPT = frozenset({"app.json", "job_id"})


class SshHost(Host):
    """One login node: its connection, its status batcher and its ``$HOME``, shared by the process."""

    def __init__(self, conn: SshConnection, target: str | None = None, options: Sequence[str] = ()) -> None:
        super().__init__(SlurmQueries(runner=lambda args: self.run(args)), f" on {conn.target}")
        self.conn = conn
        #: the target and ssh options as the run options gave them (what an app's record keeps)
        self.target, self.options = target or str(conn.target), tuple(options)
        self._home: str | None = None
        self._python: list[str | None] = []
        self._version: tuple[int, int] | None = None
        self._lock = threading.Lock()
        #: what the latest submission shipped of its workspaces (:class:`.workspace_ssh.ShipReport`)
        self.last_ship: list[Any] = []

    # -- commands ----------------------------------------------------------------------------------------
    def run(self, args: list[str], *, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        """Run a Slurm command on the login node; a missing command says what is missing where."""
        proc = self.conn.run(args, timeout=timeout)
        name = cli.command_name(args)
        if proc.returncode == 127 and not name.startswith("/"):
            raise SchedulerUnavailableError(
                f"ssh {self.conn.target}: {name} is not on the remote PATH (install the Slurm client tools "
                "there, or use a login node of the cluster)"
            )
        return proc

    def sh(self, program: str, *args: str, input: bytes | None = None,
           timeout: float = 60.0) -> subprocess.CompletedProcess[bytes]:
        tag = "tsm-" + program.rsplit(".", 1)[0]
        return self.conn.run_bytes(["sh", "-c", programs.text(program), tag, *args], input=input, timeout=timeout)

    # -- naming ------------------------------------------------------------------------------------------
    def app_id(self, job_id: str) -> str:
        return f"{self.conn.target.slug()}-{job_id}"

    def remember(self, app_id: str, job_id: str, job_dir: str) -> None:
        RemoteRecord(app_id, job_id, self.target, self.options, job_dir).save()

    def forget(self, where: Where) -> None:
        shutil.rmtree(_mirror_of(where), ignore_errors=True)
        with contextlib.suppress(OSError):
            (_records_dir() / f"{where.app_id}.json").unlink()
        _WHERE.pop(where.app_id, None)

    # -- the dry run -------------------------------------------------------------------------------------
    def home(self, remote_home: str | None) -> str:
        return self.resolve(remote_home or "~/.tsm")

    def _remote_home(self) -> str:
        """The remote ``$HOME`` (asked once)."""
        with self._lock:
            if self._home is None:
                proc = self.conn.run(["sh", "-c", 'printf %s "$HOME"'], timeout=30)
                home = proc.stdout.strip()
                if proc.returncode != 0 or not home.startswith("/"):
                    raise SchedulerUnavailableError(f"ssh {self.conn.target}: cannot read the remote $HOME")
                self._home = home
            return self._home

    def resolve(self, path: str) -> str:
        """An absolute remote path: ``~`` and relative paths are taken from the remote ``$HOME``."""
        if path == "~" or path.startswith("~/"):
            return self._remote_home() + path[1:]
        if not path.startswith("/"):
            return f"{self._remote_home()}/{path}"
        return path

    def python(self) -> str | None:
        """The ``python3`` (else ``python``) the login node's PATH finds, asked once; None when there is none.

        It is the replicas' default interpreter over SSH (the one running tsm here means nothing there)."""
        with self._lock:
            if not self._python:
                proc = self.conn.run(["sh", "-c", "command -v python3 || command -v python; exit 0"], timeout=30)
                found = proc.stdout.strip().splitlines()
                self._python.append(found[0] if found and found[0].startswith("/") else None)
            return self._python[0]

    def slurm_version(self) -> tuple[int, int]:
        with self._lock:
            if self._version is None:
                self._version = cli.parse_version(cli.check(self.run(["sbatch", "--version"], timeout=20),
                                                            f"sbatch --version{self.where_said}"))
            return self._version

    def submit_dir(self, job_dir: str) -> str:
        return job_dir  # this machine's working directory means nothing on the cluster

    def place(self, app: AppDef, home: str) -> list[str]:
        return remote_workspace_roles(app, home)

    # -- submission ----------------------------------------------------------------------------------------
    def submit(self, req: SlurmBatchRequest, secrets: slurm_secrets.Delivery | None = None, *, retries: int = 5,
               pause: float = 1.0) -> str:
        """Ship the request's workspaces, then submit once, idempotently (see the module docstring). The files
        of ``secrets`` travel in the submission's own stream, straight into the remote job directory."""
        self.last_ship = [ship(self.conn, req.remote_home, d) for d in req.workspaces or []]
        token = PurePosixPath(req.job_dir).name
        payload = _tar_job(req, secrets.values if secrets is not None else None)
        for attempt in range(retries + 1):
            if attempt:
                found = self._find(req.job_dir, retries, pause)
                if found:
                    return found
            try:
                proc = self.sh("submit.sh", req.job_dir, token, *req.sbatch_args, input=payload)
            except SshConnectionLostError:
                time.sleep(pause)
                continue  # it may have run: look for the job before submitting again
            if proc.returncode == 127:
                raise SchedulerUnavailableError(
                    f"ssh {self.conn.target}: sbatch is not on the remote PATH (install the Slurm client "
                    "tools there, or use a login node of the cluster)"
                )
            text = subprocess.CompletedProcess(proc.args, proc.returncode, proc.stdout.decode("utf-8", "replace"),
                                               proc.stderr.decode("utf-8", "replace"))  # fmt: skip
            return cli.job_id_of(text, self.where_said)
        raise SshConnectionLostError(f"ssh {self.conn.target}: the connection kept dropping during submission")

    def _find(self, job_dir: str, retries: int, pause: float) -> str | None:
        """The id of a job already submitted from ``job_dir`` (its WorkDir), asked once the host answers."""
        for _ in range(retries + 1):
            try:
                proc = self.sh("find.sh")
                break
            except SshError:
                time.sleep(pause)
        else:
            raise SshConnectionLostError(
                f"ssh {self.conn.target}: lost during submission and not back; check `squeue` there for "
                f"a job in {job_dir} before submitting again"
            )
        for line in proc.stdout.decode("utf-8", "replace").splitlines():
            jid, _, wd = line.partition("|")
            jid = jid.strip().split("+")[0]
            if wd.rstrip("/") == job_dir.rstrip("/") and jid.isdigit():
                return jid
        return None

    # -- files ---------------------------------------------------------------------------------------------
    def local_dir(self, where: Where, recs: list[SlurmJob] | None) -> Path | None:
        mirror = _mirror_of(where)
        return mirror if (mirror / "app.json").is_file() else None

    def sync(self, wheres: Sequence[Where], tails: bool = False) -> None:
        """Copy the small files of every app's job directory (those :data:`~.jobdir.DESCRIBED` names, and its
        replicas' status) into its mirror, in one remote call; files gone there are removed here (each attempt
        removes its predecessor's records). With ``tails``, each replica's ``.stdout``/``.stderr`` in the mirror
        is the last 4 KiB of the remote one. A mirror that holds the final exit code is left as it is."""
        todo = [w for w in wheres if w.job_dir and not _final(_mirror_of(w))]
        if not todo:
            return
        proc = self.sh("files.sh", "1" if tails else "0", " ".join(DESCRIBED), *(w.job_dir or "" for w in todo))
        if proc.stdout:
            _unpack(proc.stdout, todo, tails)

    def sync_in_background(self, wheres: Sequence[Where], tails: bool = False) -> Callable[[], None]:
        failed: list[BaseException] = []

        def run() -> None:
            try:
                self.sync(wheres, tails)
            except BaseException as e:  # noqa: BLE001 - handed to the caller's thread by join()
                failed.append(e)

        t = threading.Thread(target=run, name="tsm-slurm-mirror", daemon=True)
        t.start()

        def join() -> None:
            t.join()
            if failed:
                raise failed[0]

        return join

    def read(self, path: str) -> bytes:
        return self.conn.run_bytes(["sh", "-c", 'cat -- "$1" 2>/dev/null; exit 0', "tsm-cat", path]).stdout

    def mtimes(self, paths: Sequence[str]) -> dict[str, float]:
        script = 'for f; do t=$(stat -c %Y -- "$f" 2>/dev/null) && printf "%s %s\\n" "$t" "$f"; done; exit 0'
        out: dict[str, float] = {}
        for line in self.conn.run(["sh", "-c", script, "tsm-stat", *paths]).stdout.splitlines():
            t, _, path = line.partition(" ")
            if t.isdigit():
                out[path] = float(t)
        return out

    def reader(self, path: str, *, give_up_after: float = 120.0) -> Callable[[], bytes]:
        """Each call returns the bytes appended to ``path`` since the last (``tail -c +<offset+1>``). When the
        connection drops, the bytes received before the drop are kept and counted, and the next call resumes
        from there: nothing is delivered twice or skipped. After ``give_up_after`` seconds without a working
        connection the last error is raised."""
        offset = 0
        failing_since: float | None = None

        def read_new() -> bytes:
            nonlocal offset, failing_since
            try:
                data = self.conn.run_bytes(
                    ["sh", "-c", 'tail -c +"$1" -- "$2" 2>/dev/null; exit 0', "tsm-tail", str(offset + 1), path]
                ).stdout
                failing_since = None
            except SshError as e:
                data = e.stdout
                now = time.monotonic()
                failing_since = failing_since or now
                if now - failing_since > give_up_after:
                    raise
            offset += len(data)
            return data

        return read_new


def _unpack(archives: bytes, wheres: Sequence[Where], tails: bool) -> None:
    """Write the files of the tar streams ``archives`` (small files, then tails: back to back) into the mirrors
    of ``wheres``. A job directory the stream holds files of loses, in its mirror, the records of an attempt the
    stream lacks (the job's next attempt removed them there)."""
    by_dir = {w.job_dir.strip("/"): w for w in wheres if w.job_dir}
    got: dict[str, set[str]] = {}
    with tarfile.open(fileobj=io.BytesIO(archives), mode="r:", ignore_zeros=True) as tar:
        for member in tar.getmembers():
            parts = member.name.removeprefix("./").split("/")
            # <job dir>/<name> or <job dir>/<role>/<k>.<ext>
            found = [(d, "/".join(parts[-n:])) for n in (1, 2) if (d := "/".join(parts[:-n])) in by_dir]
            f = tar.extractfile(member) if member.isfile() and found else None
            if f is None or not _MIRRORED.fullmatch(found[0][1]) or ".." in parts:
                continue
            d, rel = found[0]
            dest = _mirror_of(by_dir[d]) / rel
            make_private_dirs(dest.parent)
            tmp = dest.with_name(dest.name + ".tmp")
            write_private(tmp, f.read().decode("utf-8", "surrogateescape"))
            os.replace(tmp, dest)
            got.setdefault(d, set()).add(rel)
    for d, names in got.items():
        mirror = _mirror_of(by_dir[d])
        for path in [*mirror.glob("*"), *mirror.glob("*/*.status"), *(mirror.glob("*/*.std*") if tails else [])]:
            rel = path.relative_to(mirror).as_posix()
            if rel not in names and rel not in _KEPT and _MIRRORED.fullmatch(rel) and path.is_file():
                path.unlink(missing_ok=True)


def _tar_job(req: SlurmBatchRequest, secrets: Mapping[str, str] | None = None) -> bytes:
    """The job directory's first files as one gzipped tar stream (0600 files, 0700 role directories), with the
    secrets' folder when there are ``secrets`` (:func:`.secrets.add_to_tar`); built in memory, never saved."""
    buf = io.BytesIO()
    now = time.time()
    with tarfile.open(fileobj=buf, mode="w:gz", format=tarfile.PAX_FORMAT, compresslevel=6) as tar:
        for role in req.roles:
            info = tarfile.TarInfo(role)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o700, now
            tar.addfile(info)
        for name, text in (("app.json", req.app_json), ("job.sbatch", req.script)):
            data = text.encode("utf-8", "surrogateescape")
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o600, now
            tar.addfile(info, io.BytesIO(data))
        if secrets:
            slurm_secrets.add_to_tar(tar, secrets, now)
    return buf.getvalue()


_hosts: dict[tuple[str, tuple[str, ...]], SshHost] = {}
_hosts_lock = threading.Lock()
#: app id -> where it lives, for every remote app looked up in this process (records never change)
_WHERE: dict[str, Where] = {}


def ssh_host(target: str, options: Sequence[str] = ()) -> SshHost:
    """The process's one :class:`SshHost` for a target and its options."""
    opts = tuple(parse_ssh_options(list(options)))
    key = (target, opts)
    with _hosts_lock:
        host = _hosts.get(key)
        if host is None:
            host = _hosts[key] = SshHost(connection(SshTarget.parse(target), opts), target, opts)
        return host


def where(app_id: str) -> Where | None:
    """Where the remote app ``app_id`` lives, from its record here; None when this machine has none."""
    found = _WHERE.get(app_id)
    if found is None:
        rec = RemoteRecord.load(app_id)
        if rec is None:
            return None
        found = _WHERE[app_id] = Where(app_id, rec.job_id, ssh_host(rec.target, rec.options), rec.job_dir)
    return found


def recorded() -> list[tuple[SshHost, list[Where]]]:
    """Every remote app this machine has a record of, by host."""
    by_host: dict[int, tuple[SshHost, list[Where]]] = {}
    for rec in RemoteRecord.all():
        w = where(rec.app_id)
        if w is not None and isinstance(w.host, SshHost):
            by_host.setdefault(id(w.host), (w.host, []))[1].append(w)
    return list(by_host.values())
