"""submitit's ``core.core``: the Job, the shared status watcher, the executors' base classes.

:class:`Job` is submitit's job over its folder (see :mod:`.utils`): ``result()``/``results()``/``exception()``
read the task's result file, ``done()`` asks it and the shared :class:`InfoWatcher`, ``stdout()``/``stderr()``
read the log files. tsm's own executors return :class:`tsm.submitit.tsmjob.TsmJob`, which answers the same
methods from the tsm job underneath (a :class:`concurrent.futures.Future`): ``wait()`` wakes on the job's end
instead of polling the folder every second. :class:`PicklingExecutor` keeps submitit's plugin contract
(``_submit_command`` and its hooks) for executors written for submitit.

The watcher batches status calls for every job of its class: it asks at most every ``delay_s`` seconds, more
often just after a job was registered (after 2 s, then at half the time since the last registration).
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import subprocess
import time as _time
import uuid
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Generic, TypedDict, TypeVar

from tsm.submitit.core import logger, utils

R = TypeVar("R", covariant=True)

#: states in which a job is not done
INCOMPLETE = ("READY", "PENDING", "RUNNING", "UNKNOWN", "REQUEUED", "COMPLETING", "PREEMPTED")


class InfoWatcher:
    """One per job class: batches the status calls for all its jobs (see the module doc)."""

    def __init__(self, delay_s: int = 60) -> None:
        self._delay_s = delay_s
        self._registered: set[str] = set()
        self._finished: set[str] = set()
        self._info_dict: dict[str, dict[str, str]] = {}
        self._output = b""
        self._start_time = 0.0
        self._last_status_check = float("-inf")
        self._num_calls = 0

    def read_info(self, string: bytes | str) -> dict[str, dict[str, str]]:
        raise NotImplementedError

    def _make_command(self) -> list[str] | None:
        raise NotImplementedError

    def get_state(self, job_id: str, mode: str = "standard") -> str:
        raise NotImplementedError

    @property
    def num_calls(self) -> int:
        """How many status calls were made."""
        return self._num_calls

    def clear(self) -> None:
        """Forget what is cached (finished jobs included)."""
        self._finished = set()
        self._start_time = _time.time()
        self._last_status_check = float("-inf")
        self._info_dict = {}
        self._output = b""

    def get_info(self, job_id: str, mode: str = "standard") -> dict[str, str]:
        """What the last call said of ``job_id``; ``mode``: ``force`` (call now), ``standard``, ``cache``."""
        if job_id is None:
            raise RuntimeError("a job id is needed to ask for a job's state")
        if job_id not in self._registered:
            self.register_job(job_id)
        self.update_if_long_enough(mode)
        return self._info_dict.get(job_id, {})

    def is_done(self, job_id: str, mode: str = "standard") -> bool:
        return self.get_state(job_id, mode=mode).upper() not in INCOMPLETE

    def update_if_long_enough(self, mode: str) -> None:
        if mode not in ("standard", "force", "cache"):
            raise ValueError(f"mode must be standard, force or cache, not {mode!r}")
        if mode == "cache":
            return
        now = _time.time()
        delay = 0.001 if mode == "force" else min(self._delay_s, max(2, (now - self._start_time) / 2))
        if now - self._last_status_check > delay:
            self.update()

    def update(self) -> None:
        """Ask for the state of every registered job, in one call."""
        command = self._make_command()
        if command is None:
            return
        self._num_calls += 1
        try:
            self._output = subprocess.check_output(command, shell=False)
        except Exception as e:  # noqa: BLE001 - a failed call leaves the last states
            logger.get_logger().warning(f"status call {self.num_calls} failed ({e}): the states shown are the last known")
        else:
            self._info_dict.update(self.read_info(self._output))
        self._last_status_check = _time.time()
        for job_id in self._registered - self._finished:
            if self.is_done(job_id, mode="cache"):
                self._finished.add(job_id)

    def register_job(self, job_id: str) -> None:
        if not isinstance(job_id, str):
            raise TypeError(f"job ids are strings, not {type(job_id).__name__}")
        self._registered.add(job_id)
        self._start_time = _time.time()
        self._last_status_check = float("-inf")


class Job(Generic[R]):
    """A job of a folder (see the module doc); with several tasks, ``task(i)`` is task ``i``'s own Job."""

    _cancel_command = "dummy"
    _results_timeout_s = 15
    watcher = InfoWatcher()

    def __init__(self, folder: Path | str, job_id: str, tasks: Sequence[int] = (0,)) -> None:
        self._job_id = job_id
        self._tasks = tuple(tasks)
        self._sub_jobs: Sequence[Job[R]] = []
        self._cancel_at_deletion = False
        if len(self._tasks) > 1:
            self._sub_jobs = [type(self)(folder=folder, job_id=job_id, tasks=(k,)) for k in self._tasks]
        self._paths = utils.JobPaths(folder, job_id=job_id, task_id=self.task_id)
        self._start_time = _time.time()
        self._last_status_check = self._start_time
        self._register_in_watcher()

    def _register_in_watcher(self) -> None:
        if not self._tasks[0]:
            self.watcher.register_job(self.job_id)

    @property
    def job_id(self) -> str:
        return self._job_id

    @property
    def paths(self) -> utils.JobPaths:
        return self._paths

    @property
    def num_tasks(self) -> int:
        return len(self._sub_jobs) or 1

    @property
    def task_id(self) -> int | None:
        return None if len(self._tasks) > 1 else self._tasks[0]

    def submission(self) -> utils.DelayedSubmission:
        """The submitted call (``function``, ``args``, ``kwargs``), from the folder."""
        if not self.paths.submitted_pickle.exists():
            raise FileNotFoundError(f"no submitted call at {self.paths.submitted_pickle}")
        return utils.DelayedSubmission.load(self.paths.submitted_pickle)

    def cancel_at_deletion(self, value: bool = True) -> Job[R]:
        """Cancel the job when this object is deleted (off by default); returns the job, for chaining."""
        self._cancel_at_deletion = value
        return self

    def task(self, task_id: int) -> Job[R]:
        """Task ``task_id`` as a Job (the job itself when it has one task)."""
        if not 0 <= task_id < self.num_tasks:
            raise ValueError(f"no task {task_id}: task_id must be between 0 and {self.num_tasks - 1}")
        return self._sub_jobs[task_id] if self._sub_jobs else self

    def cancel(self, check: bool = True) -> None:
        (subprocess.check_call if check else subprocess.call)([self._cancel_command, f"{self.job_id}"], shell=False)

    def result(self) -> R:
        r = self.results()
        if self._sub_jobs:
            raise RuntimeError(f"the job has {self.num_tasks} tasks: results() gives every task's, result() only one task's")
        return r[0]

    def results(self) -> list[R]:
        """Wait, then every task's result (the first failed task's error is raised)."""
        self.wait()
        if self._sub_jobs:
            return [sub.result() for sub in self._sub_jobs]
        outcome, result = self._get_outcome_and_result()
        if outcome == "error":
            exc = self.exception()
            raise exc if exc is not None else RuntimeError("the job failed, and said nothing of why")
        return [result]

    def exception(self) -> utils.UncompletedJobError | utils.FailedJobError | None:
        """Wait, then the job's error (not raised): the first failed task's, None when all succeeded."""
        self.wait()
        if self._sub_jobs:
            errors = [e for e in (sub.exception() for sub in self._sub_jobs) if e is not None]
            return errors[0] if errors else None
        try:
            outcome, trace = self._get_outcome_and_result()
        except utils.UncompletedJobError as e:
            return e
        if outcome == "error":
            return utils.FailedJobError(
                f"job {self.job_id}, task {self.task_id}, raised:\n{trace}\n(its whole output: "
                f"job.stdout({self.task_id}), job.stderr({self.task_id}))"
            )
        return None

    def _get_outcome_and_result(self) -> tuple[str, Any]:
        """("success", value) or ("error", traceback) from the result file (waited for a while: a shared file
        system can be slow to show it); :class:`UncompletedJobError` when there is none."""
        if self._sub_jobs:
            raise RuntimeError("a job of several tasks has no outcome of its own: ask each task()")
        timeout, start = self._results_timeout_s, _time.time()
        while not self.paths.result_pickle.exists() and _time.time() - start < timeout:
            _time.sleep(1)
        if not self.paths.result_pickle.exists():
            raise utils.UncompletedJobError(self._no_result_message())
        try:
            output: tuple[str, Any] = utils.pickle_load(self.paths.result_pickle)
        except EOFError:
            warnings.warn(f"{self.paths.result_pickle} read short; reading it again in 2 s", stacklevel=2)
            _time.sleep(2)
            output = utils.pickle_load(self.paths.result_pickle)
        return output

    def _no_result_message(self) -> str:
        lines = [f"job {self.job_id}, task {self.task_id}, ended without a result (state {self.state}; no "
                 f"{self.paths.result_pickle})"]
        log = self.stderr()
        if log:
            lines += ["its standard error:", log]
        else:
            out = self.stdout()
            if out:
                tail = "\n".join(out.splitlines()[-40:])
                lines += ["no standard error; the end of its standard output:", tail]
            else:
                lines.append("it wrote nothing to standard output or standard error")
        return "\n".join(lines)

    def wait(self) -> None:
        """Block until the job is done (see :meth:`done`)."""
        while not self.done():
            _time.sleep(1)

    def done(self, force_check: bool = False) -> bool:
        """Whether the job ended: its result file is there, or the watcher says it ended."""
        if self._sub_jobs:
            return all(sub.done() for sub in self._sub_jobs)
        with contextlib.suppress(OSError):  # touching the folder refreshes an NFS client's view of it
            self.paths.folder.chmod(self.paths.folder.stat().st_mode)
        if self.paths.result_pickle.exists():
            return True
        return self.watcher.is_done(self.job_id, mode="force" if force_check else "standard")

    @property
    def state(self) -> str:
        """The job's state (no forced update)."""
        return self.watcher.get_state(self.job_id, mode="standard")

    def get_info(self, mode: str = "force") -> dict[str, str]:
        return self.watcher.get_info(self.job_id, mode=mode)

    def _get_logs_string(self, name: str) -> str | None:
        paths = {"stdout": self.paths.stdout, "stderr": self.paths.stderr}
        if name not in paths:
            raise ValueError(f"no log named {name!r}: stdout or stderr")
        return paths[name].read_text() if paths[name].exists() else None

    def _joined(self, parts: Iterable[str | None]) -> str | None:
        present = [p for p in parts if p is not None]
        return "\n".join(present) if present else None

    def stdout(self) -> str | None:
        """The task's standard output so far (every task's, joined, for a job of several); None if none yet."""
        if self._sub_jobs:
            return self._joined(sub.stdout() for sub in self._sub_jobs)
        return self._get_logs_string("stdout")

    def stderr(self) -> str | None:
        """As :meth:`stdout`, for standard error."""
        if self._sub_jobs:
            return self._joined(sub.stderr() for sub in self._sub_jobs)
        return self._get_logs_string("stderr")

    def awaitable(self) -> AsyncJobProxy[R]:
        """asyncio's face of this job."""
        return AsyncJobProxy(self)

    def __repr__(self) -> str:
        try:
            state = self.state
        except Exception as e:  # noqa: BLE001 - a repr must not raise
            logger.get_logger().warning(f"the job's state could not be read: {e}")
            state = "UNKNOWN"
        return f'{type(self).__name__}<job_id={self.job_id}, task_id={self.task_id}, state="{state}">'

    def __del__(self) -> None:
        if self.__dict__.get("_cancel_at_deletion") and not self.watcher.is_done(self.job_id, mode="cache"):
            self.cancel(check=False)

    def __getstate__(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._register_in_watcher()


class DelayedJob(Job[R]):
    """A job submitted inside ``with executor.batch():``, not sent yet: reading it is refused (or, with
    ``batch(allow_implicit_submissions=True)``, sends the batch and becomes the real job)."""

    def __init__(self, ex: Executor) -> None:  # noqa: D107 - no Job.__init__: there is nothing yet
        self._submitit_executor = ex

    def __getattr__(self, name: str) -> Any:
        if name == "_cancel_at_deletion":
            return False
        ex: Executor = self.__dict__["_submitit_executor"]
        if not ex._allow_implicit_submissions:
            raise AttributeError("a job submitted inside `with executor.batch()` is sent when the block ends: read it after "
                                 "(or use batch(allow_implicit_submissions=True))")
        ex._submit_delayed_batch()
        if type(self) is DelayedJob:
            raise RuntimeError(f"{ex} sent the batch but did not give {object.__repr__(self)} its job")
        return getattr(self, name)

    def _promote(self, new_job: Job[Any]) -> None:
        self.__dict__.pop("_submitit_executor", None)
        self.__dict__.update(new_job.__dict__)
        self.__class__ = type(new_job)  # type: ignore[assignment]

    def __repr__(self) -> str:
        return object.__repr__(self)


class AsyncJobProxy(Generic[R]):
    """``await job.awaitable().result()``: the job's waits as coroutines (they poll ``done()``)."""

    def __init__(self, job: Job[R]) -> None:
        self.job = job

    async def wait(self, poll_interval: float = 1) -> None:
        while not self.job.done():
            await asyncio.sleep(poll_interval)

    async def result(self, poll_interval: float = 1) -> R:
        await self.wait(poll_interval)
        return self.job.result()

    async def results(self, poll_interval: float = 1) -> list[R]:
        await self.wait(poll_interval)
        return self.job.results()

    def results_as_completed(self, poll_interval: float = 1) -> Iterator[asyncio.Future[Any]]:
        """Every task's result as it comes (:func:`asyncio.as_completed`)."""
        if self.job.num_tasks > 1:
            yield from asyncio.as_completed(
                [self.job.task(i).awaitable().result(poll_interval) for i in range(self.job.num_tasks)])
        yield asyncio.ensure_future(self.result())


class EquivalenceDict(TypedDict):
    """An executor's names for the parameters every executor shares."""

    name: str
    timeout_min: str
    mem_gb: str
    nodes: str
    cpus_per_task: str
    gpus_per_node: str
    tasks_per_node: str


class Executor(abc.ABC):
    """The base executor: ``submit``, ``map_array``, ``submit_array``, ``batch()``, ``update_parameters``."""

    job_class: type[Job[Any]] = Job

    def __init__(self, folder: str | Path, parameters: dict[str, Any] | None = None) -> None:
        self.folder = Path(folder).expanduser().absolute()
        self.parameters = {} if parameters is None else parameters
        self._delayed_batch: list[tuple[Job[Any], utils.DelayedSubmission]] | None = None
        self._allow_implicit_submissions = False

    @classmethod
    def name(cls) -> str:
        """``slurm`` for SlurmExecutor: the class name without ``Executor``, lower case."""
        return cls.__name__.removesuffix("Executor").lower()

    @contextlib.contextmanager
    def batch(self, allow_implicit_submissions: bool = False) -> Iterator[None]:
        """Collect the block's submissions and send them as one array when it ends (dropped if it raises)."""
        self._allow_implicit_submissions = allow_implicit_submissions
        if self._delayed_batch is not None:
            raise RuntimeError("an executor's batch() blocks do not nest")
        self._delayed_batch = []
        try:
            yield None
        except Exception:
            logger.get_logger().error("the batch() block raised: none of its submissions is sent")
            raise
        else:
            self._submit_delayed_batch()
        finally:
            self._delayed_batch = None

    def _submit_delayed_batch(self) -> None:
        assert self._delayed_batch is not None
        if not self._delayed_batch:
            if not self._allow_implicit_submissions:
                warnings.warn("the batch() block submitted nothing", category=RuntimeWarning, stacklevel=3)
            return
        jobs, submissions = zip(*self._delayed_batch, strict=True)
        for job, new in zip(jobs, self._internal_process_submissions(list(submissions)), strict=True):
            job._promote(new)  # type: ignore[attr-defined]
        self._delayed_batch = []

    def submit(self, fn: Callable[..., R], *args: Any, **kwargs: Any) -> Job[R]:
        """Run ``fn(*args, **kwargs)`` as a job."""
        ds = utils.DelayedSubmission(fn, *args, **kwargs)
        if self._delayed_batch is not None:
            job: Job[R] = DelayedJob(self)
            self._delayed_batch.append((job, ds))
        else:
            job = self._internal_process_submissions([ds])[0]
        if type(job) is Job:
            raise RuntimeError(f"{type(self).__name__} made a plain Job: an executor makes its own job class")
        return job

    @abc.abstractmethod
    def _internal_process_submissions(self, delayed_submissions: list[utils.DelayedSubmission]) -> list[Job[Any]]:
        ...

    def map_array(self, fn: Callable[..., R], *iterable: Iterable[Any]) -> list[Job[R]]:
        """``fn`` over ``zip(*iterable)``, one job per item, as one array."""
        submissions = [utils.DelayedSubmission(fn, *args) for args in zip(*iterable, strict=False)]
        if not submissions:
            warnings.warn("map_array() of no items: nothing was submitted", stacklevel=2)
            return []
        return self._internal_process_submissions(submissions)

    def submit_array(self, fns: Sequence[Callable[[], R]]) -> list[Job[R]]:
        """Each of ``fns`` (callables taking no argument) as a job of one array."""
        submissions = [utils.DelayedSubmission(fn) for fn in fns]
        if not submissions:
            warnings.warn("submit_array() of no callables: nothing was submitted", stacklevel=2)
            return []
        return self._internal_process_submissions(submissions)

    def update_parameters(self, **kwargs: Any) -> None:
        """Change the submission parameters (not inside ``batch()``)."""
        if self._delayed_batch is not None:
            raise RuntimeError("parameters cannot change inside `with executor.batch()`: every job of a batch has the same")
        self._internal_update_parameters(**kwargs)

    @classmethod
    def _equivalence_dict(cls) -> EquivalenceDict | None:
        return None

    @classmethod
    def _valid_parameters(cls) -> set[str]:
        return set()

    def _convert_parameters(self, params: dict[str, Any]) -> dict[str, Any]:
        eq: dict[str, str] | None = self._equivalence_dict()  # type: ignore[assignment]
        return params if eq is None else {eq.get(k, k): v for k, v in params.items()}

    def _internal_update_parameters(self, **kwargs: Any) -> None:
        self.parameters.update(kwargs)

    @classmethod
    def affinity(cls) -> int:
        """-1: not available here; 0: only when asked for (debug); 1: available; 2: a cluster."""
        return 1


class PicklingExecutor(Executor):
    """submitit's plugin contract: the call is pickled into the folder, a submission file is written and
    submitted by a command (``_make_submission_file_text``, ``_make_submission_command``,
    ``_get_job_id_from_submission_command``, ``_num_tasks``), and the job runs
    :func:`tsm.submitit.core.submission.process_job` on the folder."""

    def __init__(self, folder: Path | str, max_num_timeout: int = 3, max_pickle_size_gb: float = 1.0) -> None:
        super().__init__(folder)
        self.max_num_timeout = max_num_timeout
        self.max_pickle_size_gb = max_pickle_size_gb
        self._throttling = 0.2
        self._last_job_submitted = 0.0

    def _timeout_min(self) -> float:
        eq = self._equivalence_dict()
        return float(self.parameters.get(eq["timeout_min"] if eq else "timeout_min", 5))

    def _dump_checked(self, delayed: utils.DelayedSubmission, count: int, check: bool) -> Path:
        folder = utils.JobPaths.get_first_id_independent_folder(self.folder)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{uuid.uuid4().hex}.pkl"
        delayed.set_timeout(self._timeout_min(), self.max_num_timeout)
        delayed.dump(path)
        size = path.stat().st_size / 1024**3
        if check and count * size > self.max_pickle_size_gb:
            path.unlink()
            raise RuntimeError(
                f"{count} submission(s) of about {size:.2f} GB each pickled would exceed max_pickle_size_gb="
                f"{self.max_pickle_size_gb}: pass paths to large data instead, or raise executor.max_pickle_size_gb"
            )
        return path

    def _internal_process_submissions(self, delayed_submissions: list[utils.DelayedSubmission]) -> list[Job[Any]]:
        jobs = []
        for i, delayed in enumerate(delayed_submissions):
            path = self._dump_checked(delayed, len(delayed_submissions), check=i == 0)
            while _time.time() - self._last_job_submitted < self._throttling:
                _time.sleep(self._throttling)
            self._last_job_submitted = _time.time()
            job = self._submit_command(self._submitit_command_str)
            job.paths.move_temporary_file(path, "submitted_pickle")
            jobs.append(job)
        return jobs

    @property
    def _submitit_command_str(self) -> str:
        return "dummy"

    def _submit_command(self, command: str) -> Job[Any]:
        """Write the submission file, run the submission command, and make the job from its answer."""
        uid = uuid.uuid4().hex
        folder = utils.JobPaths.get_first_id_independent_folder(self.folder)
        sub_file = folder / f".submission_file_{uid}.sh"
        sub_file.write_text(self._make_submission_file_text(command, uid))
        output = utils.CommandFunction(self._make_submission_command(sub_file), verbose=False)()
        job_id = self._get_job_id_from_submission_command(output)
        job: Job[Any] = self.job_class(folder=self.folder, job_id=job_id, tasks=list(range(self._num_tasks())))
        job.paths.move_temporary_file(sub_file, "submission_file", keep_as_symlink=True)
        self._write_job_id(job.job_id, uid)
        self._set_job_permissions(job.paths.folder)
        return job

    def _write_job_id(self, job_id: str, uid: str) -> None:
        """Where a plugin records the job id of a submission (nothing by default)."""

    @abc.abstractmethod
    def _num_tasks(self) -> int: ...

    @abc.abstractmethod
    def _make_submission_file_text(self, command: str, uid: str) -> str: ...

    @abc.abstractmethod
    def _make_submission_command(self, submission_file_path: Path) -> list[str]: ...

    @staticmethod
    @abc.abstractmethod
    def _get_job_id_from_submission_command(string: bytes | str) -> str: ...

    @staticmethod
    def _set_job_permissions(folder: Path) -> None:
        """Where a plugin opens the job's folder to others (nothing by default)."""
