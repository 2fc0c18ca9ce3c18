"""The type of a scheduler factory, kept out of :mod:`tsm.schedulers` so the registry imports no typing."""

from __future__ import annotations

from typing import Protocol

from tsm.schedulers.api import Scheduler


class SchedulerFactory(Protocol):
    """What an entry point of ``tsm.schedulers`` (or ``torchx.schedulers``) names: makes a scheduler for a session."""

    def __call__(self, session_name: str, **kwargs: object) -> Scheduler:
        """Create the scheduler for ``session_name``; ``kwargs`` are scheduler params it may use or ignore."""
        ...
