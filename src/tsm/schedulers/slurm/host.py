"""Where an app's Slurm commands run and its job directory lives: this machine, or a login node over SSH.

A :class:`Host` is chosen once per app (by the dry run's run options, then by the app id: a job id is this
machine's, ``<host slug>-<job id>`` a login node's, :mod:`.ssh_host`) and carried with it as a
:class:`Where`. Everything the scheduler does to an app goes through it, so local and remote Slurm are one
code path: the host runs Slurm's commands (:meth:`Host.run`) and the package's small shell programs
(:meth:`Host.sh`), owns the app's status batcher (:attr:`Host.queries`), submits, and reads the job
directory's files; :meth:`Host.local_dir` is where this machine reads the job directory's small files (the
directory itself here, a mirror of it for a login node's).
"""

from __future__ import annotations

import abc
import contextlib
import os
import subprocess
import threading
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

from tsm.errors import SchedulerError, SubmissionError
from tsm.schedulers.common.files import make_private_dirs, read_text, unlink, write_private
from tsm.schedulers.common.logs import file_reader
from tsm.schedulers.slurm import cli, programs, secrets as slurm_secrets
from tsm.schedulers.slurm.describe import load_app
from tsm.schedulers.slurm.jobdir import CANCEL_MARK, JOB_FILES, JobDir
from tsm.schedulers.slurm.parse import SlurmJob, stranded
from tsm.schedulers.slurm.queries import SlurmQueries
from tsm.schedulers.slurm.script import SlurmBatchRequest
from tsm.specs.api import AppDef


@dataclass(frozen=True)
class Where:
    """An app and where it lives: its host, its Slurm job id there, and its job directory there when known."""

    app_id: str
    job_id: str
    host: Host
    job_dir: str | None = None


class RecordCache:
    """The job directory (as this machine reads it) and app of each app id of a host, kept once read.

    They never change after submission (``app.json`` is written once, before ``sbatch``), and reading them is
    most of what ``describe`` costs beyond the shared ``squeue``. An entry is dropped by ``remove`` and
    ignored once its directory is gone; at most :attr:`LIMIT` apps are kept (the oldest go first). The cached
    ``AppDef`` is shared by the descriptions of one app: treat ``DescribeAppResponse.app`` as read-only.
    """

    LIMIT = 20000

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: dict[str, tuple[Path, AppDef]] = {}

    def get(self, app_id: str) -> tuple[Path, AppDef] | None:
        return self._items.get(app_id)

    def put(self, app_id: str, job_dir: Path, app: AppDef) -> None:
        with self._lock:
            self._items[app_id] = (job_dir, app)
            while len(self._items) > self.LIMIT:
                del self._items[next(iter(self._items))]

    def forget(self, app_id: str) -> None:
        with self._lock:
            self._items.pop(app_id, None)


