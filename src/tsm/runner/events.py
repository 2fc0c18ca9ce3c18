"""One structured event per Runner call: which API, scheduler, app, run config, how long, and how it ended.

Where events go:

* the logger ``tsm.events`` (level INFO, the event as one JSON line in the message and as
  ``record.tsm_event``), so ``logging.getLogger("tsm.events").addHandler(...)`` is all it takes;
* every sink registered under the entry-point group ``tsm.event_handlers`` (TorchX's
  ``torchx.event_handlers`` is read too): a callable taking the :class:`TsmEvent`. A sink that raises is
  reported once on the ``tsm`` logger and never breaks the call it describes.

When the logger is not enabled for INFO and no sink is registered, :func:`log_event` builds no event
at all: the cost of an unobserved call is one cached lookup and a level check.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from tsm._logging import module_logger, warn as _warn

#: The name of the logger every event is written to (``events.logger`` is that logger).
LOGGER_NAME = "tsm.events"

_INFO = 20  # logging.INFO, without importing logging


#: ``events.logger``, the logger itself, is made on first use: logging is imported only when needed
__getattr__ = module_logger(__name__, LOGGER_NAME)


def _info_enabled() -> bool:
    """True when the ``tsm.events`` logger would write an INFO record.

    Never true while :mod:`logging` has not been imported: then nothing has configured a handler or a
    level, and the root logger's default level (WARNING) drops INFO. So an unobserved ``tsm status`` need
    not import logging at all.
    """
    logging = sys.modules.get("logging")
    return logging is not None and logging.getLogger(LOGGER_NAME).isEnabledFor(_INFO)


#: Entry-point groups whose entries are event sinks (callables taking a :class:`TsmEvent`), tsm's first.
SINK_GROUPS = ("tsm.event_handlers", "torchx.event_handlers")

_sinks: list[Callable[[TsmEvent], Any]] | None = None
_failed_sinks: set[int] = set()


@dataclass
class TsmEvent:
    """What one Runner call did: the fields TorchX's runner events carry, plus the session.

    Times are microseconds; ``exception_*`` are set when the call raised.
    """

    session: str = ""
    api: str = ""
    scheduler: str | None = None
    app_id: str | None = None
    app_image: str | None = None
    app_metadata: dict[str, Any] | None = None
    runcfg: str | None = None
    workspace: str | None = None
    parent_run_id: str | None = None
    start_epoch_time_usec: int = 0
    wall_time_usec: int = 0
    cpu_time_usec: int = 0
    exception_type: str | None = None
    exception_message: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def serialize(self) -> str:
        """The event as one line of JSON."""
        return json.dumps(asdict(self), default=str, sort_keys=True)


def sinks() -> list[Callable[[TsmEvent], Any]]:
    """The registered sinks (entry points are read once per process)."""
    global _sinks
    if _sinks is None:
        from tsm.runner.plugins import entry_points

        found: list[Callable[[TsmEvent], Any]] = []
        for ep in entry_points(SINK_GROUPS):
            try:
                found.append(ep.load())
            except Exception as e:  # noqa: BLE001 - a broken plugin must not break every runner call
                _warn("event sink %s (%s) cannot be loaded: %s", ep.name, ep.group, e)
        _sinks = found
    return _sinks


def set_sinks(new: list[Callable[[TsmEvent], Any]] | None) -> None:
    """Replace the registered sinks (None: read the entry points again on the next event)."""
    global _sinks
    _sinks = None if new is None else list(new)
    _failed_sinks.clear()


def enabled() -> bool:
    """True when anything would see an event (a sink, or a handler for INFO on ``tsm.events``)."""
    return bool(sinks()) or _info_enabled()


def record(event: TsmEvent) -> None:
    """Send ``event`` to the logger and every sink."""
    if _info_enabled():
        import logging

        logging.getLogger(LOGGER_NAME).info("%s", event.serialize(), extra={"tsm_event": event})
    for sink in sinks():
        try:
            sink(event)
        except Exception as e:  # noqa: BLE001 - observing a call must never break it
            if id(sink) not in _failed_sinks:
                _failed_sinks.add(id(sink))
                _warn("event sink %r failed: %s", sink, e)


class log_event:  # noqa: N801 - TorchX's name and shape
    """Time the ``with`` block and record one :class:`TsmEvent` for it, with the exception if it raised.

    TorchX's signature: ``log_event(api, scheduler=None, app_id=None, app_image=None, app_metadata=None,
    runcfg=None, workspace=None)``, plus tsm's ``session`` and ``parent_run_id`` keywords. The context is the
    ``log_event`` itself: ``ctx._torchx_event`` is the event (fields may be set on it during the block, as
    TorchX's runner does) and ``ctx.set(**fields)`` does the same in one call. When nothing observes events
    (see :func:`enabled`), no event is recorded and ``ctx.event`` is None; ``_torchx_event`` is then a
    throw-away event, made only if asked for.
    """

    def __init__(
        self,
        api: str,
        scheduler: str | None = None,
        app_id: str | None = None,
        app_image: str | None = None,
        app_metadata: dict[str, Any] | None = None,
        runcfg: str | None = None,
        workspace: str | None = None,
        *,
        session: str = "",
        **fields: Any,
    ) -> None:
        self.event: TsmEvent | None = None
        self._fields = dict(fields, session=session, api=api, scheduler=scheduler, app_id=app_id,
                            app_image=app_image, app_metadata=app_metadata, runcfg=runcfg, workspace=workspace)
        self._spare: TsmEvent | None = None
        self._wall = self._cpu = 0.0

    @property
    def _torchx_event(self) -> TsmEvent:
        """The event being built (TorchX's attribute name)."""
        if self.event is not None:
            return self.event
        if self._spare is None:
            self._spare = TsmEvent(**self._fields)
        return self._spare

    def set(self, **fields: Any) -> None:
        """Fill in event fields learned during the call (ignored when no event is recorded)."""
        if self.event is not None:
            for k, v in fields.items():
                setattr(self.event, k, v)

    def __enter__(self) -> log_event:
        if enabled():
            self.event = TsmEvent(**self._fields)
            self.event.start_epoch_time_usec = int(time.time() * 1_000_000)
            self._wall, self._cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        event = self.event
        if event is None:
            return
        if exc_type is not None:
            event.exception_type = exc_type.__name__
            event.exception_message = str(exc)
        event.wall_time_usec = int((time.perf_counter() - self._wall) * 1_000_000)
        event.cpu_time_usec = int((time.process_time() - self._cpu) * 1_000_000)
        record(event)
