"""The job directory: the names of its files, and reading what the batch script and the replicas wrote there.

Every file of a job directory is named here (the docs page, docs/schedulers/slurm.md, says what each holds).
:class:`JobDir` reads a local copy of one (the directory itself, or the mirror of a login node's): it lists
the directory once and opens only the files the listing holds, so describing an app whose job wrote none of
the rare records (a stall, excluded nodes) costs one listing, not a failed open per record.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

#: The file ``tsm cancel`` writes before it sends the warning to the batch shell: the warning is then a
#: cancel's (never a reason to requeue at the time limit).
CANCEL_MARK = "cancel"

#: The file the batch script writes when it cannot keep the app off a failed node; the attempt that finds it
#: fails at once.
NODE_ERROR = "node_error"

#: The files of a job directory's top that ``describe`` reads (a login node's mirror holds these, with the
#: replicas' ``<role>/<k>.status``).
DESCRIBED = ("app.json", "exit", "restarts", "job_id", "last_exit", "excluded", "oom_nodes", "stalled",
             NODE_ERROR)  # fmt: skip

#: The folder of the secrets' files, one per secret (:mod:`.secrets`): written at submit, removed when the app is over.
SECRETS_DIR = "secrets"

#: Every file tsm, Slurm, the batch script and its replicas' wrapper write at the top of a job directory (what
#: ``remove`` deletes there, :data:`SECRETS_DIR` with its files; the replicas' files are in the role directories).
JOB_FILES = (*DESCRIBED, "job.sbatch", "batch.out", "submit_token", "failures", "moves", "requeue_cause",
             "stopping", CANCEL_MARK, SECRETS_DIR)  # fmt: skip

#: A replica's file in its role's folder: ``<k>.stdout``, ``<k>.stderr`` or ``<k>.status``.
REPLICA_FILE = re.compile(r"\d+\.(stdout|stderr|status)")


@dataclass
class ReplicaFile:
    """What a replica's status file says: running on a host, or exited with a code (and the signal seen)."""

    running: bool
    host: str = ""
    started: float | None = None
    exit_code: int | None = None
    ended: float | None = None
    attempt: int = 0
    signal: str = ""


def parse_status(text: str) -> ReplicaFile | None:
    """``running <host> <time> <attempt>`` or ``exited <code> <time> <attempt> <signal> <host>``; None else."""
    words = text.split()
    try:
        if words[:1] == ["running"] and len(words) >= 4:
            return ReplicaFile(True, host=words[1], started=float(words[2]), attempt=int(words[3]))
        if words[:1] == ["exited"] and len(words) >= 4:
            sig = words[4] if len(words) > 4 and words[4] != "-" else ""
            host = words[5] if len(words) > 5 else ""
            return ReplicaFile(False, host=host, exit_code=int(words[1]), ended=float(words[2]),
                               attempt=int(words[3]), signal=sig)  # fmt: skip
    except ValueError:
        return None
    return None


def read_status(path: str | Path) -> ReplicaFile | None:
    """Parse a ``<role>/<k>.status`` file, or None when it is missing or unreadable."""
    try:
        with open(path, errors="replace") as f:
            return parse_status(f.read())
    except OSError:
        return None


#: One line of ``excluded``: ``<node> NODE_FAIL|BOOT_FAIL[ (reason: ...)]``, ``<node> OOM (...)`` or
#: ``<node> GPU (<role>/<k>: <what was wrong>)``.
_EXCLUDED_LINE = re.compile(
    r"[A-Za-z0-9._-]+ (?:(?:NODE_FAIL|BOOT_FAIL)(?: \(reason: [^\n]{0,200}\))?"
    r"|OOM \(the kernel's OOM killer ended [^\n]{1,200}\)"
    r"|GPU \([^\n]{1,400}\))"
)


class JobDir:
    """A local copy of a job directory (the directory, or a login node's mirror), read for ``describe``."""

    def __init__(self, path: str | Path) -> None:
        self.path = path if isinstance(path, Path) else Path(path)
        self._names: frozenset[str] | None = None

    def names(self) -> frozenset[str]:
        """The names at the directory's top, listed once (empty when it cannot be listed)."""
        if self._names is None:
            try:
                self._names = frozenset(os.listdir(self.path))
            except OSError:
                self._names = frozenset()
        return self._names

    def text(self, name: str) -> str | None:
        """The file ``name`` at the top (undecodable bytes replaced), or None when the listing does not hold it."""
        if name not in self.names():
            return None
        try:
            return (self.path / name).read_text(errors="replace")
        except OSError:
            return None

    def status(self, role: str, k: int) -> ReplicaFile | None:
        """What replica ``k`` of ``role`` recorded (``<role>/<k>.status``), or None."""
        return read_status(os.path.join(self.path, role, f"{k}.status"))

    def replica(self, role: str, k: int) -> str:
        """The path of replica ``k``'s files without their extension (``<dir>/<role>/<k>``)."""
        return os.path.join(self.path, role, str(k))

    def restarts(self) -> int:
        """The restart count the batch script recorded as its attempt began (0 without a record)."""
        text = (self.text("restarts") or "").strip()
        return int(text) if text.isdigit() else 0

    def exit_code(self) -> str:
        """What the batch script wrote as it ended (an exit code, ``requeued``), or ""."""
        return (self.text("exit") or "").strip()

    def last_exit(self) -> str:
        """``TSM_LAST_EXIT`` of the current attempt: ``preempted``, ``failed:<code>``, ``time_limit``,
        ``stalled`` or "" (the first attempt, or not started yet)."""
        text = (self.text("last_exit") or "").strip()
        return text if re.fullmatch(r"preempted|time_limit|stalled|failed:\d+", text) else ""

    def excluded(self, name: str = "excluded") -> list[str]:
        """The nodes the batch script keeps the job's attempts off, and why (``node3 NODE_FAIL (reason: ...)``).

        With ``name="oom_nodes"``: the nodes the replicas' wrapper found at fault for a replica's end (their
        OOM killer ended it, or it failed while a GPU of the node was lost or had new uncorrectable ECC
        errors). Lines not of that form are left out.
        """
        return [ln for ln in (self.text(name) or "").splitlines() if _EXCLUDED_LINE.fullmatch(ln)]

    def stalled(self) -> tuple[str, int, str] | None:
        """``(role, replica id, "stalled for 15m, last line: '...'")``: the replica the stall watcher found
        stalled in this attempt (the file is removed as each attempt starts), or None."""
        text = (self.text("stalled") or "").strip()
        m = re.fullmatch(r"(\S+)/(\d+) (stalled for .*)", text.splitlines()[0] if text else "")
        return (m.group(1), int(m.group(2)), m.group(3)) if m else None

    def node_error(self) -> str:
        """Why the batch script could not keep the app off a failed node (the first line, at most 500
        characters), or "" when it never had to give up."""
        return ((self.text(NODE_ERROR) or "").splitlines() or [""])[0].strip()[:500]
