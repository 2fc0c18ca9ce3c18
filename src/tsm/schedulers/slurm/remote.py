"""Slurm on a login node reached over SSH (``-c ssh=[user@]host[:port]``): submit, describe, follow, cancel.

Every Slurm command runs on the login node through one multiplexed OpenSSH connection per host
(:mod:`tsm.schedulers.common.ssh`); the job directory and the logs live on the cluster, under
``remote_home`` (default ``~/.tsm`` there, resolved once per process with the remote ``$HOME``). What stays
on this machine is the app's record, ``$TSM_HOME/slurm/remote/<app id>.json``: the target, its ssh options
and the remote job directory. A remote app's id is ``<host slug>-<job id>`` (e.g. ``alice_login_2222-4242``),
so it never collides with a local job id and names where to ask.

* **Submission** is one remote command fed one tar stream on stdin: it makes the job directory (0700),
  unpacks ``app.json`` and ``job.sbatch`` and runs ``sbatch``. It is idempotent: the job directory's random
  name is the submission's token; Slurm records it as the job's ``WorkDir``. When the connection drops
  during that command, tsm reconnects and asks ``squeue`` and ``sacct`` for a job with that ``WorkDir``
  before it submits again, so a job is never submitted twice.
* **Describe** asks the per-host :class:`~tsm.schedulers.slurm.queries.SlurmQueries` (one ``squeue`` over
  the connection serves every app of that host) and mirrors the job directory's small files (``app.json``,
  ``exit``, ``restarts``, the replicas' ``.status``) into ``$TSM_HOME/slurm/remote/<app id>/`` with one
  ``tar`` call for all the apps asked together; the local code then reads the mirror unchanged.
* **Logs** are read with ``tail -c +<offset>``: a follow keeps the byte offset of what it has received and
  resumes from it after a dropped connection, so every line comes once and in order.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shlex
import subprocess
import tarfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from tsm.errors import InvalidRunOptionError, SchedulerUnavailableError, SubmissionError
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
from tsm.schedulers.slurm.queries import SlurmQueries
from tsm.schedulers.slurm.script import JOB_FILES, SlurmBatchRequest


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


@dataclass
class RemoteBatchRequest(SlurmBatchRequest):
    """A :class:`SlurmBatchRequest` submitted on a remote login node (``ssh``, with ``ssh_options``)."""

    ssh: str = ""
    ssh_options: list[str] | None = None
    #: the remote ``remote_home`` (absolute) and the workspace snapshots to ship there before ``sbatch``
    remote_home: str = ""
    workspaces: list[str] | None = None


#: The remote submission: ``sh -c SUBMIT tsm-submit <job dir> <token> <sbatch args...>``, tar on stdin.
SUBMIT = r"""
umask 077
d=$1; tok=$2; shift 2
command -v sbatch >/dev/null 2>&1 || { echo "tsm: sbatch not found on the remote PATH" >&2; exit 127; }
if [ -f "$d/app.json" ] && [ "$(cat "$d/submit_token" 2>/dev/null)" != "$tok" ]; then
  echo "tsm: job_dir $d already holds an app: choose another directory" >&2; exit 3
