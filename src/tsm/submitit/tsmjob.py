"""The submitit face on tsm's schedulers: a job is a :mod:`tsm.functions` job, an array a :func:`tsm.functions.map`.

:class:`TsmJob` answers submitit's Job methods from the tsm job underneath (a ``concurrent.futures.Future``):
``wait()`` and ``result()`` wake on the job's end, ``state`` asks the scheduler, ``stdout()``/``stderr()`` read
the scheduler's logs of each task (rank), ``cancel()`` cancels the app. Once the job ended, every task's
result is also written to the folder as submitit writes it (``<job id>_<task>_result.pkl``), so a job
object made later from the folder and the job id alone (``LocalJob(folder, job_id)``) reads it there. A job
id is the app id (``4242``, ``4242_3`` on Slurm), or ``<sweep id>_<index>`` for an item of an array the
scheduler does not take whole.

:class:`TsmExecutor` is the executor of any tsm scheduler (``AutoExecutor(folder, cluster="kubernetes")``):
the generic parameters (``timeout_min``, ``mem_gb``, ``nodes``, ``tasks_per_node``, ``cpus_per_task``,
``gpus_per_node``, ``name``, ``stderr_to_stdout``) plus ``image``, ``setup``, ``env``, ``workspace``,
``array_parallelism``, ``signal_delay_s`` and the scheduler's own run options (``tsm runopts <name>``).
"""

from __future__ import annotations

import concurrent.futures
import os
import re
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from tsm.functions.checkpoint import Call, Checkpointable
from tsm.functions.errors import FunctionError, RemoteError, RemoteTraceback, ReplicaLostError
from tsm.submitit.core import core, utils
from tsm.submitit.core.job_environment import JobEnvironment

#: tsm app states as submitit (Slurm) names them
STATES = {"UNSUBMITTED": "PENDING", "SUBMITTED": "PENDING", "PENDING": "PENDING", "RUNNING": "RUNNING",
          "SUCCEEDED": "COMPLETED", "FAILED": "FAILED", "CANCELLED": "CANCELLED", "UNKNOWN": "UNKNOWN"}
#: the image jobs of container schedulers run when no ``image`` parameter is given
IMAGE_ENV = "TSM_SUBMITIT_IMAGE"
_SWEEP_ITEM = re.compile(r"(?P<sweep>[a-z][a-z0-9-]*)_(?P<idx>\d+)")


class TsmInfoWatcher(core.InfoWatcher):
    """The watcher of tsm-backed jobs: each job asks its own tsm job (which its own thread watches)."""

    def _make_command(self) -> list[str] | None:
        return None

    def get_state(self, job_id: str, mode: str = "standard") -> str:
        return "UNKNOWN"


def trace_of(exc: BaseException) -> str:
    """The replica's traceback of what a rank raised (the text submitit's result file holds)."""
    if isinstance(exc, RemoteError):
        return str(exc.remote_traceback)
    if isinstance(exc.__cause__, RemoteTraceback):
        return exc.__cause__.text
    return "".join(traceback.format_exception(exc))


