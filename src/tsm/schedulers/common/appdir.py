"""AppDir: the one owner of every file a container backend keeps of an app, private and written whole.

``$TSM_HOME/<backend>/<app_id>/`` holds what the engine does not keep, and it may hold secrets (the request
and the record carry the role's env), so every directory is made 0700 and every file 0600 whatever the
umask or the mode of ``$TSM_HOME`` itself, and every file is replaced atomically (a reader never sees half
of one; a crash leaves none)::

    request.json     what was submitted (to recreate containers or Jobs for ROLE/APPLICATION retries)
    app.json         the AppRecord (the AppDef as given), for describe when the engine forgot the app
    final.json       the app's last status (with its start and end times), once its objects are gone
    attempts.json    {role: try} of ROLE/APPLICATION retries (when the engine does not keep it)
    cancelling       a marker while a cancel is under way (status says RUNNING "being cancelled")
    logs/...         snapshots of each replica's output taken before its object is removed

Backends name no path below their app directory: they call these methods.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path

from tsm.schedulers.api import DescribeAppResponse, ListAppResponse
from tsm.schedulers.common.files import make_private_dirs, read_text, unlink, write_atomic
from tsm.schedulers.common.record import AppRecord, status_from_json, status_to_json
from tsm.specs.api import AppState

REQUEST = "request.json"
RECORD = "app.json"
FINAL = "final.json"
ATTEMPTS = "attempts.json"
CANCELLING = "cancelling"
#: the app's restarts made as preemptions, ``[[attempt, [roles]], ...]`` (:func:`preemption_events`)
PREEMPTIONS = "preemptions.json"


class AppDir:
    """The files of one app under ``root`` (see the module docstring); nothing is made until written."""

    def __init__(self, root: Path, app_id: str) -> None:
        if not app_id or "/" in app_id or app_id in (".", ".."):
            raise ValueError(f"not an app id: {app_id!r}")
        self.root = root
        self.app_id = app_id
        self.path = root / app_id

    # -- plumbing -------------------------------------------------------------------------------------------
    def exists(self, name: str | None = None) -> bool:
        """True when the app directory (or the file ``name`` in it) exists."""
        return (self.path / name if name else self.path).exists()

    def private_dir(self, *parts: str) -> Path:
        """The directory ``parts`` below the app's (made 0700, with every missing parent); returned."""
        d = self.path.joinpath(*parts)
        make_private_dirs(d)
        return d

    def write(self, name: str, data: str | bytes | Iterable[bytes]) -> int:
        """Replace the file ``name`` (a path below the app directory) whole, private; bytes written."""
        target = self.path / name
        make_private_dirs(target.parent)
        return write_atomic(target, data)

    def read(self, name: str) -> str | None:
        """The text of the file ``name``, or None when it cannot be read."""
        return read_text(self.path / name)

    def count_up(self, name: str) -> None:
        """Add one to the counter kept in the file ``name`` (a missing or unreadable one counts from 0)."""
        now = (self.read(name) or "").strip()
        self.write(name, f"{int(now) + 1 if now.isdigit() else 1}\n")

    def remove(self) -> bool:
        """Delete the app directory and everything in it; True when there was one."""
        if not self.path.exists():
            return False
        shutil.rmtree(self.path, ignore_errors=True)
        return True

    # -- what is kept ---------------------------------------------------------------------------------------
    def save_submission(self, request_json: str, record: AppRecord) -> None:
        """Write the request and the record of a submission (before anything is created on the engine)."""
        self.write(REQUEST, request_json)
        self.write(RECORD, record.to_json())

    def request_json(self) -> str | None:
        """The saved request's JSON; None when this ``$TSM_HOME`` did not submit the app."""
        return self.read(REQUEST)

    def record(self) -> AppRecord | None:
        """The saved :class:`AppRecord`, or None."""
        return AppRecord.load(self.path / RECORD)

    def save_final(self, d: DescribeAppResponse, started: float | None = None, ended: float | None = None) -> None:
        """Write the app's last status (and when it started and ended: ``ended`` defaults to now)."""
        data = json.loads(status_to_json(d))
        data["started"] = started
        data["ended"] = ended if ended is not None else time.time()
        self.write(FINAL, json.dumps(data))

    def final(self) -> DescribeAppResponse | None:
        """The status :meth:`save_final` wrote; None while the app has not ended (or is unknown)."""
        text = self.read(FINAL)
        return status_from_json(text) if text is not None else None

    def final_times(self) -> tuple[float | None, float | None]:
        """``(started, ended)`` saved with the final status (None each when unknown)."""
        text = self.read(FINAL)
        try:
            data = json.loads(text or "")
            return _num(data.get("started")), _num(data.get("ended"))
        except (ValueError, AttributeError):
            return None, None

    def attempts(self) -> dict[str, int]:
        """``{role: n}``: the ROLE/APPLICATION try each role is on (0 when never retried)."""
        try:
            data = json.loads(self.read(ATTEMPTS) or "{}")
            return {str(k): int(v) for k, v in data.items()}
        except (ValueError, TypeError, AttributeError):
            return {}

    def set_attempts(self, attempts: dict[str, int]) -> None:
        """Record the tries of :meth:`attempts` (before the new try's objects are made)."""
        self.write(ATTEMPTS, json.dumps(attempts, sort_keys=True))

    @property
    def cancelling(self) -> bool:
        """True while a cancel of the app is under way (by this or another process)."""
        return self.exists(CANCELLING)

    @contextlib.contextmanager
    def cancel_marker(self) -> Iterator[None]:
        """Hold the ``cancelling`` marker while the body runs (status reads "being cancelled" meanwhile)."""
        self.write(CANCELLING, "")
        try:
            yield
        finally:
            unlink(self.path / CANCELLING)


