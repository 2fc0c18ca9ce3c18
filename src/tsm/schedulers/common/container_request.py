"""What every container backend's request carries of an app's long run, and what the kit reads of a request.

Pure: no I/O, no client library (a backend's ``request`` module, the dry run, imports it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from tsm.schedulers.common.lifecycle_opts import DEFAULT_MAX_PREEMPTIONS, LifecycleOptions


@dataclass(kw_only=True)
class LifecycleFields:
    """The long-run fields of a container request: what a look tells
    :func:`~tsm.schedulers.common.controller.decide` of the app. Keyword-only, so a request dataclass that
    inherits them lists its own fields first; saved flat in the request's JSON."""

    #: ``time_limit`` in seconds (None: none), counted from the submission (from the last requeue after one)
    time_limit: float | None = None
    #: restarts the cluster's decisions may cause (a lost node, a daemon restart, a requeue at the time limit)
    max_preemptions: int = DEFAULT_MAX_PREEMPTIONS
    #: ``requeue_on_time_limit``: the time limit restarts the app (a preemption) rather than ending it
    requeue_on_time_limit: bool = False
    #: ``stall_timeout`` in seconds (None: never): no log line and no CPU time that long
    stall_timeout: float | None = None
    #: ``on_stall``: ``restart`` (the stalled replica retried as its own failure) or ``fail`` (the app fails)
    on_stall: str = "restart"


def lifecycle_fields(opts: LifecycleOptions) -> dict[str, Any]:
    """The :class:`LifecycleFields` of a request built from ``opts`` (keyword arguments, in seconds)."""
    return {"time_limit": opts.time_limit_s, "max_preemptions": opts.max_preemptions,
            "requeue_on_time_limit": opts.requeue_on_time_limit, "stall_timeout": opts.stall_timeout_s,
            "on_stall": opts.on_stall}


class ContainerRequest(Protocol):
    """What the kit reads of a backend's request: its app id and shape (``[[role, replicas, ...], ...]``)."""

    app_id: str
    roles: list[list[Any]]

    def to_json(self) -> str: ...