class TsmJob(core.Job[core.R]):
    """A submitit Job on a tsm job (see the module doc)."""

    watcher = TsmInfoWatcher()
    #: the scheduler a job made from a folder and a job id alone runs on
    scheduler: ClassVar[str] = ""

    def __init__(self, folder: Path | str, job_id: str, tasks: Sequence[int] = (0,), *, tsm_job: Any = None,
                 scheduler: str | None = None, merge_streams: bool = False) -> None:
        self._tsm = tsm_job
        self._owner: TsmJob[Any] | None = None
        self._scheduler = scheduler or self.scheduler
        self._merge = merge_streams
        self._mirrored = False
        super().__init__(folder, job_id, tasks)
        for sub in self._sub_jobs:
            assert isinstance(sub, TsmJob)
            sub._owner, sub._scheduler, sub._merge = self, self._scheduler, merge_streams

    # -- the tsm job -------------------------------------------------------------------------------
    def _job(self) -> Any:
        if self._owner is not None:
            return self._owner._job()
        if self._tsm is None:
            self._tsm = _attach(self._scheduler, self.job_id)
        return self._tsm

    def _rank(self) -> int:
        return self.task_id or 0

    def _outcome(self) -> tuple[str, Any]:
        job = self._job()
        ranks = job.outcomes()
        if ranks is None:
            if job.cancelled():
                raise utils.UncompletedJobError(f"Job {self.job_id} was cancelled.")
            raise utils.UncompletedJobError(f"Job {self.job_id} ended without a result: {job.exception()}")
        ok, value = ranks[self._rank()]
        if ok:
            return "success", value
        if isinstance(value, ReplicaLostError):
            raise utils.UncompletedJobError(f"{self._no_result_message()}\n{value}")
        return "error", trace_of(value)

    def _mirror(self) -> None:
        """Write every task's result file as submitit would, once (best effort: the folder is the user's)."""
        owner = self._owner or self
        if owner._mirrored:
            return
        owner._mirrored = True
        ranks = owner._job().outcomes(0)
        for rank, (ok, value) in enumerate(ranks or ()):
            if not ok and isinstance(value, ReplicaLostError):
                continue
            path = utils.JobPaths(owner.paths.folder, owner.job_id, rank).result_pickle
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                utils.cloudpickle_dump(("success", value) if ok else ("error", trace_of(value)), path)
            except Exception:  # noqa: BLE001 - the result is in memory anyway
                continue

    # -- submitit's Job ----------------------------------------------------------------------------
    def _get_outcome_and_result(self) -> tuple[str, Any]:
        if self._tsm is None and self._owner is None and self.paths.result_pickle.exists():
            return super()._get_outcome_and_result()
        try:
            return self._outcome()
        except (FunctionError, LookupError):
            return super()._get_outcome_and_result()

    def exception(self) -> utils.UncompletedJobError | utils.FailedJobError | None:
        """As submitit's, except that of several tasks the first one that *raised* is the job's error, before a
        task that was stopped because of it (tsm ends the other tasks of a job when one fails)."""
        if not self._sub_jobs:
            return super().exception()
        self.wait()
        errors = [e for e in (sub.exception() for sub in self._sub_jobs) if e is not None]
        raised = [e for e in errors if isinstance(e, utils.FailedJobError)]
        return (raised or errors or [None])[0]

    def results(self) -> list[core.R]:
        if not self._sub_jobs:
            return super().results()
        error = self.exception()
        if error is not None:
            raise error
        return [sub.result() for sub in self._sub_jobs]

    def done(self, force_check: bool = False) -> bool:
        if self._sub_jobs:
            return all(sub.done() for sub in self._sub_jobs)
        if self.paths.result_pickle.exists():
            return True
        try:
            job = self._job()
        except LookupError:
            return True  # the scheduler no longer knows it: it will not end later
        if not job.done():
            return False
        self._mirror()
        return True

    def wait(self) -> None:
        try:
            job = self._job()
        except LookupError:
            return
        concurrent.futures.wait([job])
        self._mirror()

    @property
    def state(self) -> str:
        try:
            job = self._job()
        except LookupError:
            return "UNKNOWN"
        status = job.final_status() if job.done() else job.status()
        if status is None:
            return "CANCELLED" if job.cancelled() else "PENDING" if job.handle is None else "UNKNOWN"
        name: str = status.state.name
        return STATES.get(name, name)

    def get_info(self, mode: str = "force") -> dict[str, str]:
        return {"JobID": self.job_id, "State": self.state}

    def _log(self, stream: str) -> str | None:
        from tsm.errors import NotSupportedError
        from tsm.schedulers.api import Stream

        try:
            lines = list(self._job().logs(self._rank(), streams=Stream(stream)))
        except NotSupportedError:
            lines = [] if stream == "stderr" else list(self._job().logs(self._rank()))
        except (FunctionError, LookupError):
            return None
        return "".join(lines) or None

    def stdout(self) -> str | None:
        if self._sub_jobs:
            return super().stdout()
        return self._log("combined" if self._merge else "stdout")

    def stderr(self) -> str | None:
        if self._sub_jobs:
            return super().stderr()
        return None if self._merge else self._log("stderr")

    def cancel(self, check: bool = True) -> None:
        try:
            self._job().cancel()
        except LookupError:
            if check:
                raise

    def __del__(self) -> None:
        if self.__dict__.get("_cancel_at_deletion") and self.__dict__.get("_tsm") is not None and not self._tsm.done():
            self._tsm.cancel()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_tsm"] = None  # a future does not pickle; the job is found again from its id
        return state


def _attach(scheduler: str, job_id: str) -> Any:
    """The tsm job of a job id (an app id, or ``<sweep id>_<index>`` of an array tsm fed itself)."""
    from tsm.functions import attach
    from tsm.specs.handles import make_app_handle

    m = _SWEEP_ITEM.fullmatch(job_id)
    if m is not None:
        from tsm.sweep import sweep_trials

        trial = sweep_trials(f"sweep://default/{m['sweep']}")[int(m["idx"])]
        if trial.handle is None:
            raise LookupError(f"item {m['idx']} of the array has not been launched yet")
        return attach(trial.handle)
    return attach(make_app_handle(scheduler, "default", job_id))


