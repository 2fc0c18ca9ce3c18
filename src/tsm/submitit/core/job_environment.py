"""submitit's ``core.job_environment``: inside a job, which job and task this is; the preemption signal.

``JobEnvironment()`` is the environment of the cluster the job runs on (Slurm, local, debug, or tsm's, for a
job on any tsm scheduler): ``job_id``, ``global_rank``, ``local_rank``, ``node``, ``num_tasks``,
``num_nodes``, ``hostnames``. Each subclass reads it from the variables its cluster sets (``_env``).

The :class:`SignalHandler` is submitit's own protocol for executors written for submitit (plugins, and
:func:`tsm.submitit.core.submission.process_job`): on the preemption signal (``SUBMITIT_PREEMPT_SIGNAL``,
default USR2) task 0 checkpoints a checkpointable callable into the submitted pickle and requeues, counting
timeouts. Jobs of tsm's own executors are warned and requeued by tsm instead (:mod:`tsm.lifecycle`).
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
import types
from pathlib import Path
from typing import Any, ClassVar

from tsm.submitit.core import logger, utils
from tsm.submitit.core.utils import DelayedSubmission, JobPaths

_PREEMPT_SIG_ENV = "SUBMITIT_PREEMPT_SIGNAL"


class JobEnvironment:
    """The job's environment (see the module doc); instantiating the base class gives the active one."""

    USR_SIG = os.environ.get(_PREEMPT_SIG_ENV, "USR2")
    _env: ClassVar[dict[str, str]] = {}

    def __new__(cls, *args: Any) -> JobEnvironment:
        if cls is not JobEnvironment:
            return super().__new__(cls)
        from tsm.submitit.core import plugins

        return plugins.get_job_environment()

    def __init__(self) -> None:
        self.cluster = self.name()

    @classmethod
    def name(cls) -> str:
        return cls.__name__.removesuffix("JobEnvironment").lower()

    @property
    def paths(self) -> JobPaths:
        """The job's files in its folder (``SUBMITIT_FOLDER``)."""
        return JobPaths(os.environ["SUBMITIT_FOLDER"], job_id=self.job_id, task_id=self.global_rank)

    def activated(self) -> bool:
        """Whether this process runs inside a job of this environment (``SUBMITIT_EXECUTOR``)."""
        return os.environ.get("SUBMITIT_EXECUTOR", "") == self.name()

    @property
    def hostname(self) -> str:
        return socket.gethostname()

    @property
    def hostnames(self) -> list[str]:
        return [self.hostname]

    @property
    def job_id(self) -> str:
        return f"{self.array_job_id}_{self.array_task_id}" if self.array_job_id else self.raw_job_id

    @property
    def raw_job_id(self) -> str:
        return os.environ[self._env["job_id"]]

    @property
    def array_job_id(self) -> str | None:
        key = self._env.get("array_job_id")
        return None if key is None else os.environ.get(key)

    @property
    def array_task_id(self) -> str | None:
        key = self._env.get("array_task_id")
        return None if key is None else os.environ.get(key)

    def _int(self, name: str, default: int) -> int:
        return int(os.environ.get(self._env[name], default))

    @property
    def num_tasks(self) -> int:
        return self._int("num_tasks", 1)

    @property
    def num_nodes(self) -> int:
        return self._int("num_nodes", 1)

    @property
    def node(self) -> int:
        return self._int("node", 0)

    @property
    def global_rank(self) -> int:
        return self._int("global_rank", 0)

    @property
    def local_rank(self) -> int:
        return self._int("local_rank", 0)

    def __repr__(self) -> str:
        per_node = self.num_tasks // max(1, self.num_nodes)
        return (f"JobEnvironment(job_id={self.job_id}, hostname={self.hostname}, local_rank={self.local_rank}"
                f"({per_node}), node={self.node}({self.num_nodes}), global_rank={self.global_rank}({self.num_tasks}))")

    @classmethod
    def _usr_sig(cls) -> signal.Signals:
        try:
            return signal.Signals["SIG" + cls.USR_SIG]
        except KeyError:
            raise RuntimeError(f"SIG{cls.USR_SIG} is no signal: set {_PREEMPT_SIG_ENV} to one (USR2, say) or unset it") from None

    def _handle_signals(self, paths: JobPaths, submission: DelayedSubmission) -> None:
        """Install the :class:`SignalHandler` (submitit's protocol, see the module doc)."""
        handler = SignalHandler(self, paths, submission)
        signal.signal(signal.SIGTERM, handler.bypass)
        signal.signal(signal.SIGCONT, handler.bypass)
        signal.signal(self._usr_sig(), handler.checkpoint_and_try_requeue)

    def _requeue(self, countdown: int) -> None:
        """Requeue this job (each cluster's environment says how)."""


