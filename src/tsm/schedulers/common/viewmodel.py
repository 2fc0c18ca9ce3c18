"""The view model: what ``tsm top`` and ``tsm serve`` show of an app, built by each backend's batched-views hook.

Backends import these types (never :mod:`tsm.views`): a scheduler that declares
:class:`tsm.schedulers.api.BatchedViews` returns one :class:`AppSummary` per app it knows, built from one
batched query of its engine. The helpers here are what those hooks share: :func:`view_of_describe` (a summary
from a ``DescribeAppResponse``), :func:`requests_of` (what each role asked for), :func:`settled` (a summary
that will not change again) and :class:`LastLines` (the last line of replica log files this host can read).

Pure data and file reads only: no store, no scheduler, no client library. :mod:`tsm.views.snapshot`
re-exports the types under their old names (``AppView``, ``ReplicaView``).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import Any

from tsm.schedulers.common.failure import parse_structured_error
from tsm.specs.api import AppState

#: Bytes read from the end of a log file to find its last line.
_TAIL_BYTES = 4096


@dataclass
class ReplicaSummary:
    """One replica as the views show it; usage fields are None where they cannot be measured (``n/a``)."""

    role: str
    idx: int
    state: str
    host: str = ""
    attempt: int = 0  #: restarts so far (0: first attempt)
    exit_code: int | None = None
    error: str = ""
    last_line: str = ""
    pid: int | None = None  #: a process on this host (the views measure its usage); None elsewhere
    cpu_req: float | None = None  #: cores requested
    mem_req_mb: float | None = None
    gpu_req: int | None = None
    cpu_used: float | None = None  #: cores in use
    mem_used_mb: float | None = None
    gpu_mem_mb: float | None = None


@dataclass
class AppSummary:
    """One app: identity, state, timing, restarts, why it failed, and its replicas."""

    handle: str
    scheduler: str
    app_id: str
    name: str
    state: str
    created: float | None = None
    started: float | None = None
    ended: float | None = None
    restarts: int = 0
    last_error: str = ""
    replicas: list[ReplicaSummary] = field(default_factory=list)

    def age(self, now: float) -> float | None:
        """Seconds since the app was submitted."""
        return None if self.created is None else max(0.0, now - self.created)

    def duration(self, now: float) -> float | None:
        """Seconds it has run (or ran): from start (else submission) to its end (else now)."""
        begin = self.started if self.started is not None else self.created
        if begin is None:
            return None
        return max(0.0, (self.ended if self.ended is not None else now) - begin)

    @property
    def terminal(self) -> bool:
        """True once the app has ended (its state will not change)."""
        return AppState[self.state].is_terminal if self.state in AppState.__members__ else False

    def to_dict(self, now: float) -> dict[str, Any]:
        """JSON-ready form, with ``age`` and ``duration`` computed at ``now``."""
        d = asdict(self)
        d["age"], d["duration"] = self.age(now), self.duration(now)
        return d


def requests_of(spec: dict[str, Any]) -> dict[str, tuple[float | None, float | None, int | None]]:
    """role name -> (cpu, memMB, gpu) requested, None where the role asked for nothing (-1)."""
    out: dict[str, tuple[float | None, float | None, int | None]] = {}
    for r in spec.get("roles", []):
        res = r.get("resource") or {}

        def pos(v: Any) -> Any:
            return v if isinstance(v, (int, float)) and v >= 0 else None

        out[r.get("name", "")] = (pos(res.get("cpu")), pos(res.get("memMB")), pos(res.get("gpu")))
    return out


class LastLines:
    """The last line of each log file, re-read only when the file's size or mtime changed.

    Used by the local refresh and by the batch hooks of backends whose replica logs are files this host
    can read (Slurm's job directory). A file whose replica has ended is not even looked at again once read
    (``final``). :meth:`prune` after each tick forgets the files that tick did not ask about.
    """

    def __init__(self) -> None:
        self._cache: dict[str, tuple[int, int, str]] = {}  # path -> (size, mtime_ns, line)
        self._sealed: set[str] = set()  # files read once their replica had ended: not looked at again
        self._asked: set[str] = set()

    def _line(self, path: str, final: bool = False) -> tuple[str, int]:
        self._asked.add(path)
        hit = self._cache.get(path)
        if final and hit is not None and path in self._sealed:
            return hit[2], hit[1]
        if final:
            self._sealed.add(path)  # this look, after the end, is the last one
        try:
            st = os.stat(path)
        except OSError:
            return "", 0
        if hit is not None and hit[:2] == (st.st_size, st.st_mtime_ns):
            return hit[2], hit[1]
        line = ""
        try:
            fd = os.open(path, os.O_RDONLY)
            try:
                data = os.pread(fd, _TAIL_BYTES, max(0, st.st_size - _TAIL_BYTES))
            finally:
                os.close(fd)
            for raw in reversed(data.replace(b"\r", b"\n").split(b"\n")):
                if raw.strip():
                    line = raw.decode("utf-8", "replace")
                    break
        except OSError:
            pass
        self._cache[path] = (st.st_size, st.st_mtime_ns, line)
        return line, st.st_mtime_ns

    def prune(self) -> None:
        """Forget the files not asked about since the last prune (replicas of apps that left the view)."""
        if len(self._cache) > len(self._asked):
            self._cache = {k: v for k, v in self._cache.items() if k in self._asked}
        self._sealed &= self._asked
        self._asked = set()

    def last(self, rdir: str, final: bool = False) -> str:
        """The last non-empty line the replica wrote to stdout or stderr, whichever was written last."""
        return self.last_of(f"{rdir}{os.sep}stdout", f"{rdir}{os.sep}stderr", final)

    def last_of(self, stdout: str, stderr: str, final: bool = False) -> str:
        """The last non-empty line of the two files ``stdout`` and ``stderr``, whichever was written last.

        ``final``: the replica has ended, so files already read are not looked at again.
        """
        out, t_out = self._line(stdout, final)
        err, t_err = self._line(stderr, final)
        if out and err:
            return err if t_err > t_out else out
        return out or err


def settled(view: AppSummary) -> bool:
    """True once the app and every replica of it have ended: its view will not change (a hook may keep it).

    An app is terminal as soon as one replica fails, while the others are still being stopped.
    """
    return view.terminal and all(
        r.state in AppState.__members__ and AppState[r.state].is_terminal for r in view.replicas
    )


def view_of_describe(
    desc: Any, scheduler: str, handle: str = "", name: str = "",
    reqs: dict[str, tuple[float | None, float | None, int | None]] | None = None,
) -> AppSummary:
    """An :class:`AppSummary` from a scheduler's ``DescribeAppResponse`` (usage left n/a).

    What the backends' batched-views hooks build their summaries from; ``reqs`` (role -> requests, see
    :func:`requests_of`) saves parsing the app again when the caller keeps it.
    """
    req = reqs if reqs is not None else (requests_of(desc.app.to_dict()) if desc.app is not None else {})
    error = desc.msg if desc.state == AppState.FAILED else ""
    structured = parse_structured_error(desc.structured_error_msg)
    if structured is not None:
        error = structured["message"] or error
        replica = structured["replica"]
        if replica and error and not error.startswith(str(replica)):
            error = f"{replica}: {error}"  # a person reading the last error alone learns which replica
    if not name and desc.app is not None:
        name = desc.app.name
    view = AppSummary(handle, scheduler, desc.app_id, name, desc.state.name,
                   created=desc.created, restarts=desc.num_restarts, last_error=error)
    for role in desc.roles_statuses:
        cpu, mem, gpu = req.get(role.role, (None, None, None))
        for rep in role.replicas:
            view.replicas.append(ReplicaSummary(
                role=role.role, idx=rep.id, state=rep.state.name, host=rep.hostname or "",
                attempt=getattr(rep, "restarts", 0) or 0, exit_code=getattr(rep, "exit_code", None),
                error=getattr(rep, "error_msg", "") or "", cpu_req=cpu, mem_req_mb=mem, gpu_req=gpu,
            ))
    if view.state == "FAILED" and not view.last_error:
        view.last_error = next((r.error for r in view.replicas if r.state == "FAILED" and r.error), "")
    return view