def requeue_call(owner: Any, call: Call) -> Call | None:
    """submitit's requeue decision, in a warned replica: the next attempt's call, or None (and why, in the
        ``submitit`` log as submitit writes it). A warning near the time limit spends one of the call's
    timeouts (``_timeout_countdown``, from ``max_num_timeout``); none left, or a checkpoint that returns None,
    and the job is not requeued from a checkpoint. Task 0 logs; every task keeps its own checkpoint."""
    import socket
    import time

    from tsm.functions.env import environment
    from tsm.functions.worker import STARTED
    from tsm.submitit.core import logger

    log = logger.get_logger()
    limit = float(getattr(call, "_timeout_min", 0) or 0) * 60
    walltime = time.time() - STARTED
    timed_out = limit > 0 and walltime >= min(limit * 0.8, limit - 600)
    rank0 = environment().rank == 0
    if rank0:
        log.warning(f"{JobEnvironment._usr_sig().name} on {socket.gethostname()}: the job is "
                    f"{'timed-out (near its time limit)' if timed_out else 'preempted'}")
    countdown = int(getattr(call, "_timeout_countdown", 0)) - timed_out
    hook = utils.checkpoint_hook(owner)
    nxt = hook(*call.args, **call.kwargs) if hook is not None and countdown >= 0 else None
    if nxt is None:
        if rank0:
            why = "timed-out too many times" if countdown < 0 else "checkpoint function returned None"
            log.info(f"no checkpoint for a requeue: {why}.")
        return None
    if isinstance(nxt, utils.DelayedSubmission):
        nxt.set_timeout(limit / 60, countdown)
    if rank0:
        log.info(f"checkpoint kept: job {environment().app_id} resumes from it ({countdown} remaining timeouts)")
    return resumable(nxt)


class _Resumable(Checkpointable):
    """A callable that is checkpointable by submitit's rule (a ``checkpoint`` method) as tsm's worker sees it."""

    def __init__(self, function: Callable[..., Any]) -> None:
        self.function = function

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.function(*args, **kwargs)

    def _resume_call(self, call: Call) -> Call | None:
        return requeue_call(self.function, call)


class _Item(Checkpointable):
    """Runs one item of an array of different calls (``batch()``, ``submit_array``); checkpoints as the item's."""

    def __call__(self, ds: utils.DelayedSubmission) -> Any:
        return ds.result()

    def _resume_call(self, call: Call) -> Call | None:
        ds = call.args[0]
        inner = requeue_call(ds.function, ds)
        return None if inner is None else Call(self, inner)


def resumable(ds: Call | None) -> Call | None:
    """``ds`` with its callable made checkpointable for tsm's worker when submitit's rule says it is."""
    if ds is None:
        return None
    fn = ds.function
    if not isinstance(fn, Checkpointable) and utils.checkpoint_hook(fn) is not None:
        fn = _Resumable(fn)
    out = utils.DelayedSubmission(fn, *ds.args, **ds.kwargs)
    if isinstance(ds, utils.DelayedSubmission):
        out.set_timeout(ds._timeout_min, ds._timeout_countdown)
    return out


@dataclass
class Plan:
    """What an executor's parameters mean for tsm: submit's keywords and the scheduler's run options."""

    options: dict[str, Any] = field(default_factory=dict)
    cfg: dict[str, Any] = field(default_factory=dict)
    parallel: int | None = None
    merge_streams: bool = False
    timeout_min: float = 0.0


def lifecycle(timeout_min: float | None, signal_delay_s: float, checkpointable: bool, max_num_timeout: int) -> dict[str, Any]:
    """tsm's run options for submitit's time limit: the limit, USR2 (``SUBMITIT_PREEMPT_SIGNAL``) ``signal_delay_s``
    before it, and, for a checkpointable callable, requeues at the limit (at most ``max_num_timeout``)."""
    if not timeout_min:
        return {}
    limit = max(1, round(timeout_min * 60))
    cfg: dict[str, Any] = {"time_limit": f"{limit}s", "warn_signal": JobEnvironment.USR_SIG,
                           "warn_before": f"{min(float(signal_delay_s), limit / 2):g}s",
                           "max_preemptions": max_num_timeout}
    if checkpointable:
        cfg["requeue_on_time_limit"] = True
    return cfg


def is_checkpointable(fn: Any) -> bool:
    return isinstance(fn, Checkpointable) or utils.checkpoint_hook(fn) is not None


def submitit_env(name: str, folder: Path) -> dict[str, str]:
    """What every task of a job sees, so ``JobEnvironment()`` knows where it runs."""
    return {"SUBMITIT_EXECUTOR": name, "SUBMITIT_FOLDER": str(folder)}


class TsmJobEnvironment(JobEnvironment):
    """The environment of a job on any tsm scheduler: read from what tsm gives every replica."""

    _env: ClassVar[dict[str, str]] = {"job_id": "TSM_APP_ID", "num_tasks": "TSM_NUM_REPLICAS",
                                      "global_rank": "TSM_REPLICA_ID", "num_nodes": "", "node": "", "local_rank": ""}

    def _env_of(self) -> Any:
        from tsm.functions.env import environment

        return environment()

    @property
    def num_nodes(self) -> int:
        return int(self._env_of().num_nodes)

    @property
    def node(self) -> int:
        return int(self._env_of().node)

    @property
    def local_rank(self) -> int:
        return int(self._env_of().local_rank)

    @property
    def hostnames(self) -> list[str]:
        env = self._env_of()
        return [env.rank0_host] if env.rank0_host != env.hostname else [env.hostname]

    def _requeue(self, countdown: int) -> None:
        """Nothing: tsm requeues the job itself (a preemption, a time limit with ``requeue_on_time_limit``)."""


def default_image() -> str:
    return os.environ.get(IMAGE_ENV, "")
