"""ContainerScheduler: what a backend that runs each replica in a container of an engine (Docker, Kubernetes)
does the same whatever the engine, written once.

Such a backend keeps each app it submitted in an app directory of ``$TSM_HOME/<backend>/``
(:class:`~tsm.schedulers.common.appdir.AppDir`: the request, the record, the final status, the kept logs),
answers ``describe`` from one batched list of the owner's objects shared by every app of the process (a
:class:`~tsm.schedulers.common.watcher.StatusWatcher`), and makes each look at an app a controller step:
observe, decide (:func:`tsm.schedulers.common.controller.decide`), act. This base holds that skeleton: the
app directory and the request kept in it, the watcher's snapshot and lookup, the status of an observation,
the final status of an app that ended before anything ran, the preemption record, ``describe``, ``list``,
the head of ``log_iter``, ``cancel``'s and ``remove``'s frame, the keeper, the image engine of workspaces,
the views' hook and ``close``.

A backend gives the engine's side, the seam (abstract methods): what a request is (:meth:`_parse_request`),
one list of the engine's objects (:meth:`_observe`), one controller step (:meth:`look`), the status of what
was observed (:meth:`_app_status`), reading a replica's log (:meth:`_lines`), stopping an app
(:meth:`_cancel`), deleting its objects (:meth:`_removing`) and its views' hook (:meth:`_new_view`).

The public methods here (:meth:`app_dir`, :meth:`request`, :meth:`final_status`, :meth:`kept_status`,
:meth:`app_record`, :meth:`live_statuses`) are what the backend's own helpers (its view) and anyone else
ask: never the scheduler's private members. Imports no client library.
"""

from __future__ import annotations

import abc
import builtins
import contextlib
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from tsm.schedulers.api import (
    BatchedViews,
    DescribeAppResponse,
    ListAppResponse,
    PresetAppIds,
    Scheduler,
    Stream,
)
from tsm.schedulers.common.appdir import (
    FINAL,
    REQUEST,
    AppDir,
    kept_status,
    list_rows,
    preemption_events,
    record_preemption,
)
from tsm.schedulers.common.container_request import ContainerRequest
from tsm.schedulers.common.failure import failure_of
from tsm.schedulers.common.logs import check_log_target, filter_regex, replica_counts, stream_names
from tsm.schedulers.common.record import AppRecord, ended_status, with_record
from tsm.schedulers.common.status import AppStatusView
from tsm.schedulers.common.watcher import StatusWatcher
from tsm.specs.api import AppDef, AppState, Role
from tsm.specs.runopts import CfgVal
from tsm.store import tsm_home
from tsm.workspace.api import WorkspaceBuilder

TYPE_CHECKING = False
if TYPE_CHECKING:
    from tsm.schedulers.common.viewmodel import AppSummary
    from tsm.workspace.image import ImageEngine


class ObservedApp(Protocol):
    """What the base reads of one app as the engine's list showed it."""

    @property
    def app_id(self) -> str: ...

    @property
    def created(self) -> float | None: ...


class ViewHook(Protocol):
    """A backend's batched-views helper (its ``view.py``), kept across a view's ticks."""

    def snapshot(self, app_ids: Sequence[str]) -> builtins.list[AppSummary]: ...

    def close(self) -> None: ...


ReqT = TypeVar("ReqT", bound=ContainerRequest)
ViewT = TypeVar("ViewT", bound=ObservedApp)


def mark_cancelled(desc: DescribeAppResponse) -> DescribeAppResponse:
    """``desc`` as a cancel leaves it: CANCELLED, every replica that had not succeeded too."""
    for rs in desc.roles_statuses:
        for r in rs.replicas:
            if r.state != AppState.SUCCEEDED:
                r.state, r.error_msg = AppState.CANCELLED, "cancelled"
    desc.state, desc.msg, desc.structured_error_msg = AppState.CANCELLED, "cancelled", ""
    return desc