class Host(abc.ABC):
    """Where Slurm commands run and job directories live; see the module docstring.

    A subclass gives the commands (:meth:`run`, :meth:`sh`), the naming of its apps, the dry run's facts
    (:meth:`home`, :meth:`resolve`, ...), submission, and file access; what is built on those (the cancel's
    warning, removal) is written once, here.
    """

    def __init__(self, queries: SlurmQueries, where_said: str = "") -> None:
        #: the status batcher of this host's queue: one ``squeue`` per refresh serves every app of the host
        self.queries = queries
        #: how messages name the host: "" for this machine, `` on alice@login`` for a login node
        self.where_said = where_said
        #: the job directories and apps of this host's apps read so far
        self.records = RecordCache()
        #: (app id, the leader's restarts) of heterogeneous apps this host was asked to requeue whole
        self._requeued: set[tuple[str, int]] = set()

    # -- commands ----------------------------------------------------------------------------------------
    @abc.abstractmethod
    def run(self, args: list[str], *, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        """Run one Slurm command (an argument list) there; returned finished, whatever its code."""

    @abc.abstractmethod
    def sh(self, program: str, *args: str, input: bytes | None = None,
           timeout: float = 60.0) -> subprocess.CompletedProcess[bytes]:
        """Run the package's POSIX sh program ``program`` (``"warn.sh"``, :mod:`.programs`) there with ``args``."""

    # -- naming ------------------------------------------------------------------------------------------
    @abc.abstractmethod
    def app_id(self, job_id: str) -> str:
        """tsm's app id of this host's job ``job_id``."""

    @abc.abstractmethod
    def remember(self, app_id: str, job_id: str, job_dir: str) -> None:
        """Keep this machine's record of a submitted app (which leads back to its host and job directory)."""

    @abc.abstractmethod
    def forget(self, where: Where) -> None:
        """Drop this machine's record of the app (and any copy of its files)."""

    # -- the dry run -------------------------------------------------------------------------------------
    @abc.abstractmethod
    def home(self, remote_home: str | None) -> str:
        """tsm's own directory there (job directories go under ``<home>/slurm/jobs``)."""

    @abc.abstractmethod
    def resolve(self, path: str) -> str:
        """``path`` (``~``, relative or absolute) as an absolute path there."""

    @abc.abstractmethod
    def python(self) -> str | None:
        """The replicas' default interpreter when the app names none (None: tsm's own rule, locally)."""

    @abc.abstractmethod
    def slurm_version(self) -> tuple[int, int]:
        """The Slurm version of that host's ``sbatch`` (asked once)."""

    @abc.abstractmethod
    def submit_dir(self, job_dir: str) -> str:
        """The directory the replicas run in when a role names none."""

    @abc.abstractmethod
    def place(self, app: AppDef, home: str) -> list[str]:
        """Point the roles that run in a local workspace snapshot at their copy there; what to ship."""

    # -- submission and files ----------------------------------------------------------------------------
    @abc.abstractmethod
    def submit(self, req: SlurmBatchRequest, secrets: slurm_secrets.Delivery | None = None) -> str:
        """Make the job directory of ``req`` (with the files of ``secrets``, :mod:`.secrets`) and ``sbatch``
        its script unchanged; the Slurm job id."""

    @abc.abstractmethod
    def local_dir(self, where: Where, recs: list[SlurmJob] | None) -> Path | None:
        """Where this machine reads the app's job directory's small files (None when they cannot be found)."""

    @abc.abstractmethod
    def sync(self, wheres: Sequence[Where], tails: bool = False) -> None:
        """Bring :meth:`local_dir` of these apps up to date (with their logs' last lines when ``tails``)."""

    def sync_in_background(self, wheres: Sequence[Where], tails: bool = False) -> Callable[[], None]:
        """:meth:`sync` while the caller does something else; the callable returned waits for it."""
        self.sync(wheres, tails)
        return lambda: None

    @abc.abstractmethod
    def read(self, path: str) -> bytes:
        """A whole file there (empty when it is not there)."""

    @abc.abstractmethod
    def reader(self, path: str) -> Callable[[], bytes]:
        """A ``read_new`` for :func:`~tsm.schedulers.common.logs.follow`: what was appended since the last call."""

    @abc.abstractmethod
    def mtimes(self, paths: Sequence[str]) -> dict[str, float]:
        """The last-modified time of each of ``paths`` that exists there."""

    # -- built on the above --------------------------------------------------------------------------------
    def job_files(self, where: Where, recs: list[SlurmJob] | None) -> tuple[JobDir | None, AppDef | None]:
        """The app's job directory as this machine reads it (:meth:`local_dir`) and the app as submitted, kept
        once read (:attr:`records`); ``recs`` (Slurm's records of the job) lead to it through its ``WorkDir``
        when nothing here does."""
        known = self.records.get(where.app_id)
        if known is not None and os.path.isdir(known[0]):
            return JobDir(known[0]), known[1]
        path = self.local_dir(where, recs)
        job_dir = JobDir(path) if path is not None else None
        app = load_app(job_dir)
        if path is not None and app is not None:
            self.records.put(where.app_id, path, app)
        return job_dir, app

    def requeue_stranded(self, where: Where, recs: list[SlurmJob] | None) -> None:
        """Requeue the components of a heterogeneous app Slurm left behind when it requeued the rest (see
        :func:`~tsm.schedulers.slurm.parse.stranded`); once per app and restart.

        Done by whichever look sees it (``tsm status``, ``wait``, the views, a sweep's controller): the job's
        own batch shell died with the failed node. ``scontrol requeue`` of the pending leader answers "Job is
        pending execution", and requeues the components that ended.
        """
        if not recs or not stranded(recs) or (where.app_id, recs[0].restarts) in self._requeued:
            return
        self._requeued.add((where.app_id, recs[0].restarts))
        self.run(["scontrol", "requeue", recs[0].app_id])

    def scancel(self, job_ids: Sequence[str]) -> None:
        """``scancel`` the jobs in one call; an ended or unknown job is not an error."""
        if not job_ids:
            return
        proc = self.run(["scancel", *job_ids])
        err = proc.stderr.lower()
        if proc.returncode != 0 and "already completing or completed" not in err and "invalid job id" not in err:
            cli.check(proc, f"scancel {' '.join(job_ids)}{self.where_said}")
        self.queries.invalidate()

    def warn(self, job_dir: str, job_id: str, signal: str) -> bool:
        """Write the cancel mark in ``job_dir``, then send ``signal`` to the job's batch shell (which passes it
        on to every task): True when it was sent; when it could not be, the mark is taken back."""
        proc = self.sh("warn.sh", job_dir, CANCEL_MARK, signal, job_id)
        self.queries.invalidate()
        return proc.returncode == 0

    def unmark(self, job_dir: str) -> None:
        """Remove the cancel mark (best effort): the job runs on, its next warning is not a cancel's."""
        with contextlib.suppress(OSError, subprocess.SubprocessError, SchedulerError):
            self.sh("remove.sh", job_dir, CANCEL_MARK, timeout=30)

    def forget_secrets(self, job_dir: str) -> None:
        """Remove the secrets' folder of ``job_dir`` (best effort; see :mod:`.secrets`)."""
        with contextlib.suppress(OSError, subprocess.SubprocessError, SchedulerError):
            self.sh("remove.sh", job_dir, slurm_secrets.DIR, timeout=30)

    def remove(self, job_dir: str, roles: Sequence[str]) -> bool:
        """Delete the files tsm, Slurm and the batch script wrote in ``job_dir``, then the folders left empty;
        True when something was deleted."""
        proc = self.sh("remove.sh", job_dir, " ".join(JOB_FILES), *roles)
        return b"removed" in proc.stdout


def _tsm_home() -> Path:
    from tsm.store import tsm_home

    return tsm_home()


class LocalHost(Host):
    """This machine: Slurm's commands run here, and job directories are paths here (shared with the nodes)."""

    def __init__(self, queries: SlurmQueries) -> None:
        super().__init__(queries)
        self._wheres: dict[str, Where] = {}  # the apps this machine's index names

    def run(self, args: list[str], *, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        return cli.run(args, timeout=timeout)

    def sh(self, program: str, *args: str, input: bytes | None = None,
           timeout: float = 60.0) -> subprocess.CompletedProcess[bytes]:
        # the system's sh, and the system's tools after the caller's PATH (which finds Slurm's commands)
        path = os.pathsep.join(p for p in (os.environ.get("PATH", ""), os.defpath) if p)
        tag = "tsm-" + program.rsplit(".", 1)[0]
        return subprocess.run(["/bin/sh", "-c", programs.text(program), tag, *args], input=input,
                              capture_output=True, timeout=timeout, check=False, env={**os.environ, "PATH": path})

    def app_id(self, job_id: str) -> str:
        return job_id

    @staticmethod
    def index() -> Path:
        """``$TSM_HOME/slurm/index``: one file per app submitted from this home, holding its job directory."""
        return _tsm_home() / "slurm" / "index"

    def where(self, app_id: str) -> Where:
        """The app ``app_id`` (a job id) of this machine, with the job directory its index recorded."""
        found = self._wheres.get(app_id)
        if found is not None:
            return found
        try:
            text = read_text(self.index() / app_id)
        except Exception:  # noqa: BLE001 - an unusable TSM_HOME only loses the index
            text = None
        found = Where(app_id, app_id, self, text.strip() if text and text.strip() else None)
        if found.job_dir is not None:  # an index entry never changes: kept (until forget)
            self._wheres[app_id] = found
        return found

    def remember(self, app_id: str, job_id: str, job_dir: str) -> None:
        try:
            write_private(Path(job_dir) / "job_id", app_id + "\n")
            make_private_dirs(self.index())
            write_private(self.index() / app_id, job_dir + "\n")
        except OSError:
            pass  # the job's WorkDir still leads to the job directory

    def forget(self, where: Where) -> None:
        self._wheres.pop(where.app_id, None)
        with contextlib.suppress(Exception):  # an unusable TSM_HOME has no index to clean
            unlink(self.index() / where.app_id)

    def home(self, remote_home: str | None) -> str:
        return str(_tsm_home())

    def resolve(self, path: str) -> str:
        return os.path.abspath(os.path.expanduser(path))

    def python(self) -> str | None:
        return None

    def slurm_version(self) -> tuple[int, int]:
        return cli.slurm_version()

    def submit_dir(self, job_dir: str) -> str:
        return os.getcwd()

    def place(self, app: AppDef, home: str) -> list[str]:
        return []  # a local snapshot is where the nodes see it

    def submit(self, req: SlurmBatchRequest, secrets: slurm_secrets.Delivery | None = None) -> str:
        job_dir = Path(req.job_dir)
        prepare_job_dir(job_dir, req.roles, req.app_json, req.script)
        try:
            if secrets is not None:
                slurm_secrets.write_dir(job_dir, secrets.values)
            return self.sbatch(req.sbatch_args, job_dir / "job.sbatch", job_dir, secrets.hidden if secrets else ())
        except BaseException:
            self.remove(req.job_dir, req.roles)  # nothing was submitted: leave no half-made job behind
            raise

    @staticmethod
    def sbatch(sbatch_args: Sequence[str], script: Path, cwd: Path, hidden: Collection[str] = ()) -> str:
        """``sbatch`` the saved ``script`` from ``cwd``; the job id (typed errors when Slurm refuses).

        The job keeps sbatch's environment (``--export=ALL``), so the variables ``hidden`` (those that hold
        secrets' values) are left out of it."""
        # umask 077: files Slurm creates for the job before its script runs (batch.out) are private too
        proc = cli.run([*slurm_secrets.without(hidden), "sbatch", *sbatch_args, str(script)], cwd=str(cwd), umask=0o077)
        return cli.job_id_of(proc)

    def local_dir(self, where: Where, recs: list[SlurmJob] | None) -> Path | None:
        if where.job_dir is not None and Path(where.job_dir, "app.json").is_file():
            return Path(where.job_dir)
        task = where.job_id.partition("_")[2]  # an array task's WorkDir is the array's folder of links
        for r in recs or []:
            found = Path(r.work_dir) / task if r.work_dir else None
            if found is not None and (found / "app.json").is_file():
                return found
        return None

    def sync(self, wheres: Sequence[Where], tails: bool = False) -> None:
        pass  # the files are here

    def read(self, path: str) -> bytes:
        try:
            with open(path, "rb") as f:
                return f.read()
        except OSError:
            return b""

    def reader(self, path: str) -> Callable[[], bytes]:
        return file_reader(path)

    def mtimes(self, paths: Sequence[str]) -> dict[str, float]:
        out = {}
        for p in paths:
            with contextlib.suppress(OSError):
                out[p] = os.stat(p).st_mtime
        return out


def prepare_job_dir(job_dir: Path, roles: Sequence[str], app_json: str, script: str) -> None:
    """Make a job directory here: role folders, ``app.json`` and the ``script`` it runs (all private).

    One that holds an app, or a ``secrets`` folder (``remove`` deletes what is in it), is refused.
    """
    try:
        make_private_dirs(job_dir)
        for held, what in (("app.json", "an app"), (slurm_secrets.DIR, f"'{slurm_secrets.DIR}'")):
            if os.path.lexists(job_dir / held):
                raise SubmissionError(f"job_dir {job_dir} already holds {what}: choose another directory")
        for role in roles:
            (job_dir / role).mkdir(mode=0o700, exist_ok=True)
        write_private(job_dir / "app.json", app_json)
        write_private(job_dir / "job.sbatch", script)
    except OSError as e:
        raise SubmissionError(f"cannot prepare the job directory {job_dir}: {e.strerror or e}") from e


def default_job_dir(home: str, app_name: str) -> str:
    """A new job directory's path under ``home``: ``<home>/slurm/jobs/<app>-<time>-<random>``; its random
    name is also the submission's token over SSH."""
    return f"{home}/slurm/jobs/{app_name}-{time.strftime('%Y%m%d-%H%M%S')}-{os.urandom(4).hex()}"

