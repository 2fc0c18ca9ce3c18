"""What can go wrong with a function run as a job, one class per thing a user can act on.

::

    TsmError
    └── FunctionError                  base of everything below; ``handle`` names the job when known
        ├── FunctionPickleError        the function, an argument or the result cannot be pickled
        │                              (at submit for the call: nothing was submitted)
        ├── FunctionVersionError       the replica's Python cannot load what this Python pickled
        ├── FunctionLoadError          the replica could not unpickle the call (a module it lacks, ...)
        ├── ReplicaLostError           a replica ended without returning (killed, cancelled, lost)
        ├── RemoteError                the function raised an exception this process cannot unpickle:
        │                              its type's name, message and the remote traceback as text
        └── TransportError             a result did not come back whole (a log cut short, a bad frame)

An exception the function raised that *can* be unpickled is raised as itself, with the replica's traceback as
its ``__cause__`` (a :class:`RemoteTraceback`, as :class:`concurrent.futures.ProcessPoolExecutor` does).
"""

from __future__ import annotations

import pickle

from tsm.errors import TsmError


class FunctionError(TsmError):
    """A function job could not be submitted, run or read back."""


class FunctionPickleError(FunctionError, pickle.PicklingError):
    """The function, one of its arguments or its result cannot be pickled; the message names which."""


class FunctionVersionError(FunctionError):
    """The replica's Python (or cloudpickle) is not the one that pickled the call: bytecode does not travel."""


class FunctionLoadError(FunctionError):
    """The replica could not load the call: a module it does not have, a class that moved, ..."""


class ReplicaLostError(FunctionError):
    """A replica ended without returning a result; the message says how it ended (signal, exit code, cancel)."""

    def __init__(self, message: str, rank: int = 0, *, handle: str | None = None, scheduler: str | None = None) -> None:
        super().__init__(message, handle=handle, scheduler=scheduler)
        self.rank = rank


class RemoteError(FunctionError):
    """The function raised an exception that cannot be rebuilt here; ``type_name``, ``message`` and
    ``remote_traceback`` say what it was."""

    def __init__(self, type_name: str, message: str, remote_traceback: str, *, handle: str | None = None,
                 scheduler: str | None = None) -> None:
        super().__init__(f"{type_name}: {message}", handle=handle, scheduler=scheduler)
        self.type_name = type_name
        self.message = message
        self.remote_traceback = remote_traceback


class TransportError(FunctionError):
    """A result did not come back whole through the scheduler's channel (the message says which and why)."""


class RemoteTraceback(Exception):
    """The replica's traceback, as text: the ``__cause__`` of an exception a function raised remotely."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return self.text
