"""One place where a backend's failures become tsm's exceptions.

A CLI backend runs its commands with :func:`run_cli` (an argument list, never a shell) and turns a failed
one into an error with :func:`check_cli`; a client-library backend wraps its calls in :func:`mapped`::

    missing binary         -> SchedulerUnavailableError  (says what to install)
    no answer in time      -> SchedulerError             (says which service to check)
    "cannot reach" stderr  -> SchedulerUnavailableError  (says how to start the service)
    any other failure      -> SchedulerError             ("<what> failed: <the tool's own words>")

A client-library backend builds its client on :class:`ClientBase`: every call is counted by name
(:attr:`ClientBase.calls`, for tests and benchmarks) and its errors leave through the backend's
``translate``; an HTTP answer becomes :class:`ApiError`, which keeps the status as a field, so callers
test ``e.status == 404``, never the message text.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Mapping

from tsm.errors import SchedulerError, SchedulerUnavailableError, TsmError


class ApiError(SchedulerError):
    """An engine's API refused a call: ``status`` is its HTTP status (404 not found, 409 exists, ...)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def is_status(e: BaseException, *statuses: int) -> bool:
    """True when ``e`` is an :class:`ApiError` with one of ``statuses``."""
    return isinstance(e, ApiError) and e.status in statuses


class ClientBase:
    """What every engine client shares: a call counter and one error translation (see the module doc).

    A subclass implements :meth:`translate` (a library exception -> a tsm error, or None to let it pass)
    and wraps each engine call in ``with self.call("list pods"):``.
    """

    def __init__(self) -> None:
        #: calls made, by name ("list pods", "create", ...), for tests and benchmarks
        self.calls: Counter[str] = Counter()
        self._calls_lock = threading.Lock()

    def count(self, name: str) -> None:
        """Count one call named ``name``."""
        with self._calls_lock:
            self.calls[name] += 1

    def translate(self, what: str, e: BaseException) -> TsmError | None:
        """The tsm error for ``e`` raised by the call ``what``; None lets ``e`` through. None by default."""
        return None

    @contextlib.contextmanager
    def call(self, what: str, *, count: bool = True) -> Iterator[None]:
        """Count the call ``what`` and raise what its failure means in tsm's terms."""
        if count:
            self.count(what)
        try:
            yield
        except TsmError:
            raise
        except Exception as e:
            err = self.translate(what, e)
            if err is None:
                raise
            raise err from e


class CommandCounter:
    """How many times this process ran each command (``{"squeue": 12, ...}``), for benchmarks; thread-safe."""

    def __init__(self) -> None:
        self._counts: Counter[str] = Counter()
        self._lock = threading.Lock()

    def add(self, command: str) -> None:
        """Count one run of ``command`` (its base name is what is counted)."""
        with self._lock:
            self._counts[os.path.basename(command)] += 1

    def snapshot(self) -> dict[str, int]:
        """The counts so far."""
        with self._lock:
            return dict(self._counts)


def run_cli(
    args: list[str],
    *,
    install_hint: str,
    hang_hint: str = "",
    timeout: float = 60.0,
    cwd: str | None = None,
    umask: int = -1,
    counter: CommandCounter | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run one command and return it finished, whatever its exit code; output is text with surrogate escapes.

    A missing program is :class:`SchedulerUnavailableError` ending with ``install_hint``; a command that
    does not answer within ``timeout`` seconds is :class:`SchedulerError` ending with ``hang_hint``.
    """
    if counter is not None:
        counter.add(args[0])
    try:
        return subprocess.run(
            args,
            capture_output=True,
            text=True,
            errors="surrogateescape",
            timeout=timeout,
            cwd=cwd,
            check=False,
            umask=umask,
        )
    except FileNotFoundError as e:
        raise SchedulerUnavailableError(f"'{args[0]}' was not found: {install_hint}") from e
    except subprocess.TimeoutExpired as e:
        hint = f": {hang_hint}" if hang_hint else ""
        raise SchedulerError(f"'{' '.join(args[:2])}' did not answer within {timeout:g}s{hint}") from e


def cli_message(proc: subprocess.CompletedProcess[str]) -> str:
    """What a failed command said (stderr, else stdout, else its exit code), stripped."""
    return proc.stderr.strip() or proc.stdout.strip() or f"exit code {proc.returncode}"


def check_cli(
    proc: subprocess.CompletedProcess[str],
    what: str,
    *,
    unreachable: Callable[[subprocess.CompletedProcess[str]], bool] | None = None,
    unreachable_hint: str = "",
    service: str = "the service",
) -> str:
    """stdout of a finished command; a failure says what failed and the tool's own words.

    When ``unreachable(proc)`` says the service could not be reached, the error is
    :class:`SchedulerUnavailableError` naming ``service`` with ``unreachable_hint`` (how to start it).
    """
    if proc.returncode == 0:
        return proc.stdout
    err = cli_message(proc)
    if unreachable is not None and unreachable(proc):
        raise SchedulerUnavailableError(f"{what}: {service} cannot be reached ({err}); {unreachable_hint}")
    raise SchedulerError(f"{what} failed: {err}")


@contextlib.contextmanager
def mapped(what: str, table: Mapping[type[BaseException], type[TsmError]]) -> Iterator[None]:
    """Re-raise a client library's exceptions as tsm's: the first entry of ``table`` that matches wins.

    ``with mapped("create job", {ConnectionError: SchedulerUnavailableError, ApiException: SchedulerError}):``
    Errors of tsm itself and exceptions not in the table pass through unchanged.
    """
    try:
        yield
    except TsmError:
        raise
    except BaseException as e:
        for exc_type, tsm_type in table.items():
            if isinstance(e, exc_type):
                raise tsm_type(f"{what} failed: {e}") from e
        raise
