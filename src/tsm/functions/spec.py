"""The worker's command line: what a function job's replicas run, and what the app definition tells a reader.

Every replica of a function job runs::

    python -m tsm.functions.worker --nonce N [--dir D] [--state-dir S] [--call-file F] [--index I]
                                   [--item B64] [--tasks-per-node K] -- WORD...

``WORD...`` is the pickled call in URL-safe base64 words (none when it is in ``--call-file``); ``--item`` the
pickled positional arguments of one item of a map, appended to the call's. ``--dir`` is the job's directory
where the replicas share this machine's files: outcomes (``result.<rank>``) and checkpoints are written
there; without it outcomes come back as lines of the replica's output (tagged with ``--nonce``). The app
definition is the one record of all this: :func:`parse` reads it back, so a job can be found again from its
handle alone (:func:`tsm.functions.job.attach`), and ``tsm rm`` knows which directory is the job's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

#: what every function job's replicas run after the interpreter
WORKER = ("-m", "tsm.functions.worker")


@dataclass
class WorkerArgs:
    """The worker's options (see the module doc)."""

    nonce: str
    dir: str | None = None
    state_dir: str | None = None
    call_file: str | None = None
    index: int = 0
    item: str | None = None
    tasks_per_node: int | None = None
    words: list[str] = field(default_factory=list)

    def argv(self) -> list[str]:
        """The worker's arguments, after ``python``."""
        out = [*WORKER, "--nonce", self.nonce]
        for flag, value in (("--dir", self.dir), ("--state-dir", self.state_dir), ("--call-file", self.call_file),
                            ("--item", self.item)):
            if value is not None:
                out += [flag, value]
        if self.index:
            out += ["--index", str(self.index)]
        if self.tasks_per_node:
            out += ["--tasks-per-node", str(self.tasks_per_node)]
        return [*out, "--", *self.words]

    @property
    def checkpoint_dir(self) -> str | None:
        """Where this replica's checkpoints are kept: the job's directory, else ``--state-dir``."""
        return self.dir or self.state_dir


def _start(args: Sequence[str]) -> int:
    """Where the worker's arguments start in a role's args: 0, or after a ``bash -c SCRIPT NAME python`` prelude
    (a job with setup commands, :func:`tsm.functions.app.app_of`); -1 when they are not a worker's."""
    for at in (0, 4):
        if tuple(args[at:at + 2]) == WORKER and (at == 0 or args[0] == "-c"):
            return at
    return -1


def is_worker(args: Sequence[str]) -> bool:
    """Whether a role's args run a function job's worker (what :meth:`WorkerArgs.argv` makes)."""
    return _start(args) >= 0


def parse(args: Sequence[str]) -> WorkerArgs:
    """The worker's options from a role's arguments; ValueError if they are not a worker's."""
    at = _start(args)
    if at < 0:
        raise ValueError("not a tsm function worker's arguments")
    rest = list(args[at + 2:])
    values: dict[str, str] = {}
    while rest and rest[0] != "--":
        flag = rest.pop(0)
        if not flag.startswith("--") or not rest:
            raise ValueError(f"bad worker argument {flag!r}")
        values[flag[2:].replace("-", "_")] = rest.pop(0)
    words = rest[1:] if rest else []
    if "nonce" not in values:
        raise ValueError("the worker's arguments have no --nonce")
    known = {"nonce", "dir", "state_dir", "call_file", "index", "item", "tasks_per_node"}
    unknown = set(values) - known
    if unknown:
        raise ValueError(f"unknown worker option --{sorted(unknown)[0].replace('_', '-')}")
    tpn = values.get("tasks_per_node")
    return WorkerArgs(
        nonce=values["nonce"], dir=values.get("dir"), state_dir=values.get("state_dir"),
        call_file=values.get("call_file"), index=int(values.get("index", "0")), item=values.get("item"),
        tasks_per_node=int(tpn) if tpn else None, words=words,
    )
