"""The pieces of TorchX's in-process local scheduler that tools also use on their own (TorchX's names).

What :mod:`tsm.compat.torchx.schedulers.local_scheduler` builds on: the request (:class:`PopenRequest` of
:class:`ReplicaParam`), the image providers (what an image is on this host), a running app
(:class:`_LocalAppDef` of :class:`_LocalReplica`, each the leader of its own process group) and
:class:`LogIterator`, which follows a replica's log file. Importable from there, as from TorchX's module.
"""

from __future__ import annotations

import abc
import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import IO, Any

from tsm.schedulers.api import Scheduler
from tsm.specs.api import NONE, AppState, Role, is_terminal

#: Seconds :meth:`_LocalAppDef.kill` waits after SIGTERM before SIGKILL (TorchX's figure).
KILL_GRACE = 10.0

AppId = str
RoleName = str


@dataclass
class ReplicaParam:
    """How one replica is started: its argv, its env (added to the launcher's), its log files and cwd."""

    args: list[str]
    env: dict[str, str]
    stdout: str | None = None
    stderr: str | None = None
    combined: str | None = None
    cwd: str | None = None


@dataclass
class PopenRequest:
    """The local scheduler's request: the app id, its log dir, and each role's replicas and their log dirs."""

    app_id: AppId
    log_dir: str
    role_params: dict[RoleName, list[ReplicaParam]] = field(default_factory=dict)
    role_log_dirs: dict[RoleName, list[str]] = field(default_factory=dict)


class ImageProvider(abc.ABC):
    """Where a role's image is on this host, and how its replicas are started from it."""

    def fetch_role(self, role: Role) -> str:
        """The image root of ``role`` (a provider may also adjust the role); by default ``fetch(role.image)``."""
        return self.fetch(role.image)

    @abc.abstractmethod
    def fetch(self, image: str) -> str:
        """Make ``image`` available here and return its root directory ("" when there is nothing to fetch)."""

    def get_replica_param(
        self,
        img_root: str,
        role: Role,
        stdout: str | None = None,
        stderr: str | None = None,
        combined: str | None = None,
    ) -> ReplicaParam:
        """The :class:`ReplicaParam` of one replica of ``role`` (macros already applied)."""
        return ReplicaParam(
            [self.get_entrypoint(img_root, role), *role.args], dict(role.env), stdout, stderr, combined,
            self.get_cwd(role.image),
        )

    def get_cwd(self, image: str) -> str | None:
        """The replicas' working directory (None: the launcher's)."""
        return None

    def get_entrypoint(self, img_root: str, role: Role) -> str:
        """The program a replica runs: the entrypoint under the image root."""
        return os.path.join(img_root, role.entrypoint)


class LocalDirectoryImageProvider(ImageProvider):
    """The image is a directory on this host; replicas run in it and their entrypoint is relative to it."""

    def __init__(self, cfg: Mapping[str, Any]) -> None:
        pass

    def fetch(self, image: str) -> str:
        """``image`` itself, which must be an existing directory."""
        if not os.path.isdir(image):
            raise ValueError(f"the image {image!r} is not a directory (the local scheduler runs a directory as its image)")
        return image

    def get_cwd(self, image: str) -> str | None:
        """The image directory."""
        return image

    def get_entrypoint(self, img_root: str, role: Role) -> str:
        """The entrypoint inside the image if a file of that name is there, else as written (on ``PATH``)."""
        candidate = os.path.join(img_root, role.entrypoint)
        return candidate if os.path.isfile(candidate) else role.entrypoint


class CWDImageProvider(ImageProvider):
    """The image name is ignored: replicas run in the launcher's working directory, entrypoints as written."""

    def __init__(self, cfg: Mapping[str, Any]) -> None:
        pass

    def fetch(self, image: str) -> str:
        """The current working directory."""
        return os.getcwd()

    def get_cwd(self, image: str) -> str | None:
        """The current working directory."""
        return os.getcwd()

    def get_entrypoint(self, img_root: str, role: Role) -> str:
        """The entrypoint as written (found on ``PATH``)."""
        return role.entrypoint


class _LocalReplica:
    """One running replica: its process (the leader of its own process group), its log files and error file."""

    def __init__(self, role_name: str, replica_id: int, proc: subprocess.Popen[bytes], error_file: str,
                 pumps: list[threading.Thread]) -> None:
        self.role_name = role_name
        self.replica_id = replica_id
        self.proc = proc
        self.error_file = error_file
        self._pumps = pumps

    def signal_group(self, sig: int) -> None:
        """Send ``sig`` to the replica's process group (its whole tree), if it still has one."""
        pid = self.proc.pid
        if pid <= 1:  # never signal init or every process of the user
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, sig)

    def terminate(self) -> None:
        """SIGTERM to the replica's process group."""
        self.signal_group(signal.SIGTERM)

    def is_alive(self) -> bool:
        """True while the replica's process has not exited."""
        return self.proc.poll() is None

    def failed(self) -> bool:
        """True once the replica exited non-zero."""
        code = self.proc.poll()
        return code is not None and code != 0

    def join_output(self, timeout: float = 5.0) -> None:
        """Wait for its output to be in the log files (after it exited)."""
        for t in self._pumps:
            t.join(timeout)


