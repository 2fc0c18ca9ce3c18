"""The executors of the submitit face that run on tsm: one job is ``runner.submit``, an array ``runner.map``.

:class:`TsmExecutor` holds submitit's submission flow on tsm; each executor says what its parameters mean
(:meth:`TsmExecutor._plan`): tsm's own (any scheduler: the generic parameters, ``image``, ``setup``, ``env``,
``workspace``, ``array_parallelism``, ``signal_delay_s`` and the scheduler's run options), Slurm's (sbatch's
names, :mod:`tsm.submitit.slurm.slurm`) and the local one's (:mod:`tsm.submitit.local.local`).

A single submission is one job of ``nodes * tasks_per_node`` replicas. An array (``map_array``,
``submit_array``, ``batch()``) is one :func:`tsm.functions.map` at most ``array_parallelism`` at a time: a
Slurm job array on Slurm, a capped sweep elsewhere. The submitted call is also written to the folder
(``<job id>_submitted.pkl``), as submitit writes it, so ``job.submission()`` reads it back.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, ClassVar

from tsm.specs.api import Resource
from tsm.submitit.core import core, utils
from tsm.submitit.tsmjob import (
    Plan,
    TsmJob,
    _Item,
    default_image,
    is_checkpointable,
    lifecycle,
    resumable,
    submitit_env,
)

#: the parameters every executor shares (submitit's generic names) and their types
GENERIC: dict[str, type | tuple[type, ...]] = {
    "name": str, "timeout_min": (int, float), "mem_gb": (int, float), "nodes": int, "cpus_per_task": int,
    "gpus_per_node": int, "tasks_per_node": int, "stderr_to_stdout": bool,
}
#: what a tsm executor takes besides the generic parameters and its scheduler's run options
EXTRA = {"image", "setup", "env", "workspace", "array_parallelism", "signal_delay_s", "max_retries"}


def resource_of(params: dict[str, Any], tasks_per_node: int) -> Resource | None:
    """A replica's resource from per-node figures (None when nothing was asked: the scheduler's default)."""
    cpus, gpus, mem_gb = params.get("cpus_per_task"), params.get("gpus_per_node"), params.get("mem_gb")
    if cpus is None and gpus is None and mem_gb is None:
        return None
    per = max(1, tasks_per_node)
    return Resource(cpu=int(cpus or 1), gpu=int(gpus or 0) // per,
                    memMB=int(float(mem_gb) * 1024 / per) if mem_gb is not None else 1024)


class TsmExecutor(core.Executor):
    """The executor of tsm scheduler :attr:`scheduler` (see the module doc)."""

    job_class: type[core.Job[Any]] = TsmJob
    #: the tsm scheduler this executor submits to
    scheduler: ClassVar[str] = ""
    #: what ``SUBMITIT_EXECUTOR`` says inside the job (which JobEnvironment answers there)
    env_name: ClassVar[str] = "tsm"
    #: submitit's default time limit of this executor's jobs (minutes), and its warning
    default_timeout_min: ClassVar[float] = 5.0
    default_signal_delay_s: ClassVar[float] = 30.0
    #: parameters of this executor that are neither generic, tsm's extras nor the scheduler's run options
    own: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, folder: str | Path, max_num_timeout: int = 3, max_pickle_size_gb: float = 1.0,
                 python: str | None = None) -> None:
        super().__init__(folder)
        self.max_num_timeout = max_num_timeout
        self.max_pickle_size_gb = max_pickle_size_gb
        self.python = python
        utils.JobPaths.get_first_id_independent_folder(self.folder).mkdir(parents=True, exist_ok=True)
        self._runner: Any = None

    @classmethod
    def name(cls) -> str:
        return cls.scheduler or super().name()

    @property
    def runner(self) -> Any:
        if self._runner is None:
            from tsm.runner.api import get_runner

            self._runner = get_runner()
        return self._runner

    @classmethod
    def _run_option_names(cls) -> set[str]:
        from tsm.runner.api import get_runner

        return {name for name, _ in get_runner().scheduler_run_opts(cls.scheduler)} if cls.scheduler else set()

    @classmethod
    def _valid_parameters(cls) -> set[str]:
        return set(GENERIC) | EXTRA | cls._run_option_names()

    def _internal_update_parameters(self, **kwargs: Any) -> None:
        unknown = sorted(set(kwargs) - self._valid_parameters())
        if unknown:
            raise ValueError(f"unknown parameter(s) {unknown} for the {self.name()} executor; it takes:\n  - "
                             + "\n  - ".join(sorted(self._valid_parameters())))
        super()._internal_update_parameters(**kwargs)

    def _tasks(self) -> tuple[int, int]:
        """(replicas, tasks per node)."""
        per = int(self.parameters.get("tasks_per_node", 1))
        return int(self.parameters.get("nodes", 1)) * per, per

    def _plan(self, checkpointable: bool) -> Plan:
        """The generic parameters, tsm's extras and the run options (what each executor may translate)."""
        p = dict(self.parameters)
        replicas, per = self._tasks()
        timeout = float(p.get("timeout_min", self.default_timeout_min))
        opts: dict[str, Any] = {"replicas": replicas, "tasks_per_node": per if per > 1 else None,
                                "resource": resource_of(p, per), "name": p.get("name", "submitit"),
                                "image": p.get("image") or default_image() or None, "setup": list(p.get("setup", ())),
                                "env": dict(p.get("env", {})), "workspace": p.get("workspace"),
                                "max_retries": p.get("max_retries")}
        run = {k: v for k, v in p.items() if k not in GENERIC and k not in EXTRA and k not in self.own}
        cfg = {**lifecycle(timeout, float(p.get("signal_delay_s", self.default_signal_delay_s)), checkpointable,
                           self.max_num_timeout), **run}
        if self.python:
            cfg.setdefault("python", self.python)
        return Plan(opts, cfg, p.get("array_parallelism"), bool(p.get("stderr_to_stdout")), timeout)

    def _submit_options(self, plan: Plan) -> dict[str, Any]:
        o = dict(plan.options)
        o["env"] = {**submitit_env(self.env_name, self.folder), **self._task_env(o["replicas"]), **o["env"]}
        setup = o.pop("setup")
        return {k: v for k, v in o.items() if v is not None} | ({"setup": setup} if setup else {})

    def _task_env(self, replicas: int) -> dict[str, str]:
        """Variables each task's JobEnvironment reads (an executor's own; ``${replica_id}`` is the rank)."""
        return {}

    def _job(self, job_id: str, tsm_job: Any, plan: Plan) -> TsmJob[Any]:
        replicas, _ = self._tasks()
        job = self.job_class(folder=self.folder, job_id=job_id, tasks=list(range(replicas)))
        assert isinstance(job, TsmJob)
        job._tsm, job._scheduler, job._merge = tsm_job, self.scheduler, plan.merge_streams
        for sub in job._sub_jobs:
            assert isinstance(sub, TsmJob)
            sub._merge = plan.merge_streams
        return job

    def _record(self, job: core.Job[Any], ds: utils.DelayedSubmission, plan: Plan) -> None:
        ds.set_timeout(plan.timeout_min, self.max_num_timeout)
        job.paths.submitted_pickle.parent.mkdir(parents=True, exist_ok=True)
        ds.dump(job.paths.submitted_pickle)

    def _check_size(self, subs: list[utils.DelayedSubmission]) -> None:
        from tsm.functions.payload import cloudpickle

        size = len(cloudpickle().dumps(subs[0])) / 1024**3
        if len(subs) * size > self.max_pickle_size_gb:
            raise RuntimeError(
                f"{len(subs)} submission(s) of about {size:.2f} GB each pickled would exceed max_pickle_size_gb="
                f"{self.max_pickle_size_gb}: pass paths to large data instead, or raise executor.max_pickle_size_gb"
            )

    def _internal_process_submissions(self, delayed_submissions: list[utils.DelayedSubmission]) -> list[core.Job[Any]]:
        self._check_size(delayed_submissions)
        if len(delayed_submissions) == 1:
            return [self._submit_one(delayed_submissions[0])]
        return list(self._submit_array(delayed_submissions))

    def _submit_one(self, ds: utils.DelayedSubmission) -> TsmJob[Any]:
        from tsm.specs.handles import parse_app_handle

        plan = self._plan(is_checkpointable(ds.function))
        ds.set_timeout(plan.timeout_min, self.max_num_timeout)
        call = resumable(ds)
        assert call is not None
        options = self._submit_options(plan)
        tsm_job = self.runner.submit(call, scheduler=self.scheduler, cfg=plan.cfg, **options)
        job = self._job(parse_app_handle(tsm_job.handle).app_id, tsm_job, plan)
        self._record(job, ds, plan)
        return job

    def _submit_array(self, subs: list[utils.DelayedSubmission]) -> list[TsmJob[Any]]:
        """One map over the items: of their one function when they share it (``map_array``), else of each call."""
        from tsm.specs.handles import parse_app_handle
        from tsm.sweep.state import parse_sweep_handle

        same = all(s.function is subs[0].function and not s.kwargs for s in subs)
        plan = self._plan(any(is_checkpointable(s.function) for s in subs))
        for s in subs:
            s.set_timeout(plan.timeout_min, self.max_num_timeout)
        options = self._submit_options(plan)
        parallel = int(plan.parallel) if plan.parallel else None
        if same:
            shared = utils.DelayedSubmission(subs[0].function)
            shared.set_timeout(plan.timeout_min, self.max_num_timeout)
            first = resumable(shared)
            assert first is not None
            columns = list(zip(*(s.args for s in subs), strict=True)) if subs[0].args else []
            mapped = self.runner.map(first, *columns, parallel=parallel, scheduler=self.scheduler,
                                     cfg=plan.cfg, **options) if columns else None
        else:
            mapped = None
        if mapped is None:
            mapped = self.runner.map(_Item(), subs, parallel=parallel, scheduler=self.scheduler, cfg=plan.cfg, **options)
        handles = mapped.trial_handles()
        sweep_id = parse_sweep_handle(mapped.handle).sweep_id
        jobs = []
        for i, (ds, handle) in enumerate(zip(subs, handles, strict=True)):
            job_id = parse_app_handle(handle).app_id if handle and all(handles) else f"{sweep_id}_{i}"
            job = self._job(job_id, mapped[i], plan)
            self._record(job, ds, plan)
            jobs.append(job)
        return jobs

    @classmethod
    def affinity(cls) -> int:
        return 0  # available, but only when asked for by name


def tsm_executor(scheduler: str) -> type[TsmExecutor]:
    """The executor class of tsm scheduler ``scheduler`` (``kubernetes`` -> ``KubernetesExecutor``)."""
    if scheduler not in _CLASSES:
        title = "".join(part.capitalize() for part in scheduler.replace("-", "_").split("_"))
        _CLASSES[scheduler] = type(f"{title}Executor", (TsmExecutor,), {"scheduler": scheduler, "__module__": __name__})
    return _CLASSES[scheduler]


_CLASSES: dict[str, type[TsmExecutor]] = {}


def warn_ignored(name: str, value: Any, why: str) -> None:
    warnings.warn(f"parameter {name}={value!r} is ignored: {why}", stacklevel=3)
