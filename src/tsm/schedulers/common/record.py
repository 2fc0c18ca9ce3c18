"""What tsm keeps of a submitted app, for ``describe`` when the backend no longer knows (or never knew) it.

A backend remembers states and ids, not AppDefs: Slurm forgets finished jobs, a container engine keeps
only labels. So each submission writes an :class:`AppRecord` (the AppDef as given, plus where it was
submitted from and backend details such as the job directory) next to the app's files, and ``describe``
rebuilds the roles and replica counts from it. The record is JSON with sorted keys, so the same app gives
the same bytes and a dry run can show it.

Container backends also keep the app's last status, ``final.json`` beside the record, for when the engine
has removed its objects (:func:`save_final`, :func:`load_final`, :func:`ended_status`), and answer
``describe`` from their watcher's status with the record's AppDef attached (:func:`with_record`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tsm.schedulers.api import DescribeAppResponse
from tsm.schedulers.common.files import make_private_dirs, read_text, write_atomic
from tsm.specs.api import AppDef, AppState, ReplicaStatus, RoleStatus


@dataclass
class AppRecord:
    """The submitted app and the details needed to find and describe it later."""

    scheduler: str
    session: str
    app: AppDef
    submit_dir: str = ""
    details: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        """The record as JSON: ``{"scheduler", "session", "submit_dir", "app", **details}``."""
        data: dict[str, Any] = {**self.details}
        data.update(
            scheduler=self.scheduler, session=self.session, submit_dir=self.submit_dir, app=self.app.to_dict()
        )
        return json.dumps(data, indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> AppRecord | None:
        """Parse :meth:`to_json`'s output; None when it is not a record (cut short, edited, another tool's)."""
        try:
            data = json.loads(text)
            app = AppDef.from_dict(data.pop("app"))
            return cls(
                scheduler=str(data.pop("scheduler", "")),
                session=str(data.pop("session", "")),
                submit_dir=str(data.pop("submit_dir", "")),
                app=app,
                details=data,
            )
        except (ValueError, KeyError, TypeError, AttributeError):
            return None

    @classmethod
    def load(cls, path: Path) -> AppRecord | None:
        """The record saved at ``path``, or None when it is missing or unreadable."""
        text = read_text(path)
        return cls.from_json(text) if text else None


def role_replicas(app: AppDef | None) -> dict[str, int]:
    """``{role name: number of replicas}`` of ``app`` (empty when the app is not known)."""
    return {r.name: r.num_replicas for r in app.roles} if app else {}


def with_record(status: DescribeAppResponse | None, path: Path) -> DescribeAppResponse | None:
    """``describe``'s answer: ``status`` (a watcher's, shared between callers: it is copied, not changed) with
    the AppDef of the record at ``path``; roles the status does not show yet (nothing made on the engine)
    are given, without replicas, from the record. None stays None (the app is unknown)."""
    if status is None:
        return None
    record = AppRecord.load(path)
    out = DescribeAppResponse(
        app_id=status.app_id, state=status.state, num_restarts=status.num_restarts, msg=status.msg,
        structured_error_msg=status.structured_error_msg, created=status.created,
        roles_statuses=status.roles_statuses, app=record.app if record else None,
    )
    if record is not None and not out.roles_statuses:
        out.roles_statuses = [RoleStatus(r.name) for r in record.app.roles]
    return out


def status_to_json(d: DescribeAppResponse) -> str:
    """An app's final status as JSON (state names, one ``[id, state, exit code, message, restarts, host,
    preempted]`` row per replica, the describe's string ``metadata``); read back by :func:`status_from_json`."""
    return json.dumps({
        "app_id": d.app_id, "state": d.state.name, "msg": d.msg, "num_restarts": d.num_restarts, "created": d.created,
        "structured_error_msg": d.structured_error_msg,
        "roles": [[rs.role, [[r.id, r.state.name, r.exit_code, r.error_msg, r.restarts, r.hostname, r.preempted]
                             for r in rs.replicas]] for rs in d.roles_statuses],
        "metadata": {str(k): str(v) for k, v in (d.metadata or {}).items()},
    })


def status_from_json(text: str) -> DescribeAppResponse | None:
    """The status :func:`status_to_json` wrote, or None when ``text`` is not one (cut short, edited)."""
    try:
        data = json.loads(text)
        # rows of six fields were written before the preempted flag was kept
        roles = [RoleStatus(name, [ReplicaStatus(id=i, state=AppState[s], role=name, exit_code=c, error_msg=m,
                                                  restarts=n, hostname=h, preempted=bool(rest and rest[0]))
                                    for i, s, c, m, n, h, *rest in reps])
                 for name, reps in data["roles"]]
        meta = data.get("metadata") or {}
        return DescribeAppResponse(app_id=data["app_id"], state=AppState[data["state"]], msg=data["msg"],
                                   num_restarts=data["num_restarts"], created=data["created"], roles_statuses=roles,
                                   structured_error_msg=str(data.get("structured_error_msg") or ""),
                                   metadata={str(k): str(v) for k, v in dict(meta).items()})
    except (ValueError, KeyError, TypeError):
        return None


def save_final(app_dir: Path, d: DescribeAppResponse) -> None:
    """Write ``app_dir/final.json``, the app's last status, whole (a reader never sees half of it) and
    private (0600 in a 0700 directory: it may name secrets in messages)."""
    make_private_dirs(app_dir)
    write_atomic(app_dir / "final.json", status_to_json(d))


def load_final(app_dir: Path) -> DescribeAppResponse | None:
    """The status :func:`save_final` wrote in ``app_dir``; None when there is none (the app has not ended)."""
    text = read_text(app_dir / "final.json")
    return status_from_json(text) if text is not None else None


def ended_status(app_id: str, shape: Iterable[Sequence[Any]], state: AppState, msg: str) -> DescribeAppResponse:
    """The status of an app that ended before the engine ran it (it could not be created): every replica
    of the ``[role, replicas, ...]`` rows of ``shape`` in ``state`` with ``msg``."""
    roles = [RoleStatus(name, [ReplicaStatus(id=k, state=state, role=name, error_msg=msg) for k in range(n)])
             for name, n, *_ in shape]
    return DescribeAppResponse(app_id=app_id, state=state, msg=msg, roles_statuses=roles, created=time.time())