def app_dirs(root: Path) -> Iterator[AppDir]:
    """Every app directory under ``root`` (none when it does not exist)."""
    if not root.is_dir():
        return
    for entry in os.scandir(root):
        if entry.is_dir(follow_symlinks=False) and not entry.name.startswith("."):
            yield AppDir(root, entry.name)


def _num(v: object) -> float | None:
    return float(v) if isinstance(v, (int, float)) else None


def kept_status(d: AppDir) -> DescribeAppResponse | None:
    """What the store alone says of an app: its final status, RUNNING "being cancelled" while a cancel is
    under way, else None (ask the engine)."""
    final = d.final()
    if final is not None:
        return final
    if d.cancelling:
        return DescribeAppResponse(app_id=d.app_id, state=AppState.RUNNING, msg="being cancelled")
    return None


def list_rows(
    root: Path,
    live: Mapping[str, DescribeAppResponse],
    just_submitted: Callable[[str], DescribeAppResponse | None] | None = None,
) -> list[ListAppResponse]:
    """``list()`` of a container backend: the apps the engine shows (``live``), plus those only the store
    under ``root`` still knows (ended and removed, being cancelled, or submitted and not made yet, asked of
    ``just_submitted``), newest first. An app whose end the store keeps is listed as it ended, whatever
    ``live`` says: the engine's list may predate the end (a look taken while another process finished it
    reports it "being stopped")."""
    rows = {a: ListAppResponse(a, d.state, name=a.rsplit("-", 1)[0], created=d.created) for a, d in live.items()}
    for d in app_dirs(root):
        if d.app_id in rows:
            final = d.final()
            if final is not None:
                rows[d.app_id].state = final.state
            continue
        desc = kept_status(d)
        if desc is None and just_submitted is not None and d.exists(REQUEST):
            desc = just_submitted(d.app_id)
        if desc is not None:
            rows[d.app_id] = ListAppResponse(d.app_id, desc.state, name=d.app_id.rsplit("-", 1)[0], created=desc.created)
    return sorted(rows.values(), key=lambda r: -(r.created or 0))


def preemption_events(d: AppDir) -> list[tuple[int, tuple[str, ...]]]:
    """The restarts of the app made as preemptions, each ``(attempt, roles)``, from ``preemptions.json``
    (kept in its directory, so every process counts the same; empty when unreadable). Their roles are what
    :func:`tsm.schedulers.common.controller.count_preemptions` counts."""
    try:
        raw = json.loads(d.read(PREEMPTIONS) or "[]")
        return sorted({(int(a), tuple(sorted(str(r) for r in roles))) for a, roles in raw})
    except (ValueError, TypeError):
        return []


def record_preemption(d: AppDir, attempt: int, roles: Iterable[str]) -> None:
    """Add the preemption restart of ``roles`` into try ``attempt`` to ``preemptions.json``: idempotent, so a
    restart two processes decided is counted once (the caller holds the app's lock, so none is lost)."""
    events = {*preemption_events(d), (attempt, tuple(sorted(roles)))}
    d.write(PREEMPTIONS, json.dumps([[a, list(r)] for a, r in sorted(events)]))
