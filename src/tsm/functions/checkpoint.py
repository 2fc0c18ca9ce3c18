"""Resuming a function where it was stopped: a :class:`Checkpointable` callable names the call to run next.

submitit's idea, on tsm's warning: when the replica is warned before a time limit, a preemption or a cancel
(``warn_signal``, ``warn_before``: :mod:`tsm.lifecycle`), the worker asks the callable for its checkpoint, a
:class:`Call` (by default the same callable, in the state it has reached, with the same arguments), and keeps
it where the job's attempts share files. The next attempt (a requeue after a preemption, a restart after a
time limit with ``requeue_on_time_limit``, a retry) runs that call instead of the one submitted::

    class Train(tsm.functions.Checkpointable):
        def __init__(self) -> None:
            self.step = 0                  # the state that survives: everything pickled with the object

        def __call__(self, steps: int) -> float:
            while self.step < steps:
                ...                        # one step of work
                self.step += 1
            return loss

    job = runner.submit(Train(), 10_000, scheduler="slurm", warn_signal="USR1", warn_before="120s")

Where the checkpoint is kept: the job's directory on schedulers whose replicas share this machine's files
(local, Slurm), else ``checkpoint_dir=`` (a volume the replicas mount); without either the function starts
over on the next attempt, and :func:`tsm.functions.submit` says so when it is submitted.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any


class Call:
    """A callable with its arguments, run by calling it: what a job runs, and what a checkpoint returns."""

    def __init__(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        self.function = function
        self.args = args
        self.kwargs = kwargs

    def __call__(self) -> Any:
        return self.function(*self.args, **self.kwargs)

    def extended(self, *more: Any) -> Call:
        """A copy of this call (of its own class, attributes kept) with ``more`` positional arguments after its own."""
        out = copy.copy(self)
        out.args = (*self.args, *more)
        return out

    def __repr__(self) -> str:
        name = getattr(self.function, "__qualname__", type(self.function).__name__)
        return f"Call({name}, args={self.args!r}, kwargs={self.kwargs!r})"


class Checkpointable:
    """A callable whose state can be saved when tsm warns its replica, and resumed on the next attempt.

    Subclass it and implement ``__call__``; override :meth:`checkpoint` to choose what the next attempt runs
    (return None to start over instead). The object is pickled as it is at the warning, so keep the state to
    resume from in its attributes.
    """

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must define __call__: what the job runs")

    def checkpoint(self, *args: Any, **kwargs: Any) -> Call | None:
        """The call the next attempt runs; by default this object as it is now, with the same arguments."""
        return Call(self, *args, **kwargs)

    def _resume_call(self, call: Call) -> Call | None:
        """What the worker asks at the warning, given the call this attempt runs (a seam: submitit's face
        answers with its own hook and bookkeeping)."""
        return self.checkpoint(*call.args, **call.kwargs)