class ContainerScheduler(Scheduler[ReqT], WorkspaceBuilder[None], BatchedViews, PresetAppIds, Generic[ReqT, ViewT]):
    """The shared skeleton of the container backends (see the module doc); a backend implements the seam.

    Capabilities: ``WorkspaceBuilder`` (a workspace becomes an image built on the first role's by the local
    Docker engine, :mod:`tsm.workspace.image`) and ``BatchedViews`` (one list of the engine's objects per
    view refresh, :meth:`_new_view`) and ``PresetAppIds`` (the request names the app).

    ``in_process``: the engine was given by the caller (a fake engine, an embedding program): another
    process cannot reach it, so no keeper is started and stops run in this process.
    """

    #: seconds a snapshot of the engine's list is reused by ``describe``
    max_age: float = 1.0

    def __init__(self, backend: str, session_name: str, *, in_process: bool,
                 images: ImageEngine | None = None) -> None:
        super().__init__(backend, session_name)
        self._in_process = in_process
        self._images = images
        self._watcher = self._new_watcher()
        self._lock = threading.Lock()
        self._view: ViewHook | None = None

    # -- the engine's seam --------------------------------------------------------------------------------
    @abc.abstractmethod
    def _parse_request(self, text: str) -> ReqT:
        """The request kept as ``text`` (its ``to_json``); raises ValueError, TypeError or KeyError."""

    @abc.abstractmethod
    def _observe(self, app_id: str | None = None) -> dict[str, tuple[ViewT, Any]]:
        """One list of the engine's objects of this owner (of ``app_id`` only: an app this home submitted),
        by app: its view and the mark :meth:`look` compares with what another look did meanwhile."""

    @abc.abstractmethod
    def look(self, view: ViewT, mark: Any = None) -> DescribeAppResponse:
        """One controller step of an observed app (observe, decide, act: an app this home submitted is acted
        on); returns its status. The backend's view calls it too: a refresh acts as ``describe`` does."""

    @abc.abstractmethod
    def _app_status(self, view: ViewT) -> AppStatusView:
        """The status of what was observed of an app (the backend's state table)."""

    @abc.abstractmethod
    def _lines(self, app_id: str, role: str, k: int, streams: builtins.list[str], since: datetime | None,
               until: datetime | None, tail: bool) -> Iterator[str]:
        """The lines of replica ``k`` of ``role``: the kept logs of its ended tries, then the engine's."""

    @abc.abstractmethod
    def _cancel(self, app_id: str, current: DescribeAppResponse) -> None:
        """Stop a running app this owner has on the engine, its logs and its final status kept."""

    @abc.abstractmethod
    def _removing(self, app_id: str) -> contextlib.AbstractContextManager[bool]:
        """Delete the app's objects on the engine; yields whether there were any, and holds what must be held
        while the app directory is removed."""

    @abc.abstractmethod
    def _new_view(self) -> ViewHook:
        """The backend's batched-views helper (its ``view.py``)."""

    def _log_streams(self, streams: Stream | None) -> builtins.list[str]:
        """The streams a log read takes (``stdout``/``stderr``); a backend that keeps one log refuses others."""
        return stream_names(streams)

    # -- the app directory --------------------------------------------------------------------------------
    def store_root(self) -> Path:
        """Where this home keeps the apps it submitted to this backend: ``$TSM_HOME/<backend>``."""
        return tsm_home() / self.backend

    def app_dir(self, app_id: str) -> AppDir:
        """The app's directory in this home (private, every file written whole)."""
        return AppDir(self.store_root(), app_id)

    def request(self, app_id: str) -> ReqT | None:
        """The request this home submitted for ``app_id``; None for an app it did not submit."""
        text = self.app_dir(app_id).request_json()
        try:
            return self._parse_request(text) if text else None
        except (ValueError, TypeError, KeyError):
            return None

    def final_status(self, app_id: str) -> DescribeAppResponse | None:
        """The status kept when the app's objects went (None while they are there)."""
        return self.app_dir(app_id).final()

    def kept_status(self, app_id: str) -> DescribeAppResponse | None:
        """What the store alone says of an app: its final status, or RUNNING "being cancelled"; else None."""
        return kept_status(self.app_dir(app_id))

    def app_record(self, app_id: str) -> AppRecord | None:
        """The record kept at submission (the AppDef, the session), None for an app this home did not submit."""
        return self.app_dir(app_id).record()

    def live_statuses(self, max_age: float | None = None) -> dict[str, DescribeAppResponse]:
        """The status of every app the engine's list shows (one list for all, no older than ``max_age``)."""
        return self._watcher.all(max_age=self.max_age if max_age is None else max_age)

    def _write_final(self, req: ReqT, state: AppState, msg: str) -> None:
        """Keep the final status of an app that ended before anything of it ran (start and end: now)."""
        now = time.time()
        self.app_dir(req.app_id).save_final(ended_status(req.app_id, req.roles, state, msg), now, now)

    def _preemptions(self, d: AppDir) -> builtins.list[tuple[int, tuple[str, ...]]]:
        """The restarts of the app made as preemptions, each ``(attempt, roles)`` (kept in its directory, so
        every process counts the same; a restart is counted once however many processes decided it)."""
        return preemption_events(d)

    def _record_preemption(self, d: AppDir, attempt: int, roles: Sequence[str]) -> None:
        """Add the preemption restart of ``roles`` into try ``attempt`` (idempotent; the caller holds the
        app's lock, so no other process's record is lost)."""
        record_preemption(d, attempt, roles)

    def _ensure_keeper(self, by_a_look: bool = False) -> None:
        """Have this home's keeper of the backend (:func:`tsm.schedulers.common.keeper.ensure`) look at its
        running apps: at each submission, and at most every
        :data:`~tsm.schedulers.common.keeper.CHECK_EVERY` seconds ``by_a_look`` that saw a running app of
        the home. Not for an engine given by the caller (another process cannot reach it)."""
        if not self._in_process:
            from tsm.schedulers.common import keeper

            keeper.ensure(self.backend, self.store_root(), keeper.CHECK_EVERY if by_a_look else 0.0)

    # -- status ---------------------------------------------------------------------------------------------
    def _new_watcher(self) -> StatusWatcher[DescribeAppResponse]:
        return StatusWatcher(self._snapshot, self._lookup, is_terminal=lambda d: d.state.is_terminal)

    def _snapshot(self) -> dict[str, DescribeAppResponse]:
        """The watcher's batch: one list of the engine, a look at each app it shows (an app being cancelled,
        or whose end is kept, is answered by :meth:`_lookup` from the store)."""
        out: dict[str, DescribeAppResponse] = {}
        for app_id, (view, mark) in self._observe().items():
            d = self.app_dir(app_id)
            if d.cancelling or d.exists(FINAL):
                continue
            out[app_id] = self.look(view, mark)
            if not out[app_id].state.is_terminal and d.exists(REQUEST):
                self._ensure_keeper(by_a_look=True)  # a keeper gone with a reboot or a kill starts again
        return out

    def _lookup(self, ids: builtins.list[str]) -> dict[str, DescribeAppResponse]:
        """The apps the snapshot did not show: from the store, else (an app this home submitted) the engine's
        list of that app alone."""
        out: dict[str, DescribeAppResponse] = {}
        for app_id in ids:
            d = self.app_dir(app_id)
            kept = kept_status(d)
            if kept is not None:
                out[app_id] = kept
            elif d.exists(REQUEST):
                seen = self._observe(app_id).get(app_id)
                if seen is not None:
                    out[app_id] = self.look(*seen)
        return out

    def _describe_view(self, view: ViewT, st: AppStatusView | None = None) -> DescribeAppResponse:
        """The status of an observed app as ``describe`` gives it (``st``: its status, when already made)."""
        st = st or self._app_status(view)
        return DescribeAppResponse(app_id=view.app_id, state=st.state, msg=st.msg, num_restarts=st.num_restarts,
                                   created=view.created, roles_statuses=st.roles,
                                   structured_error_msg=failure_of(st.state, st.msg, st.roles))

    def describe(self, app_id: str) -> DescribeAppResponse | None:
        """The app's status, from one list of the engine shared by every app of the process.

        A look is also a controller step (:meth:`look`): for an app this home submitted, a failure with
        ROLE/APPLICATION retries left is retried and an ended one is stopped (its logs and status kept); an
        app it did not submit is only reported. An app whose end is kept (:meth:`final_status`) is answered
        from the store alone: no client is made, no list is read.
        """
        record = self.app_dir(app_id).path / "app.json"
        final = self.final_status(app_id)  # ended, its objects gone: the store answers, the engine is not asked
        if final is not None:
            return with_record(final, record)
        return with_record(self._watcher.get(app_id, max_age=self.max_age), record)

    def list(self) -> builtins.list[ListAppResponse]:
        # an app just submitted whose objects are not made yet is asked of the watcher (its lookup reads the request)
        return list_rows(self.store_root(), self._watcher.all(), self._watcher.get)

    def log_iter(
        self,
        app_id: str,
        role_name: str,
        k: int = 0,
        regex: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        should_tail: bool = False,
        streams: Stream | None = None,
    ) -> Iterator[str]:
        req = self.request(app_id)
        roles = replica_counts(req.roles if req else None, lambda: self.describe(app_id))
        check_log_target(self.backend, app_id, roles, role_name, k)
        names = self._log_streams(streams)
        return filter_regex(regex, self._lines(app_id, role_name, k, names, since, until, should_tail))

    # -- views ----------------------------------------------------------------------------------------------
    def view_snapshot(self, app_ids: Sequence[str]) -> builtins.list[AppSummary]:
        """The views' batch hook (:class:`tsm.schedulers.api.BatchedViews`): every app of ``app_ids`` from one
        list of the engine (the backend's ``view.py``). Like ``describe``, a refresh acts on what it sees."""
        if self._view is None:
            self._view = self._new_view()
        return self._view.snapshot(app_ids)

    # -- cancel / remove --------------------------------------------------------------------------------
    def cancel(self, app_id: str) -> None:
        """Stop every replica of the app (SIGTERM, SIGKILL after the grace period; warned first with
        ``warn_signal``), its logs and final status kept; nothing for an ended or unknown app. Only this
        owner's objects are seen, so another user's app is unknown."""
        current = self.describe(app_id)
        if current is None or current.state.is_terminal:
            return
        self._cancel(app_id, current)
        self._watcher.invalidate()

    def remove(self, app_id: str) -> bool:
        """Delete the app's objects on the engine and everything kept of it in ``$TSM_HOME``."""
        with self._removing(app_id) as found:
            found = self.app_dir(app_id).remove() or found  # never made again: a lock does not make the directory
        self._watcher = self._new_watcher()  # it keeps ended apps for good: forget the removed one
        return found

    # -- workspaces --------------------------------------------------------------------------------------
    @property
    def images(self) -> ImageEngine:
        """The local Docker engine's images (:class:`tsm.workspace.image.ImageEngine`): workspace images are
        built there (connected on first use)."""
        if self._images is None:
            from tsm.workspace.image import ImageEngine

            self._images = ImageEngine()
        return self._images

    def build_workspace_and_update_role(self, role: Role, workspace: str, cfg: Mapping[str, CfgVal]) -> None:
        """Snapshot ``workspace`` and point ``role`` at the image of it; the build itself runs at ``schedule``
        (:func:`tsm.workspace.image.plan_image`: content-hash tag on the role image's id, ``Dockerfile.tsm``
        when the workspace has one; nothing is built when the engine already has the tag)."""
        from tsm.workspace.image import plan_image, pull_policy

        plan_image(role, workspace, self.images, pull_policy(cfg))

    def dryrun_push_images(self, app: AppDef, cfg: Mapping[str, CfgVal]) -> None:
        """Nothing to push: the image is built on the engine whose runtime runs it."""
        return None

    def push_images(self, images_to_push: None) -> None:
        """Nothing to push (see :meth:`dryrun_push_images`)."""

    def close(self) -> None:
        """Stop the views' helper and close the image engine (a backend closes its own clients too)."""
        if self._view is not None:
            self._view.close()
            self._view = None
        if self._images is not None:
            self._images.close()
            self._images = None
