"""Every error tsm raises on purpose, in one tree.

Catch :class:`TsmError` to handle anything tsm reports; catch a leaf to act on one thing a user can fix::

    TsmError                       every error: ``handle`` and ``scheduler`` say which app/backend, if known
    ├── UsageError                 a command-line value the parser could not check (CLI exit code 2)
    ├── InvalidAppError            the AppDef breaks a rule (names the role and the field)
    ├── InvalidRunOptionError      a run option is unknown, missing or of the wrong type
    │   ├── RunOptionDefaultError  a scheduler declared an option with a default of another type (a TypeError)
    │   └── ConfigError            a config file is unreadable or has a bad key (names the file)
    │       └── ConfigFileNotFoundError  $TORCHXCONFIG names no file (a FileNotFoundError)
    ├── MalformedAppHandleError    an app handle is not ``scheduler://session/app_id``
    ├── UnknownAppError            no scheduler knows the handle (or it is gone)
    ├── UnknownSchedulerError      no scheduler is registered under that name
    ├── UnknownResourceError       no named resource is registered under that name
    ├── ComponentError             a component cannot be used
    │   ├── ComponentNotFoundError     no builtin, entry point or file function by that name
    │   ├── ComponentImportError       the component's module raised while importing
    │   └── ComponentArgumentError     its command-line arguments are wrong (carries the usage)
    ├── AppStatusError             the app did not succeed (``AppStatus.raise_for_status``; carries ``status``)
    ├── NotSupportedError          a feature this tsm does not implement yet (e.g. workspaces); a NotImplementedError
    ├── SchedulerError             a scheduler could not do what was asked
    │   ├── SchedulerUnavailableError  its system or client library is not there (says what to install)
    │   ├── SubmissionError            the scheduler refused the request
    │   │   ├── EnvBuildError          a lockfile environment could not be built (``detail``: uv's own words)
    │   │   └── SecretError            a declared secret has no value at submit (names it, never shows a value)
    │   ├── AppStillRunningError       the app still runs, so it cannot be removed (cancel it first)
    │   ├── ReplicaNotRunningError     no live replica to exec into, dump or reach: ended, or not started yet
    │   └── IncompleteRemovalError     some apps were removed, others not (``removed``, ``failed``: why)
    ├── StoreError                 the state store under $TSM_HOME cannot be read or written
    ├── TimerError                 an expiration timer request was refused or could not be delivered
    └── TrackerError               a tracker cannot record or read (also :mod:`tsm.tracker.api`'s)
        └── UnknownRunError            no tracker record for that run id (a LookupError)

Messages are one line and say what to do; the CLI prints ``error: <message>`` and exits non-zero.
Every error takes optional keywords ``handle=`` and ``scheduler=`` and keeps them as attributes (None
when not given), so a caller can tell which app or backend failed without parsing the message.
TorchX's exception names (``UnknownAppException``, ...) are aliases of these classes in :mod:`tsm.specs`.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from typing import Any


class TsmError(Exception):
    """Base of every error tsm raises on purpose; ``handle`` and ``scheduler`` name what it is about."""

    handle: str | None
    scheduler: str | None

    def __init__(self, *args: object, handle: str | None = None, scheduler: str | None = None) -> None:
        super().__init__(*args)
        self.handle = handle
        self.scheduler = scheduler


class UsageError(TsmError):
    """A command-line value the parser could not check (a bad regex, time or log path): CLI exit code 2."""


class InvalidAppError(TsmError, ValueError):
    """The app definition breaks a rule; the message names the role and the field."""


class InvalidRunOptionError(TsmError, ValueError):
    """A run option is unknown, required but missing, or of the wrong type."""


class RunOptionDefaultError(InvalidRunOptionError, TypeError):
    """A scheduler declares a run option whose default is not of the option's type (TorchX raises TypeError)."""


class ConfigError(InvalidRunOptionError):
    """A config file cannot be parsed or holds a bad section or key; the message names the file."""


class ConfigFileNotFoundError(ConfigError, FileNotFoundError):
    """The config file named (``$TORCHXCONFIG``) does not exist."""


class MalformedAppHandleError(TsmError, ValueError):
    """The string is not an app handle of the form ``scheduler://session/app_id``."""


class UnknownAppError(TsmError, LookupError):
    """No scheduler knows the app (never submitted, removed, or the scheduler forgot it)."""


