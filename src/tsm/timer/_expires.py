"""``configure()`` and ``expires()``: how worker code arms a timer around a block.

Apart from :mod:`tsm.timer.api`, which holds only torch's contract (requests, abstract client, queue and
server) and re-exports these two functions as torch's ``api`` module has them.  The default client for
``$TSM_TIMER_SOCKET`` is a :class:`~tsm.timer.SocketTimerClient`, which builds on the API; rather than import
it from here (an import cycle: api -> here -> socket_timer -> api), the package's ``__init__`` hands its
class to :func:`_set_env_client_factory` once everything is imported.  Importing any ``tsm.timer.*``
module runs that ``__init__`` first, so the default is always in place.
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
import time
from collections.abc import Callable
from types import TracebackType

from ._errors import NotConfiguredError

TYPE_CHECKING = False  # `typing` costs ~2 ms to import and is only needed by type checkers
if TYPE_CHECKING:
    from typing import ParamSpec, Protocol, TypeVar

    class TimerClient(Protocol):
        """What this module asks of a :class:`tsm.timer.api.TimerClient` (declared here: the api imports this
        module, so this one does not import it back)."""

        def acquire(self, scope_id: str, expiration_time: float) -> None: ...

        def release(self, scope_id: str) -> None: ...

    _P = ParamSpec("_P")
    _R = TypeVar("_R")

__all__ = ["TIMER_SOCKET_ENV", "configure", "expires"]

logger = logging.getLogger("tsm.timer")

#: Environment variable naming a :class:`~tsm.timer.SocketTimerServer` socket; :func:`expires` uses it
#: when :func:`configure` was never called.
TIMER_SOCKET_ENV = "TSM_TIMER_SOCKET"

_timer_client: TimerClient | None = None
_env_client: tuple[str, TimerClient] | None = None
_env_client_factory: Callable[[str], TimerClient] | None = None
_scope_ids = itertools.count(1)


def _set_env_client_factory(factory: Callable[[str], TimerClient]) -> None:
    """Called by ``tsm/timer/__init__.py``: how to build the client for ``$TSM_TIMER_SOCKET``."""
    global _env_client_factory
    _env_client_factory = factory


def configure(timer_client: TimerClient) -> None:
    """Make ``timer_client`` the client :func:`expires` uses when it is given none."""
    global _timer_client
    _timer_client = timer_client
    logger.info("timer client configured: %s", type(timer_client).__name__)


def _default_client() -> TimerClient:
    """The configured client, else a SocketTimerClient for ``$TSM_TIMER_SOCKET`` (built once per path)."""
    global _env_client
    if _timer_client is not None:
        return _timer_client
    path = os.environ.get(TIMER_SOCKET_ENV)
    if path and _env_client_factory is not None:
        env = _env_client
        if env is None or env[0] != path:
            env = _env_client = (path, _env_client_factory(path))
        return env[1]
    raise NotConfiguredError(
        f"no timer client: call tsm.timer.configure(client) or set {TIMER_SOCKET_ENV} before using expires()"
    )


class _Expires:
    """The context manager (and decorator) :func:`expires` returns."""

    __slots__ = ("_after", "_scope", "_client", "_held", "_held_client")

    def __init__(self, after: float, scope: str | None, client: TimerClient | None) -> None:
        self._after = after
        self._scope = scope
        self._client = client
        self._held = ""
        self._held_client: TimerClient | None = None

    def __enter__(self) -> None:
        client = self._client if self._client is not None else _default_client()
        scope = self._scope if self._scope is not None else f"expires#{next(_scope_ids)}"
        client.acquire(scope, time.time() + self._after)
        self._held = scope
        self._held_client = client

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        client, self._held_client = self._held_client, None
        if client is not None:
            client.release(self._held)

    def __call__(self, func: Callable[_P, _R]) -> Callable[_P, _R]:
        after, scope, client = self._after, self._scope, self._client

        @functools.wraps(func)
        def timed(*args: _P.args, **kwargs: _P.kwargs) -> _R:
            with _Expires(after, scope, client):
                return func(*args, **kwargs)

        return timed


def expires(after: float, scope: str | None = None, client: TimerClient | None = None) -> _Expires:
    """Arm a countdown timer of ``after`` seconds around a block; release it when the block exits.

    If the block is still running at the deadline, the server may reap this worker.  Without ``scope`` a
    cheap unique one (``expires#<n>``) is generated, so nested and recursive blocks get distinct timers.
    Without ``client`` the one given to :func:`configure` is used, else a :class:`SocketTimerClient` for
    ``$TSM_TIMER_SOCKET``.  Works as ``with expires(after=60): ...`` and as a decorator.
    """
    return _Expires(after, scope, client)