class SignalHandler:
    """submitit's preemption protocol for a job run by :func:`~tsm.submitit.core.submission.process_job`."""

    def __init__(self, env: JobEnvironment, job_paths: JobPaths, delayed: DelayedSubmission) -> None:
        self.env = env
        self._job_paths = job_paths
        self._delayed = delayed
        self._logger = logger.get_logger()
        self._start_time = time.time()

    def has_timed_out(self) -> bool:
        """Whether the job ran for most of its time (so the signal is its time limit, not a preemption)."""
        walltime = time.time() - self._start_time
        limit = self._delayed._timeout_min * 60
        timed_out = walltime >= min(limit * 0.8, limit - 10 * 60)
        word = "has" if timed_out else "has not"
        self._logger.info(f"ran {walltime / 60:.0f} of {limit / 60:.0f} min: the job {word} timed out")
        return timed_out

    def bypass(self, signum: int, frame: types.FrameType | None = None) -> None:
        self._logger.warning(f"{signal.Signals(signum).name} ignored")

    def checkpoint_and_try_requeue(self, signum: int, frame: types.FrameType | None = None) -> None:
        timed_out = self.has_timed_out()
        self._logger.warning(f"{signal.Signals(signum).name} on {socket.gethostname()}: the job is "
                             f"{'timed-out (near its time limit)' if timed_out else 'preempted'}")
        if self.env.global_rank != 0:
            self._logger.info(f"task {self.env.global_rank}: task 0 checkpoints and requeues the job")
            return
        delayed = self._delayed
        countdown = delayed._timeout_countdown - timed_out
        reason = ""
        if utils.checkpoint_hook(delayed.function) is not None:
            reason = _checkpoint(delayed, self._job_paths.submitted_pickle, countdown)
        elif timed_out:
            reason = "timed-out and not checkpointable"
        if countdown < 0:
            reason = "timed-out too many times"
        if reason:
            message = f"no requeue: {reason}."
            self._logger.info(message)
            raise utils.UncompletedJobError(message)
        self.env._requeue(countdown)
        self._exit()

    def checkpoint_and_exit(self, signum: int, frame: types.FrameType | None = None) -> None:
        self._logger.info(f"{signal.Signals(signum).name} on {socket.gethostname()}")
        if self.env.global_rank:
            self._logger.info(f"task {self.env.global_rank}: task 0 checkpoints the job")
            return
        if utils.checkpoint_hook(self._delayed.function) is not None:
            _checkpoint(self._delayed, self._job_paths.submitted_pickle, self._delayed._timeout_countdown)
        self._exit()

    def _exit(self) -> None:
        self._logger.info("leaving after the preemption or time limit")
        sys.exit(-1)


def _checkpoint(delayed: DelayedSubmission, filepath: Path, countdown: int) -> str:
    """Ask the callable for its checkpoint and write it over the submitted pickle; why not requeued, or ""."""
    logger.get_logger().info("asking the callable for its checkpoint")
    nxt = delayed._checkpoint_function()
    if nxt is None:
        return "checkpoint function returned None"
    nxt.set_timeout(delayed._timeout_min, countdown)
    with utils.temporary_save_path(filepath) as tmp:
        nxt.dump(tmp)
    return ""