class _LocalAppDef:
    """An app's replicas, by role, with its log dir and last known state (TorchX's shape, used by subclasses)."""

    def __init__(self, id: str, log_dir: str) -> None:  # noqa: A002 (TorchX's parameter name)
        self.id = id
        self.log_dir = log_dir
        self.role_replicas: dict[RoleName, list[_LocalReplica]] = {}
        self.state: AppState = AppState.PENDING
        self.last_updated: float = -1

    def add_replica(self, role_name: str, replica: _LocalReplica) -> None:
        """Record a started replica of ``role_name``."""
        self.role_replicas.setdefault(role_name, []).append(replica)

    def set_state(self, state: AppState) -> None:
        """Record ``state`` and when it was seen."""
        self.last_updated = time.time()
        self.state = state

    def _replicas(self) -> list[_LocalReplica]:
        return [r for reps in self.role_replicas.values() for r in reps]

    def kill(self) -> None:
        """End every replica's whole process group: SIGTERM, up to :data:`KILL_GRACE` s, then SIGKILL. Idempotent."""
        replicas = self._replicas()
        # only groups whose leader was not reaped before this call: a group id whose leader was reaped long
        # ago (an app that ended hours before close()) may have been reused by an unrelated process group
        unreaped = [r for r in replicas if r.proc.returncode is None]
        for r in unreaped:
            if r.is_alive():
                r.terminate()
        deadline = time.monotonic() + KILL_GRACE
        for r in unreaped:
            with contextlib.suppress(subprocess.TimeoutExpired):
                r.proc.wait(max(0.0, deadline - time.monotonic()))
        for r in unreaped:
            r.signal_group(signal.SIGKILL)  # also what the leader left behind in its group
            r.proc.wait()
        for r in replicas:
            r.join_output()

    def _get_error_file(self) -> str | None:
        found = [(os.path.getmtime(r.error_file), r.error_file) for r in self._replicas() if os.path.exists(r.error_file)]
        return min(found)[1] if found else None

    def get_structured_error_msg(self) -> str:
        """The first replica's error report (``TORCHELASTIC_ERROR_FILE``), or :data:`~tsm.specs.NONE`."""
        path = self._get_error_file()
        if not path:
            return NONE
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()

    def close(self) -> None:
        """Wait for output of ended replicas to reach the log files (nothing else is held open)."""
        for r in self._replicas():
            if not r.is_alive():
                r.join_output()

    def __repr__(self) -> str:
        return f"{{app_id:{self.id}, state:{self.state}, pid_map:{[r.proc.pid for r in self._replicas()]}}}"


def _join_path(*paths: str | None) -> str:
    """``PATH`` entries joined with ``:``, empty ones left out."""
    return ":".join(p.strip(":") for p in paths if p and p.strip(":"))


def _pump(src: IO[bytes], own: IO[bytes], combined: IO[bytes], lock: threading.Lock) -> None:
    """Copy a replica's pipe into its own log file as it comes, and into the shared combined log by whole lines.

    A line written in pieces (``print`` of an unbuffered stream writes its text and its newline apart) stays
    one line in the combined log, never cut by the other stream's output.
    """
    pending = b""
    with src:
        for chunk in iter(lambda: src.read1(65536), b""):  # type: ignore[attr-defined]
            own.write(chunk)
            own.flush()
            pending += chunk
            cut = pending.rfind(b"\n") + 1 or (len(pending) if len(pending) > 1 << 20 else 0)  # bounded
            if cut:
                with lock:
                    combined.write(pending[:cut])
                    combined.flush()
                pending = pending[cut:]
        if pending:
            with lock:
                combined.write(pending)
                combined.flush()
    own.close()


def _close_after(pumps: list[threading.Thread], combined: IO[bytes]) -> None:
    """Close the combined log once both of a replica's pumps are done with it."""
    for t in pumps:
        t.join()
    combined.close()


class LogIterator:
    """Lines of one replica's log file, following it until the app ends when ``should_tail`` (TorchX's shape).

    Waits for the file to appear; stops at its end once the scheduler says the app is terminal or unknown.
    """

    def __init__(self, app_id: str, log_file: str, scheduler: Scheduler[Any], should_tail: bool = True) -> None:
        self._app_id = app_id
        self._log_file = log_file
        self._log_fp: IO[str] | None = None
        self._scheduler = scheduler
        self._app_finished = not should_tail

    def _check_finished(self) -> None:
        desc = self._scheduler.describe(self._app_id)
        self._app_finished = desc is None or is_terminal(desc.state)

    def __iter__(self) -> LogIterator:
        while True:
            self._check_finished()
            if os.path.isfile(self._log_file):
                self._log_fp = open(self._log_file, encoding="utf-8", newline="\n", errors="replace")  # noqa: SIM115
                return self
            if self._app_finished:
                raise RuntimeError(f"app: {self._app_id} finished without writing: {self._log_file}")
            time.sleep(0.1)

    def __next__(self) -> str:
        fp = self._log_fp
        assert fp is not None, "iterate with iter() first"
        while True:
            chunk = fp.read(64000)
            if chunk:
                return chunk
            if self._app_finished:
                fp.close()
                raise StopIteration
            time.sleep(0.1)
            self._check_finished()
