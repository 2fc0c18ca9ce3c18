"""submitit's ``helpers``: checkpointable callables, waiting on many jobs, snapshots, the command wrapper.

``Checkpointable`` is :class:`tsm.functions.Checkpointable` with submitit's hook: when the job is warned
(a time limit near, a preemption) ``__submitit_checkpoint__`` (else ``checkpoint``) returns the
:class:`DelayedSubmission` the next attempt runs, by default this callable in its current state with the
same arguments. ``TorchDistributedEnvironment().export()`` sets torch.distributed's ``env://`` variables
from :class:`~tsm.submitit.core.job_environment.JobEnvironment`.
"""

from __future__ import annotations

import collections
import contextlib
import datetime
import os
import random
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import tsm.functions.checkpoint as _tsm_checkpoint
from tsm.submitit.core import core
from tsm.submitit.core.job_environment import JobEnvironment
from tsm.submitit.core.utils import (  # noqa: F401 - helpers' namespace, as submitit's
    CommandFunction as CommandFunction,
    DelayedSubmission as DelayedSubmission,
    environment_variables as environment_variables,
)


class Checkpointable(_tsm_checkpoint.Checkpointable):
    """A callable requeued after a timeout or a preemption with the state it had (see the module doc)."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Checkpointable:
        instance = super().__new__(cls)
        if type(instance).__call__ is _tsm_checkpoint.Checkpointable.__call__:
            raise TypeError(f"{cls.__name__} derives from Checkpointable but defines no __call__: give it one (what the job "
                            "runs)")
        return instance

    def checkpoint(self, *args: Any, **kwargs: Any) -> DelayedSubmission:  # type: ignore[override]
        """The same callable, as it is now, with the same arguments."""
        return DelayedSubmission(self, *args, **kwargs)

    def _resume_call(self, call: _tsm_checkpoint.Call) -> _tsm_checkpoint.Call | None:
        from tsm.submitit.tsmjob import requeue_call

        return requeue_call(self, call)


class FunctionSequence(Checkpointable):
    """Several calls run one after the other as one job; its result is their list. Checkpointable: the
    results already computed are kept, so a requeued job runs only the rest."""

    def __init__(self, verbose: bool = False) -> None:
        self.verbose = verbose
        self.delayed_functions: list[DelayedSubmission] = []

    def add(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        self.delayed_functions.append(DelayedSubmission(func, *args, **kwargs))

    def __len__(self) -> int:
        return len(self.delayed_functions)

    def __iter__(self) -> Iterator[DelayedSubmission]:
        return iter(self.delayed_functions)

    def __call__(self) -> list[Any]:  # type: ignore[override]
        if self.verbose:
            print(f"Starting from {sum(f.done() for f in self)}/{len(self.delayed_functions)}", flush=True)
        return [f.result() for f in self.delayed_functions]


def as_completed(jobs: Sequence[core.Job[core.R]], timeout: float | None = None,
                 poll_frequency: float = 10) -> Iterator[core.Job[core.R]]:
    """Each job as it completes (finished, failed or cancelled), looking every ``poll_frequency`` seconds;
    TimeoutError after ``timeout`` seconds."""
    start, seen = time.time(), set()
    while True:
        if timeout is not None and time.time() - start > timeout:
            raise TimeoutError
        for i, job in enumerate(jobs):
            if i not in seen and job.done():
                seen.add(i)
                yield job
        if len(seen) == len(jobs):
            return
        time.sleep(poll_frequency)


def run_cmd(str_args: Any, **kwargs: Any) -> str:
    out: bytes = subprocess.check_output(str_args, **kwargs)
    return out.decode("utf-8").strip()


class RsyncSnapshot:
    """Inside the block, run from a snapshot of the git repository's checked-in files (taken with git and
    rsync into ``snapshot_dir``), so jobs run the code as it was when they were submitted."""

    def __init__(self, snapshot_dir: Path, root_dir: Path | None = None, with_submodules: bool = False,
                 exclude: Sequence[str] = (), include: Sequence[str] = ()) -> None:
        self.available(throw=True)
        self.snapshot_dir = Path(snapshot_dir)
        self.root_dir = root_dir or run_cmd(["git", "rev-parse", "--show-toplevel"])
        self.original_dir = Path.cwd()
        self.with_submodules = with_submodules
        self.exclude = exclude
        self.include = include

    @staticmethod
    def available(throw: bool = False) -> bool:
        if shutil.which("rsync"):
            return True
        if throw:
            raise RuntimeError("RsyncSnapshot needs rsync on this machine's PATH")
        return False

    def __enter__(self) -> None:
        self.original_dir = Path.cwd()
        root = str(self.root_dir)
        if not self.snapshot_dir.exists():
            self.snapshot_dir.parent.mkdir(parents=True, exist_ok=True)
            subprocess.check_call(["git", "clone", "--depth=2", f"file://{root}", str(self.snapshot_dir)])
        listing = ["git", "ls-files", "-z", "--recurse-submodules" if self.with_submodules else "-s"]
        out = subprocess.check_output(listing, cwd=root).decode()
        names = [entry.split("\t", 1)[-1] for entry in out.split("\0") if entry and not entry.startswith("16")]
        with tempfile.NamedTemporaryFile("w", encoding="utf-8", suffix=".files") as listed:
            listed.write("\n".join([*names, *self.include]) + "\n")
            listed.flush()
            excludes = [w for pattern in self.exclude for w in ("--exclude", pattern)]
            run_cmd(["rsync", "-a", "--files-from", listed.name, root, str(self.snapshot_dir), *excludes])
        os.chdir(self.snapshot_dir)

    def __exit__(self, *args: Any) -> None:
        os.chdir(self.original_dir)


def _default_custom_logging(started: float, n_jobs: int, state_jobs: dict[str, set[int]]) -> None:
    now = datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S")
    failed = sorted(state_jobs["FAILED"])
    width = len(str(n_jobs))
    print(f"[{now}] {int((time.time() - started) / 60)} min:",
          f"running {len(state_jobs['RUNNING']):{width}}/{n_jobs},", f"failed {len(failed):{width}}/{n_jobs},",
          f"done {len(state_jobs['DONE']) - len(failed):{width}}/{n_jobs}", flush=True)
    if failed:
        print(f"[{now}] failed: indices {failed}", flush=True)


def monitor_jobs(jobs: Sequence[core.Job[core.R]], poll_frequency: float = 30, test_mode: bool = False,
                 custom_logging: Callable[..., Any] = _default_custom_logging) -> None:
    """Print how many jobs run, failed and ended until they all ended (every ``poll_frequency`` >= 30 s,
    unless ``test_mode``)."""
    if not test_mode and poll_frequency < 30:
        raise ValueError(f"poll_frequency={poll_frequency} is under 30 s: that would flood the scheduler (test_mode=True lifts it)")
    if not jobs:
        print("no jobs to monitor")
        return
    arrays = ", ".join(sorted({str(job.job_id).split("_", 1)[0] for job in jobs}))
    print(f"watching {len(jobs)} job(s) of {arrays}\n")
    started = time.time()
    while True:
        if not test_mode:
            jobs[0].get_info(mode="force")
        state_jobs: dict[str, set[int]] = collections.defaultdict(set)
        for i, job in enumerate(jobs):
            state_jobs[job.state.upper()].add(i)
            if job.done():
                state_jobs["DONE"].add(i)
        if len(state_jobs["DONE"]) == len(jobs):
            print(f"every job ended; failed: indices {sorted(state_jobs['FAILED'])}", flush=True)
            break
        custom_logging(started, len(jobs), state_jobs)
        time.sleep(poll_frequency)
    print(f"done after {int((time.time() - started) / 60)} min")


@contextlib.contextmanager
def clean_env(extra_names: Sequence[str] = ()) -> Iterator[None]:
    """Hide Slurm's, submitit's and torch.distributed's variables (and ``extra_names``) inside the block, so
    a job submitted from a job does not inherit them."""
    distributed = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
    hidden = {k: os.environ.pop(k) for k in list(os.environ)
              if k.startswith(("SLURM_", "SLURMD_", "SRUN_", "SBATCH_", "SUBMITIT_")) or k in distributed
              or k in extra_names}
    try:
        yield
    finally:
        os.environ.update(hidden)


class TorchDistributedEnvironment:
    """torch.distributed's ``env://`` parameters of this task, from :class:`JobEnvironment`."""

    def __init__(self) -> None:
        self._job_env = JobEnvironment()
        self.master_addr = self._job_env.hostnames[0]
        self.master_port = self._get_master_port()
        self.rank = self._job_env.global_rank
        self.world_size = self._job_env.num_tasks
        self.local_rank = self._job_env.local_rank
        self.local_world_size = self._job_env.num_tasks // max(1, self._job_env.num_nodes)

    def _get_master_port(self) -> int:
        given = os.environ.get("MASTER_PORT")
        if given is not None:
            return int(given)
        return random.Random(self._job_env.job_id).randint(20000, 60000)  # noqa: S311 - a port, agreed by seed

    def export(self, set_cuda_visible_devices: bool = True, overwrite: bool = False) -> TorchDistributedEnvironment:
        """Set ``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``
        (and ``CUDA_VISIBLE_DEVICES`` to this task's GPU); one that is set already is an error unless
        ``overwrite``. Returns self."""
        values = {"MASTER_ADDR": self.master_addr, "MASTER_PORT": str(self.master_port), "RANK": str(self.rank),
                  "WORLD_SIZE": str(self.world_size), "LOCAL_RANK": str(self.local_rank),
                  "LOCAL_WORLD_SIZE": str(self.local_world_size)}
        if not overwrite:
            for key in values:
                if key in os.environ:
                    raise RuntimeError(f"{key} is set already: pass overwrite=True to replace it")
        if set_cuda_visible_devices:
            values["CUDA_VISIBLE_DEVICES"] = str(self.local_rank)
        os.environ.update(values)
        return self
