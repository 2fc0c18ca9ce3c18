"""The lockfile environment a role's replicas run in: plain data, no I/O (what :mod:`tsm.env` builds).

``Environment(lock="uv.lock", python="3.12")`` names a lock (a ``uv.lock`` beside its ``pyproject.toml``, a
``pylock.toml``, or a ``requirements.txt``, whose ``--hash`` pins are honoured) and the Python version to
build it for (default: the version running tsm). The scheduler builds it once per content key where the
replicas run, and ``python`` in a replica is its interpreter.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class Environment:
    """A lockfile and the Python version its environment is built for."""

    lock: str
    python: str | None = None

    @staticmethod
    def from_dict(data: Any) -> Environment | None:
        """Rebuild from the app's JSON (None stays None)."""
        if not data:
            return None
        if isinstance(data, Environment):
            return data
        return Environment(lock=str(data["lock"]), python=data.get("python"))