fi
mkdir -p "$d" && cd "$d" && tar -xzf - || exit 4
printf '%s\n' "$tok" >submit_token
out=$(sbatch "$@" job.sbatch) || exit 5
id=$(printf '%s\n' "$out" | tail -n 1 | cut -d';' -f1)
printf '%s\n' "$id" >job_id
printf '%s\n' "$id"
"""

#: Print ``<job id>|<WorkDir>`` of this user's jobs: squeue with every state (the controller keeps ended jobs
#: MinJobAge seconds, while slurmdbd may not have them yet), then sacct for older ones.
FIND = r"""
squeue --me -h -t all -o '%i|%Z' 2>/dev/null
sacct -n -P -X -S now-2days -o JobID,WorkDir 2>/dev/null
exit 0
"""

#: ``sh -c SMALL_FILES tsm-files <tails> <job dir>...``: a tar (from /) of each job directory's small files,
#: then, with ``tails`` = 1, a second tar of the last 4 KiB of every replica's stdout/stderr (a private
#: temporary directory, removed after): the views' last lines.
SMALL_FILES = r"""
tails=$1; shift
cd / || exit 1
files=
for d in "$@"; do
  for f in "$d"/app.json "$d"/exit "$d"/restarts "$d"/job_id "$d"/oom_nodes "$d"/*/*.status; do
    [ -f "$f" ] && files="$files
$f"
  done
done
[ -n "$files" ] && printf '%s\n' "$files" | sed -e '/^$/d' -e 's|^/||' | tar -cf - -T - 2>/dev/null
[ "$tails" = 1 ] || exit 0
t=$(mktemp -d) || exit 0
trap 'rm -rf "$t"' EXIT
for d in "$@"; do
  for f in "$d"/*/*.stdout "$d"/*/*.stderr; do
    [ -f "$f" ] && mkdir -p "$t$(dirname "$f")" && tail -c 4096 "$f" >"$t$f"
  done
done
cd "$t" && tar -cf - . 2>/dev/null
exit 0
"""


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

    def forget(self) -> None:
        with contextlib.suppress(OSError):
            (_records_dir() / f"{self.app_id}.json").unlink()

    @property
    def mirror(self) -> Path:
        """The local copy of the job directory's small files."""
        return _records_dir() / self.app_id


def is_remote_id(app_id: str) -> bool:
    """True for ``<host slug>-<job id>``, the id of an app submitted over SSH."""
    return re.fullmatch(r"[A-Za-z0-9_.]+-\d+", app_id) is not None


class Remote:
    """One login node: its connection, its status batcher and its ``$HOME``, shared by the process."""

    def __init__(self, conn: SshConnection) -> None:
        self.conn = conn
        self.queries = SlurmQueries(runner=lambda args: self.run(args))
        self._home: str | None = None
        self._python: str | None
        self._lock = threading.Lock()
        #: what the latest submission shipped of its workspaces (:class:`.workspace_ssh.ShipReport`)
        self.last_ship: list[Any] = []

    def run(
        self, args: list[str], *, input: str | None = None, timeout: float = 60.0
    ) -> subprocess.CompletedProcess[str]:
        """Run a Slurm command on the login node; a missing command says what is missing where."""
        proc = self.conn.run(args, input=input, timeout=timeout)
        if proc.returncode == 127 and args and not args[0].startswith("/") and args[0] != "sh":
            raise SchedulerUnavailableError(
                f"ssh {self.conn.target}: {args[0]} is not on the remote PATH (install the Slurm client tools "
                "there, or use a login node of the cluster)"
            )
        return proc

    def home(self) -> str:
        """The remote ``$HOME`` (asked once)."""
        with self._lock:
            if self._home is None:
                proc = self.conn.run(["sh", "-c", 'printf %s "$HOME"'], timeout=30)
                home = proc.stdout.strip()
                if proc.returncode != 0 or not home.startswith("/"):
                    raise SchedulerUnavailableError(f"ssh {self.conn.target}: cannot read the remote $HOME")
                self._home = home
            return self._home

    def python(self) -> str | None:
        """The ``python3`` (else ``python``) the login node's PATH finds, asked once; None when there is none.

        Over SSH it is the replicas' default interpreter (the one running tsm here means nothing there)."""
        with self._lock:
            if not hasattr(self, "_python"):
                proc = self.conn.run(["sh", "-c", "command -v python3 || command -v python; exit 0"], timeout=30)
                found = proc.stdout.strip().splitlines()
                self._python = found[0] if found and found[0].startswith("/") else None
            return self._python

    def resolve(self, path: str) -> str:
        """An absolute remote path: ``~`` and relative paths are taken from the remote ``$HOME``."""
        if path == "~" or path.startswith("~/"):
            return self.home() + path[1:]
        if not path.startswith("/"):
            return f"{self.home()}/{path}"
        return path

    # -- submission ---------------------------------------------------------------------------------------
    def submit(self, req: SlurmBatchRequest, *, retries: int = 5, pause: float = 1.0) -> str:
        """Submit once, idempotently (see the module docstring); returns the Slurm job id."""
        token = PurePosixPath(req.job_dir).name
        payload = _tar_job(req)
        for attempt in range(retries + 1):
            if attempt:
                found = self._find(req.job_dir, retries, pause)
                if found:
                    return found
            try:
                proc = self.conn.run_bytes(
                    ["sh", "-c", SUBMIT, "tsm-submit", req.job_dir, token, *req.sbatch_args], input=payload
                )
            except SshConnectionLostError:
                time.sleep(pause)
                continue  # it may have run: look for the job before submitting again
            out = proc.stdout.decode("utf-8", "replace").strip()
            err = proc.stderr.decode("utf-8", "replace").strip()
            if proc.returncode == 127:
                raise SchedulerUnavailableError(
                    f"ssh {self.conn.target}: sbatch is not on the remote PATH (install the Slurm client "
                    "tools there, or use a login node of the cluster)"
                )
            if proc.returncode != 0:
                line = err.splitlines()[-1] if err else f"exit {proc.returncode}"
                if "unable to contact slurm controller" in err.lower():
                    raise SchedulerUnavailableError(f"sbatch on {self.conn.target}: the Slurm controller cannot be reached ({line})")
                raise SubmissionError(f"sbatch on {self.conn.target} refused the job: {line}")
            job_id = out.splitlines()[-1].strip() if out else ""
            if not job_id.isdigit():
                raise SubmissionError(f"sbatch on {self.conn.target} gave no job id: {out!r} {err!r}")
            return job_id
        raise SshConnectionLostError(f"ssh {self.conn.target}: the connection kept dropping during submission")

    def _find(self, job_dir: str, retries: int, pause: float) -> str | None:
        """The id of a job already submitted from ``job_dir`` (its WorkDir), asked once the host answers."""
        for _ in range(retries + 1):
            try:
                proc = self.conn.run(["sh", "-c", FIND])
                break
            except SshError:
                time.sleep(pause)
        else:
            raise SshConnectionLostError(
                f"ssh {self.conn.target}: lost during submission and not back; check `squeue` there for "
                f"a job in {job_dir} before submitting again"
            )
        for line in proc.stdout.splitlines():
            jid, _, wd = line.partition("|")
            jid = jid.strip().split("+")[0]
            if wd.rstrip("/") == job_dir.rstrip("/") and jid.isdigit():
                return jid
        return None

    # -- files --------------------------------------------------------------------------------------------
    def mirror(self, records: Sequence[RemoteRecord], tails: bool = False) -> None:
        """Copy the small files of every record's job directory into its local mirror: one remote call.

        With ``tails``, each replica's ``.stdout``/``.stderr`` in the mirror is the last 4 KiB of the remote
        one (what the views' last line needs), in the same call.
        """
        if not records:
            return
        proc = self.conn.run_bytes(
            ["sh", "-c", SMALL_FILES, "tsm-files", "1" if tails else "0", *(r.job_dir for r in records)]
        )
        by_dir = {r.job_dir.strip("/"): r for r in records}
        if not proc.stdout:
            return
        # two archives back to back (small files, then tails): ignore_zeros reads past the first one's end
        with tarfile.open(fileobj=io.BytesIO(proc.stdout), mode="r:", ignore_zeros=True) as tar:
            for member in tar.getmembers():
                if not member.isfile():
                    continue
                name = member.name[2:] if member.name.startswith("./") else member.name
                rec = next((r for d, r in by_dir.items() if name.startswith(d + "/")), None)
                if rec is None:
                    continue
                rel = name[len(rec.job_dir.strip("/")) + 1 :]
                if ".." in rel or not re.fullmatch(
                    r"(app\.json|exit|restarts|job_id|oom_nodes|[^/]+/\d+\.(status|stdout|stderr))", rel
                ):
                    continue
                f = tar.extractfile(member)
                if f is None:
                    continue
                dest = rec.mirror / rel
                make_private_dirs(dest.parent)
                tmp = dest.with_name(dest.name + ".tmp")
                write_private(tmp, f.read().decode("utf-8", "surrogateescape"))
                os.replace(tmp, dest)

    def read(self, path: str) -> bytes:
        """A whole remote file (empty when it is not there)."""
        return self.conn.run_bytes(["sh", "-c", 'cat -- "$1" 2>/dev/null; exit 0', "tsm-cat", path]).stdout

    def mtimes(self, paths: Sequence[str]) -> dict[str, float]:
        """The last-modified time of each remote file that exists: one call."""
        script = 'for f; do t=$(stat -c %Y -- "$f" 2>/dev/null) && printf "%s %s\\n" "$t" "$f"; done; exit 0'
        out: dict[str, float] = {}
        for line in self.conn.run(["sh", "-c", script, "tsm-stat", *paths]).stdout.splitlines():
            t, _, path = line.partition(" ")
            if t.isdigit():
                out[path] = float(t)
        return out

    def reader(self, path: str, *, give_up_after: float = 120.0) -> Callable[[], bytes]:
        """A ``read_new`` for :func:`~tsm.schedulers.common.logs.follow` over the connection.

        Each call returns the bytes appended to ``path`` since the last (``tail -c +<offset+1>``). When the
        connection drops, the bytes received before the drop are kept and counted, and the next call
        resumes from there: nothing is delivered twice or skipped. After ``give_up_after`` seconds without
        a working connection the last error is raised.
        """
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

    def cancel(self, job_id: str) -> None:
        """``scancel`` the job; an ended or unknown job is not an error."""
        proc = self.run(["scancel", job_id])
        err = proc.stderr.lower()
        if proc.returncode != 0 and "already completing or completed" not in err and "invalid job id" not in err:
            raise SubmissionError(f"scancel {job_id} on {self.conn.target} failed: {proc.stderr.strip()}")
        self.queries.invalidate()

    def remove(self, rec: RemoteRecord, roles: Sequence[str]) -> None:
        """Delete the files tsm and Slurm wrote in the remote job directory, then the empty directories."""
        names = [shlex.quote(n) for n in JOB_FILES]
        script = (
            'd=$1; shift; cd "$d" 2>/dev/null || exit 0; for r in "$@"; do rm -f -- "$r"/*.stdout "$r"/*.stderr '
            '"$r"/*.status; rmdir -- "$r" 2>/dev/null; done; rm -f -- ' + " ".join(names) +
            '; cd / && rmdir -- "$d" 2>/dev/null; exit 0'
        )
        self.conn.run(["sh", "-c", script, "tsm-rm", rec.job_dir, *roles])


def _tar_job(req: SlurmBatchRequest) -> bytes:
    """The job directory's first files as one gzipped tar stream (0600 files, 0700 role directories)."""
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
    return buf.getvalue()


_remotes: dict[tuple[str, tuple[str, ...]], Remote] = {}
_remotes_lock = threading.Lock()


def remote(target: str, options: Sequence[str] = ()) -> Remote:
    """The process's one :class:`Remote` for a target and its options."""
    opts = tuple(parse_ssh_options(list(options)))
    key = (target, opts)
    with _remotes_lock:
        r = _remotes.get(key)
        if r is None:
            r = _remotes[key] = Remote(connection(SshTarget.parse(target), opts))
        return r


def remote_of(rec: RemoteRecord) -> Remote:
    """The :class:`Remote` an app's record names."""
    return remote(rec.target, rec.options)
