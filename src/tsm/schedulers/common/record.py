"""What tsm keeps of a submitted app, for ``describe`` when the backend no longer knows (or never knew) it.

A backend remembers states and ids, not AppDefs: Slurm forgets finished jobs, a container engine keeps
only labels. So each submission writes an :class:`AppRecord` (the AppDef as given, plus where it was
submitted from and backend details such as the job directory) next to the app's files, and ``describe``
rebuilds the roles and replica counts from it. The record is JSON with sorted keys, so the same app gives
the same bytes and a dry run can show it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tsm.schedulers.common.files import read_text
from tsm.specs.api import AppDef


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
