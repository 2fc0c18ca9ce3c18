"""submitit's ``local.local``: jobs on this machine, on tsm's local scheduler.

``LocalExecutor(folder)`` runs each job as a tsm local app (detached: it outlives the submitting process),
with submitit's local parameters: ``timeout_min`` (default 2), ``signal_delay_s`` (default 30: USR2 that long
before the limit), ``tasks_per_node``, ``nodes`` (1 only), ``gpus_per_node``, ``visible_gpus``, ``setup``
(shell commands run before the job), ``stderr_to_stdout``. As in submitit, an array's jobs all start at once.
Each task sees submitit's local variables (``SUBMITIT_LOCAL_JOB_ID``, ``..._GLOBALID``, ...), so
``JobEnvironment()`` is the local one.

``LocalJob.state``: ``RUNNING`` until the job ended, then ``FINISHED`` (it returned or raised) or
``INTERRUPTED`` (cancelled, killed by a signal). ``job._process`` stands for the job's processes
(``poll()``, ``send_signal()``, as submitit's local job gives its controller process).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

from tsm.submitit.core import job_environment, logger, utils
from tsm.submitit.core.core import Job, R
from tsm.submitit.executor import TsmExecutor
from tsm.submitit.tsmjob import TsmJob

#: the exit status with which submitit's local environment asks for a requeue
LOCAL_REQUEUE_RETURN_CODE = 144

#: jobs whose pickled copies may find their processes again (submitit keeps the same registry)
_PROCESSES: dict[str, Any] = {}


class _Processes:
    """The job's replicas as one process: ``poll()`` (None while running, else an exit status, negative for a
    signal or a cancel) and ``send_signal(sig)`` to each replica that runs."""

    def __init__(self, tsm_job: Any) -> None:
        self._job = tsm_job

    def poll(self) -> int | None:
        status = self._job.final_status() if self._job.done() else self._job.status()
        if status is None or not status.state.is_terminal:
            return None
        if status.state.name == "SUCCEEDED":
            return 0
        if status.state.name == "CANCELLED":
            return -15
        reps = [r for role in status.roles for r in role.replicas]
        for rep in reps:
            if rep.error_msg.startswith("killed by "):
                import signal

                return -int(signal.Signals[rep.error_msg.split()[-1]])
        return next((r.exit_code for r in reps if r.exit_code), 1)

    def send_signal(self, sig: int) -> None:
        """Signal each replica once it has started (a job just submitted may not have one yet)."""
        status = self._job.status()
        pause = 0.01
        while status is not None and not status.state.is_terminal and not self._pids(status):
            time.sleep(pause)  # the supervisor records the replica's pid as it starts it: a moment away
            pause = min(pause * 2, 0.2)
            status = self._job.status()
        for role in status.roles if status is not None else ():
            for rep in role.replicas:
                if rep.pid:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(rep.pid, sig)

    @staticmethod
    def _pids(status: Any) -> list[int]:
        return [r.pid for role in status.roles for r in role.replicas if r.pid]

    @property
    def pid(self) -> int | None:
        status = self._job.status()
        pids = self._pids(status) if status is not None else []
        return pids[0] if pids else None


class LocalJob(TsmJob[R]):
    """A job of :class:`LocalExecutor` (see the module doc)."""

    scheduler = "local"

    @property
    def _process(self) -> _Processes | None:
        tsm_job = self._owner._tsm if self._owner is not None else self._tsm
        return None if tsm_job is None else _Processes(tsm_job)

    @property
    def state(self) -> str:
        process = self._process
        if process is None:
            return "FINISHED" if self.paths.result_pickle.exists() else "NO PROCESS AND NO RESULT"
        code = process.poll()
        return "RUNNING" if code is None else "INTERRUPTED" if code < 0 else "FINISHED"

    def get_info(self, mode: str = "force") -> dict[str, str]:
        return {"jobState": self.state}

    def _interrupt(self) -> None:
        """Send this job the preemption/timeout signal (for testing a checkpoint)."""
        if self._process is not None:
            self._process.send_signal(LocalJobEnvironment._usr_sig())

    def __getstate__(self) -> dict[str, Any]:
        if self._tsm is not None:
            _PROCESSES[self.job_id] = self._tsm
        return super().__getstate__()

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        if self._owner is None:
            self._tsm = _PROCESSES.get(self.job_id)

    def __del__(self) -> None:
        super().__del__()
        if self.paths.result_pickle.exists():
            _PROCESSES.pop(self.job_id, None)


class LocalJobEnvironment(job_environment.JobEnvironment):
    _env = {
        "job_id": "SUBMITIT_LOCAL_JOB_ID", "num_tasks": "SUBMITIT_LOCAL_NTASKS",
        "num_nodes": "SUBMITIT_LOCAL_JOB_NUM_NODES", "node": "SUBMITIT_LOCAL_NODEID",
        "global_rank": "SUBMITIT_LOCAL_GLOBALID", "local_rank": "SUBMITIT_LOCAL_LOCALID",
    }

    def _requeue(self, countdown: int) -> None:
        logger.get_logger().info(f"job {self.job_id} requeued ({countdown} remaining timeouts)")
        sys.exit(LOCAL_REQUEUE_RETURN_CODE)


class LocalExecutor(TsmExecutor):
    """Runs jobs on this machine through tsm's local scheduler (see the module doc)."""

    job_class = LocalJob
    scheduler = "local"
    env_name = "local"
    default_timeout_min = 2.0
    default_signal_delay_s = 30.0
    own = frozenset({"visible_gpus"})

    @classmethod
    def name(cls) -> str:
        return "local"

    @classmethod
    def _valid_parameters(cls) -> set[str]:
        return {"setup"}

    def _internal_update_parameters(self, **kwargs: Any) -> None:
        if kwargs.get("nodes", 0) > 1:
            raise ValueError("the local executor has one node: nodes must be 1")
        visible = kwargs.get("visible_gpus", ())
        if not isinstance(visible, Sequence) or not all(isinstance(x, int) for x in visible):
            raise ValueError(f"visible_gpus={visible!r}: give a sequence of GPU indices (ints)")
        wanted = kwargs.get("gpus_per_node", 0)
        if visible and wanted > len(visible):
            raise ValueError(f"gpus_per_node={wanted} is more than the visible_gpus {list(visible)}")
        self.parameters.update(kwargs)

    def _plan(self, checkpointable: bool) -> Any:
        plan = super()._plan(checkpointable)
        if plan.options["replicas"] > 1:  # as submitit's local tasks: a failed one does not stop the others
            plan.cfg.setdefault("on_failure", "wait")
        visible = self.parameters.get("visible_gpus")
        if visible:
            plan.options["env"]["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in visible)
        return plan

    def _task_env(self, replicas: int) -> dict[str, str]:
        return {"SUBMITIT_LOCAL_JOB_ID": "${app_id}", "SUBMITIT_LOCAL_NTASKS": str(replicas),
                "SUBMITIT_LOCAL_GLOBALID": "${replica_id}", "SUBMITIT_LOCAL_LOCALID": "${replica_id}",
                "SUBMITIT_LOCAL_NODEID": "0", "SUBMITIT_LOCAL_JOB_NUM_NODES": "1"}

    def _internal_process_submissions(self, delayed_submissions: list[utils.DelayedSubmission]) -> list[Job[Any]]:
        self._check_size(delayed_submissions)
        return [self._submit_one(ds) for ds in delayed_submissions]  # submitit's local arrays start at once

    @classmethod
    def affinity(cls) -> int:
        return 1

