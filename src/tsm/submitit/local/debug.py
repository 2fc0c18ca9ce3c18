"""submitit's ``local.debug``: jobs run in this process when their result is asked for, for debugging.

``DebugExecutor(folder)``: ``submit`` only records the call; ``result()``, ``results()``, ``done()``,
``wait()`` and ``exception()`` run it then, here, with the environment the process had at submission and
``SUBMITIT_DEBUG_JOB_ID`` set (so ``JobEnvironment()`` is the debug one), and log to the job's files in the
folder. A call that raises drops into ``pdb.post_mortem`` (``ipdb`` when ``PYTHONBREAKPOINT`` names it) when
standard input is a terminal, as submitit does; without one it raises at once.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any

from tsm.submitit.core.core import Executor, InfoWatcher, Job, R
from tsm.submitit.core.job_environment import JobEnvironment
from tsm.submitit.core.utils import DelayedSubmission, UncompletedJobError


class DebugInfoWatcher(InfoWatcher):
    def register_job(self, job_id: str) -> None:
        """Nothing to watch: debug jobs run in this process."""


class DebugJobEnvironment(JobEnvironment):
    _env = {
        "job_id": "SUBMITIT_DEBUG_JOB_ID", "num_nodes": "SUBMITIT_DEBUG_NOT_SET", "num_tasks": "SUBMITIT_DEBUG_NOT_SET",
        "node": "SUBMITIT_DEBUG_NOT_SET", "global_rank": "SUBMITIT_DEBUG_NOT_SET", "local_rank": "SUBMITIT_DEBUG_NOT_SET",
    }

    def activated(self) -> bool:
        return "SUBMITIT_DEBUG_JOB_ID" in os.environ

    def _requeue(self, countdown: int) -> None:
        """Nothing to requeue: the job runs in this process."""


def _post_mortem() -> None:
    if not sys.stdin.isatty():
        return
    if os.environ.get("PYTHONBREAKPOINT", "").startswith("ipdb"):
        import ipdb  # type: ignore[import-not-found]

        ipdb.post_mortem()
    else:
        import pdb

        pdb.post_mortem()


class DebugJob(Job[R]):
    watcher = DebugInfoWatcher()

    def __init__(self, folder: Path, submission: DelayedSubmission) -> None:
        super().__init__(folder=folder, job_id=f"DEBUG_{id(submission)}")
        self._submission = submission
        self.cancelled = False
        self.environ = {**os.environ, "SUBMITIT_DEBUG_JOB_ID": self.job_id}

    def submission(self) -> DelayedSubmission:
        return self._submission

    @property
    def num_tasks(self) -> int:
        return 1

    def cancel(self, check: bool = True) -> None:
        self.cancelled = True

    def _check_not_cancelled(self) -> None:
        if self.cancelled:
            raise UncompletedJobError(f"{self} was cancelled: it will not run")

    def results(self) -> list[R]:
        self._check_not_cancelled()
        if self._submission.done():
            return [self._submission._result]
        saved = dict(os.environ)
        os.environ.clear()
        os.environ.update(self.environ)
        root = logging.getLogger("")
        self.paths.stdout.parent.mkdir(parents=True, exist_ok=True)
        out, err = logging.FileHandler(self.paths.stdout), logging.FileHandler(self.paths.stderr)
        out.setLevel(logging.DEBUG)
        err.setLevel(logging.WARNING)
        root.addHandler(out)
        root.addHandler(err)
        try:
            return [self._submission.result()]
        except Exception as e:
            print(e)
            _post_mortem()
            raise
        finally:
            os.environ.clear()
            os.environ.update(saved)
            root.removeHandler(out)
            root.removeHandler(err)
            out.close()
            err.close()

    def exception(self) -> BaseException | None:  # type: ignore[override]
        self._check_not_cancelled()
        try:
            self._submission.result()
        except Exception as e:  # noqa: BLE001 - the debug job's error is returned as it is
            return e
        return None

    def wait(self) -> None:
        self.results()

    def done(self, force_check: bool = False) -> bool:
        self.results()
        return self._submission.done()

    @property
    def state(self) -> str:
        if self._submission.done():
            return "DONE"
        return "CANCELLED" if self.cancelled else "QUEUED"

    def get_info(self, mode: str = "force") -> dict[str, str]:
        return {"STATE": self.state}

    def __del__(self) -> None:
        """Nothing to cancel."""


class DebugExecutor(Executor):
    job_class = DebugJob

    def __init__(self, folder: str | Path) -> None:
        super().__init__(folder)

    def _internal_process_submissions(self, delayed_submissions: list[DelayedSubmission]) -> list[Job[Any]]:
        return [DebugJob(self.folder, ds) for ds in delayed_submissions]
