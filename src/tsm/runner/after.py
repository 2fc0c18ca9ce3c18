"""Apps that wait for apps: ``tsm run --after HANDLE[:ok|:any|:fail]`` and ``Runner.run(..., after=[...])``.

An app launched *after* others starts only once each of them has ended as asked:

=========  ==============================================  ===================
condition  the dependency must end                          Slurm's word
=========  ==============================================  ===================
``ok``     SUCCEEDED (the default)                          ``afterok``
``any``    in any state                                     ``afterany``
``fail``   FAILED or CANCELLED (anything but SUCCEEDED)      ``afternotok``
=========  ==============================================  ===================

Two ways to wait, decided at dry run (:func:`prepare`), so the dry run shows which:

- **The scheduler's own** (:class:`~tsm.schedulers.api.NativeDependencies`: Slurm's ``--dependency`` with
  ``--kill-on-invalid-dep=yes``) when every dependency is an app of the same cluster: the job is submitted at
  once and PENDING with Slurm's reason until they end; one that can no longer be met ends it CANCELLED.
- **tsm's watcher** otherwise (local, Docker, Kubernetes, Ray, and any mix of schedulers): the app's id is
  fixed at dry run (:class:`~tsm.schedulers.api.PresetAppIds`), so its handle is returned at once; a
  detached helper (:mod:`tsm.runner.holds`, outliving the terminal that launched it) waits for the
  dependencies through the runner and submits the dry run unchanged when they are met, or ends the app
  CANCELLED with the reason when one can no longer be. Until then ``status`` says what it waits for, ``wait``
  waits for it, ``cancel`` stops the wait, ``list`` shows it PENDING. Secrets are read when it is submitted,
  by the helper (which has the launching process's environment); nothing of a value is written.

The ``holds`` table of the store is this module's (the one owner of its SQL): a row per held app, its
state (``waiting`` → ``submitting`` → ``submitted``, or ``cancelled`` / ``failed`` with the reason).
A dependency already met at dry run is dropped; one already unmeetable is refused then (nothing would run).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import pickle
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from tsm.errors import InvalidRunOptionError, NotSupportedError, SubmissionError, UnknownAppError
from tsm.specs.api import AppDryRunInfo, AppState, AppStatus
from tsm.specs.handles import make_app_handle, parse_app_handle

if TYPE_CHECKING:
    from tsm.history import History
    from tsm.schedulers.api import Scheduler

#: The conditions ``HANDLE:COND`` takes, and what each needs of the dependency's end.
CONDITIONS = ("ok", "any", "fail")
_WORDS = {"ok": "it had to succeed", "any": "", "fail": "it had to fail or be cancelled"}

#: A hold's states: still waiting, being submitted, submitted (the scheduler knows it), or ended unsubmitted.
WAITING, SUBMITTING, SUBMITTED, CANCELLED, FAILED = "waiting", "submitting", "submitted", "cancelled", "failed"

#: The held app's payload in its folder: the pickled dry run and the runner's parameters (no secret's value:
#: a dry run names secrets, it never holds them).
PAYLOAD = "request.pkl"
#: The helper's lock (held while it lives, so a dead helper is told apart from a waiting one) and its log.
LOCK, LOG = "lock", "holds.log"


class Runner(Protocol):
    """What this module asks of :class:`tsm.runner.api.Runner` (a value passed in: the runner imports this module)."""

    @property
    def session_name(self) -> str: ...

    @property
    def history(self) -> History: ...

    def scheduler(self, name: str) -> Scheduler: ...

    def status(self, app_handle: str) -> AppStatus | None: ...


@dataclass(frozen=True)
class After:
    """One dependency: an app ``handle`` and how it must end (``ok``, ``any`` or ``fail``)."""

    handle: str
    condition: str = "ok"

    def __post_init__(self) -> None:
        parse_app_handle(self.handle)
        if self.condition not in CONDITIONS:
            raise InvalidRunOptionError(f"after {self.handle}:{self.condition}: the condition is one of "
                                        f"{', '.join(CONDITIONS)} (default ok)")

    def met_by(self, state: AppState) -> bool | None:
        """True when an app that ended in ``state`` meets it, False when it never can, None while it runs."""
        if not state.is_terminal:
            return None
        if self.condition == "any":
            return True
        return (state == AppState.SUCCEEDED) == (self.condition == "ok")

    def unmet(self, state: AppState) -> str:
        """Why an app that ended in ``state`` cannot meet it (the waiting app's message)."""
        return f"dependency {self.handle} ended {state.name}, and {_WORDS[self.condition]} (--after {self})"

    def __str__(self) -> str:
        return f"{self.handle}:{self.condition}"


def parse_after(value: str | After) -> After:
    """``HANDLE`` or ``HANDLE:ok|any|fail`` as an :class:`After` (a malformed handle raises as handles do)."""
    if isinstance(value, After):
        return value
    if not isinstance(value, str):
        raise InvalidRunOptionError(f"after: expected 'HANDLE[:ok|:any|:fail]', got {type(value).__name__}")
    head, sep, tail = value.rpartition(":")
    if sep and tail in CONDITIONS and "://" in head:
        return After(head, tail)
    if sep and "/" not in tail and "://" in head:
        raise InvalidRunOptionError(f"after {value}: the condition is one of {', '.join(CONDITIONS)} (default ok)")
    return After(value)


def parse_all(values: Iterable[str | After] | None) -> list[After]:
    """Every dependency parsed, each handle once (the same handle with two conditions is refused)."""
    out: dict[str, After] = {}
    for value in values or ():
        dep = parse_after(value)
        if dep.handle in out and out[dep.handle] != dep:
            raise InvalidRunOptionError(f"after: {dep.handle} is given with two conditions ({out[dep.handle]} "
                                        f"and {dep}); give it once")
        out[dep.handle] = dep
    return list(out.values())


# -- at dry run -------------------------------------------------------------------------------------------
def prepare(runner: Runner, info: AppDryRunInfo[Any], after: Iterable[str | After]) -> AppDryRunInfo[Any]:
    """``info`` waiting for ``after``: each dependency checked now (an unknown app or one that can no longer
    be met raises, one already met is dropped); the scheduler's own dependencies when it takes them all
    (``info.after`` then empty), else ``info.after`` for :func:`hold` to wait on."""
    from tsm.schedulers.api import NativeDependencies, PresetAppIds

    deps = []
    for dep in parse_all(after):
        status = runner.status(dep.handle)
        if status is None:
            raise UnknownAppError(f"after {dep.handle}: unknown app (never launched, or removed); `tsm list` "
                                  "shows known apps", handle=dep.handle)
        met = dep.met_by(status.state)
        if met is False:
            raise SubmissionError(f"{dep.unmet(status.state)}: the app would never start, so nothing was submitted",
                                  handle=dep.handle)
        if met is None:
            deps.append(dep)
    info.after = [str(d) for d in deps]
    if not deps:
        return info
    sched = runner.scheduler(info.scheduler)
    if isinstance(sched, NativeDependencies):
        same = [parse_app_handle(d.handle) for d in deps]
        if all(p.scheduler == info.scheduler for p in same):
            native = sched.with_dependencies(info, [(p.app_id, d.condition) for p, d in zip(same, deps, strict=True)])
            if native is not None:
                native.after = []
                return native
    if not isinstance(sched, PresetAppIds):
        raise NotSupportedError(f"the {info.scheduler} scheduler cannot wait for {', '.join(map(str, deps))}: it "
                                "waits only for apps it runs itself (on the same cluster)", scheduler=info.scheduler)
    return info


# -- at submission ------------------------------------------------------------------------------------------
def hold(runner: Runner, info: AppDryRunInfo[Any], factories: Any, params: dict[str, Any]) -> str:
    """Keep ``info`` (whose ``after`` is not empty) for tsm's helper to submit; its handle, returned now.

    The helper makes a runner like ``runner``: its session, the scheduler ``factories`` it was given (None:
    the registered ones) and the scheduler ``params`` it was given."""
    from tsm.schedulers.api import PresetAppIds
    from tsm.util import daemon

    sched = runner.scheduler(info.scheduler)
    if not isinstance(sched, PresetAppIds):
        raise NotSupportedError(f"the {info.scheduler} scheduler cannot hold an app for tsm to submit later",
                                scheduler=info.scheduler)
    app_id = sched.app_id_of(info)
    handle = make_app_handle(info.scheduler, runner.session_name, app_id)
    folder = hold_dir(handle)
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    write_payload(folder / PAYLOAD, {"handle": handle, "session": runner.session_name, "params": params,
                                      "info": dataclasses.replace(info, fmt=repr), "factories": factories})
    store = runner.history.store
    now = time.time()
    store.write([
        ("INSERT OR REPLACE INTO holds (handle, after, state, msg, dir, created, updated) VALUES (?,?,?,?,?,?,?)",
         (handle, json.dumps(info.after), WAITING, "", str(folder), now, now)),
        runner.history.add_statement(handle, info.scheduler, runner.session_name, app_id, info.app, info.cfg,
                                     AppState.PENDING),
    ])
    daemon.start_helper(folder / LOCK, "tsm.runner.holds:main", str(folder), log=folder / LOG, ready_timeout=10.0)
    return handle


def write_payload(path: Path, data: dict[str, Any]) -> None:
    """The dry run and what makes a runner like the caller's, written owner-only and atomically; factories
    that do not pickle (a lambda, a mock) are refused rather than replaced by other code later."""
    import os

    try:
        blob = pickle.dumps(data)
    except Exception as e:  # noqa: BLE001 - whatever pickle raises for an object it cannot take
        raise NotSupportedError(f"after: this app or runner cannot be handed to tsm's helper ({type(e).__name__}: "
                                f"{e}); use get_runner()'s registered schedulers") from e
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(blob)
    os.replace(tmp, path)


def hold_dir(handle: str) -> Path:
    """The private folder of a held app under ``$TSM_HOME/holds`` (named by a hash: handles hold '/')."""
    from tsm.store import tsm_home

    return tsm_home() / "holds" / hashlib.sha256(handle.encode()).hexdigest()[:24]


# -- the hold's record ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Hold:
    """A held app's row: what it waits for, where it is, and why it ended unsubmitted."""

    handle: str
    after: list[str]
    state: str
    msg: str
    folder: Path

    def status(self) -> AppStatus | None:
        """The held app's status while the scheduler does not know it (None once it was submitted)."""
        if self.state == WAITING:
            if not alive(self.folder):
                return AppStatus(AppState.FAILED, msg="tsm's helper that held this app ended before submitting "
                                 f"it (its log: {self.folder / LOG}); launch it again")
            return AppStatus(AppState.PENDING, msg=f"waiting for {', '.join(self.after)}")
        if self.state == SUBMITTING:
            return AppStatus(AppState.PENDING, msg="its dependencies ended as asked; being submitted")
        if self.state == CANCELLED:
            return AppStatus(AppState.CANCELLED, msg=self.msg)
        if self.state == FAILED:
            return AppStatus(AppState.FAILED, msg=self.msg)
        return None


def _holds(store: Any, handles: Sequence[str]) -> list[Hold]:
    """The hold rows of ``handles`` (one query)."""
    marks = ",".join("?" * len(handles))
    rows = store.query(f"SELECT handle, after, state, msg, dir FROM holds WHERE handle IN ({marks})", tuple(handles))
    return [Hold(r["handle"], json.loads(r["after"]), r["state"], r["msg"], Path(r["dir"])) for r in rows]


def find(store: Any, handle: str) -> Hold | None:
    """The hold row of ``handle``, or None (the common case: an app that never waited)."""
    found = _holds(store, [handle])
    return found[0] if found else None


def messages(store: Any, handles: Sequence[str]) -> dict[str, tuple[AppState, str]]:
    """The state and message of each held app among ``handles`` (one query; the views' line for each)."""
    if not handles:
        return {}
    return {h.handle: (st.state, st.msg) for h in _holds(store, handles) if (st := h.status()) is not None}


def set_state(store: Any, handle: str, state: str, msg: str = "", only_from: Sequence[str] = ()) -> bool:
    """Move the hold to ``state`` (only from one of ``only_from`` when given: the test and the change are one
    write); True when the row changed."""
    where = " AND state IN ({})".format(",".join("?" * len(only_from))) if only_from else ""
    changed: int = store.write([(f"UPDATE holds SET state=?, msg=?, updated=? WHERE handle=?{where}",
                                  (state, msg, time.time(), handle, *only_from))])
    return changed > 0


def alive(folder: Path) -> bool:
    """Whether the helper of the hold in ``folder`` still runs (it holds the folder's lock while it lives)."""
    from tsm.util import daemon

    return daemon.held(folder / LOCK) or daemon.held(daemon.start_lock(folder / LOCK))


def status(runner: Runner, handle: str) -> AppStatus | None:
    """The status of an app its scheduler does not know: held (waiting, or ended unsubmitted), else None."""
    held = find(runner.history.store, handle)
    return None if held is None else held.status()


def wait(runner: Runner, handle: str, timeout: float | None) -> bool:
    """Block while ``handle`` is held (until its helper ends: an event, the released lock) or ``timeout``
    passes; True when it is no longer held."""
    from tsm.util import daemon

    held = find(runner.history.store, handle)
    if held is None or held.state not in (WAITING, SUBMITTING):
        return True
    daemon.wait_released(held.folder / LOCK, timeout)
    again = find(runner.history.store, handle)
    return again is None or again.state not in (WAITING, SUBMITTING) or not alive(held.folder)


def cancel(runner: Runner, handle: str) -> bool:
    """Stop waiting: the held app ends CANCELLED and is never submitted. False when it is not held (never
    was, or is being submitted: then wait for it to be and cancel it on its scheduler)."""
    store = runner.history.store
    if not set_state(store, handle, CANCELLED, "cancelled while it waited for its dependencies",
                     only_from=(WAITING,)):
        return False
    runner.history.set_state(handle, AppState.CANCELLED)
    held = find(store, handle)
    if held is not None:
        from tsm.util import daemon

        daemon.wait_released(held.folder / LOCK, 10.0)  # the helper sees it at its next look, within a second
    return True


def forget(runner: Runner, handle: str) -> bool:
    """Drop the hold's row and folder (``tsm rm``); True when there was one."""
    import shutil

    store = runner.history.store
    held = find(store, handle)
    if held is None:
        return False
    store.write([("DELETE FROM holds WHERE handle=?", (handle,))])
    shutil.rmtree(held.folder, ignore_errors=True)
    return True