class UnknownSchedulerError(TsmError, KeyError, ValueError):
    """No scheduler is registered under the name asked for (a KeyError and a ValueError, as TorchX raises either)."""

    def __str__(self) -> str:  # KeyError would show the message quoted
        return str(self.args[0]) if len(self.args) == 1 else super().__str__()


class UnknownResourceError(TsmError, KeyError):
    """No named resource is registered under the name asked for (a KeyError, as ``named_resources[...]`` is)."""

    def __str__(self) -> str:  # KeyError would show the message quoted
        return str(self.args[0]) if len(self.args) == 1 else super().__str__()


class ComponentError(TsmError):
    """A component cannot be found, imported or called."""


class ComponentNotFoundError(ComponentError, LookupError):
    """No builtin, entry point or ``file.py:function`` by that name."""


class ComponentImportError(ComponentError, ImportError):
    """The module that holds the component raised while being imported."""


class ComponentArgumentError(ComponentError, ValueError):
    """The component's arguments are wrong; ``usage`` holds the component's usage text."""

    def __init__(self, message: str, usage: str = "", *, handle: str | None = None, scheduler: str | None = None) -> None:
        super().__init__(message, handle=handle, scheduler=scheduler)
        self.usage = usage


class AppStatusError(TsmError):
    """An app ended other than SUCCEEDED; ``status`` is its :class:`~tsm.specs.AppStatus`."""

    def __init__(self, status: Any, *args: object, handle: str | None = None, scheduler: str | None = None) -> None:
        super().__init__(*(args or (f"job did not succeed: {getattr(status, 'state', status)}",)),
                         handle=handle, scheduler=scheduler)
        self.status = status


class NotSupportedError(TsmError, NotImplementedError):
    """A feature was asked for that this version of tsm does not implement (say so rather than ignore it)."""


class SchedulerError(TsmError):
    """A scheduler could not carry out a request."""


class SchedulerUnavailableError(SchedulerError):
    """The scheduler's system or client library is missing; the message says what to install or start."""


class SubmissionError(SchedulerError):
    """The scheduler refused the request it was given."""


class EnvBuildError(SubmissionError):
    """A role's lockfile environment could not be built; ``detail`` keeps the installer's full message."""

    def __init__(self, *args: object, detail: str = "", **kw: str | None) -> None:
        super().__init__(*args, **kw)
        self.detail = detail


class SecretError(SubmissionError):
    """A declared secret cannot be read at submit: names the secret and where it looked, never a value."""


class AppStillRunningError(SchedulerError):
    """The app has not ended, so its state and logs cannot be removed; cancel it first."""


class ReplicaNotRunningError(SchedulerError):
    """The replica ``tsm exec``/``stack``/``port-forward`` names has no live process: its app (or the replica)
    ended, or it has not started yet (CLI exit code 4)."""


class IncompleteRemovalError(SchedulerError):
    """A removal did what it could: the apps in ``removed`` are gone, each in ``failed`` (handle -> why) is not."""

    def __init__(self, *args: object, removed: Iterable[str] = (), failed: Mapping[str, str] | None = None,
                 handle: str | None = None, scheduler: str | None = None) -> None:
        super().__init__(*args, handle=handle, scheduler=scheduler)
        self.removed = list(removed)
        self.failed = dict(failed or {})


class StoreError(TsmError, OSError):
    """The state store under ``$TSM_HOME`` cannot be read or written (full or read-only disk, bad permissions)."""


class TimerError(TsmError):
    """An expiration-timer request was refused by the server or could not be delivered to it."""


class TrackerError(TsmError):
    """A tracker cannot record or read (unknown tracker name, value it cannot store, store failure)."""


class UnknownRunError(TrackerError, LookupError):
    """No tracker record exists for the run id asked for."""


def brief(value: object, width: int = 80) -> str:
    """``repr(value)`` for a one-line error message, cut to about ``width`` characters.

    A long string says how long it was; a value whose repr cannot be made (an int of more digits than
    ``sys.get_int_max_str_digits()``) is shown by its type.
    """
    try:
        text = repr(value)
    except ValueError:
        return f"<{type(value).__name__}>"
    if len(text) <= width:
        return text
    if isinstance(value, str):
        return f"{text[: width * 2 // 3]}...' ({len(value)} characters)"
    return text[: width - 3] + "..."


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """Return ``" (did you mean 'x'?)"`` for the closest choice, or ``""`` when none is close."""
    import difflib

    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""
