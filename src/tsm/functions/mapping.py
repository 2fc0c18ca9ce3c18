"""A map: one trial of a sweep per item, at most ``parallel`` at a time, and a :class:`Job` per item.

``runner.map(fn, xs, ys, parallel=8)`` runs ``fn(x, y)`` for each pair as a trial of a sweep
(:mod:`tsm.sweep`): a detached controller holds the cap, or the scheduler itself where it takes a sweep whole
(Slurm: one job array, ``--array=0-(N-1)%P``). The :class:`MapJob` is a sequence of the items' jobs, each a
:class:`concurrent.futures.Future`; ``results()`` gives the values in order, ``as_completed()`` as they come.

One daemon thread per map watches it: it reads the sweep's trials (its state file; on Slurm one ``squeue``
for all of them) and settles each item's job as its trial ends, then reads that trial's outcome. It looks
every 0.05 s after a change, backing off to every 1 s while nothing changes.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any, overload

from tsm import sweep
from tsm.functions.app import Plan
from tsm.functions.errors import ReplicaLostError
from tsm.functions.job import Job, JobSpec, sibling
from tsm.functions.spec import WorkerArgs

#: the watcher's pauses between two looks at the trials: from the first, doubling to the last
PAUSES = (0.05, 1.0)


def item_spec(p: Plan, index: int) -> JobSpec:
    """What the reader of item ``index`` needs (the same as :func:`~tsm.functions.app.app_of` writes)."""
    o = p.options
    job_dir = f"{p.key_dir}/{index}" if p.key_dir else None
    worker = WorkerArgs(nonce=p.nonce, dir=job_dir, state_dir=None if job_dir else o.checkpoint_dir, index=index)
    return JobSpec(p.name, o.replicas, worker, o.results)


class MapJob(Sequence[Job]):
    """The jobs of a map, in item order; ``handle`` is the sweep's (``tsm sweep show`` lists its trials)."""

    def __init__(self, runner: Any, handle: str | None, p: Plan | None, n: int) -> None:
        self._runner = runner
        self.handle = handle
        self.jobs = [Job(runner, None, item_spec(p, i), watch=False) for i in range(n)] if p else []
        if handle is not None and self.jobs:
            threading.Thread(target=self._watch, name=f"tsm-map:{handle}", daemon=True).start()

    @classmethod
    def empty(cls, runner: Any) -> MapJob:
        return cls(runner, None, None, 0)

    @overload
    def __getitem__(self, i: int) -> Job: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[Job]: ...
    def __getitem__(self, i: int | slice) -> Job | Sequence[Job]:
        return self.jobs[i]

    def __len__(self) -> int:
        return len(self.jobs)

    def _watch(self) -> None:
        from tsm.sweep.state import SKIPPED, TRIAL_TERMINAL

        assert self.handle is not None
        twin = sibling(self._runner)
        pause, looks = PAUSES[0], 0
        try:
            while not all(j.done() for j in self.jobs):
                looks += 1
                if looks % 50 == 0:
                    sweep.sweep_status(self.handle)  # restarts a controller that was killed
                changed = False
                for t in sweep.sweep_trials(self.handle):
                    job = self.jobs[t.idx]
                    if job.handle is None and t.handle:
                        job.handle = t.handle
                    if t.state not in TRIAL_TERMINAL or job.done():
                        continue
                    changed = True
                    if t.state == SKIPPED or not t.handle:
                        job._set(False, ReplicaLostError(f"item {t.idx} of {self.handle} was not launched: "
                                                         f"{t.msg or 'the map stopped'}", handle=self.handle))
                    else:
                        job._settle(twin, twin.status(t.handle))
                if not changed:
                    time.sleep(pause)
                pause = PAUSES[0] if changed else min(pause * 2, PAUSES[1])
        except BaseException as e:  # noqa: BLE001 - the items still waiting learn why
            for job in self.jobs:
                job._set(False, e)
        finally:
            twin.close()

    def trial_handles(self) -> list[str | None]:
        """Each item's app handle as the sweep records it now (None: not launched yet). A scheduler that takes
        the sweep whole (a Slurm array) has them all from the start."""
        if self.handle is None:
            return []
        handles: list[str | None] = [None] * len(self.jobs)
        for t in sweep.sweep_trials(self.handle):
            handles[t.idx] = t.handle
            if t.handle and self.jobs[t.idx].handle is None:
                self.jobs[t.idx].handle = t.handle
        return handles

    def results(self, timeout: float | None = None) -> list[Any]:
        """Every item's result, in item order (the first item's exception, in order, is raised)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        return [j.result(None if deadline is None else max(0.0, deadline - time.monotonic())) for j in self.jobs]

    def as_completed(self, timeout: float | None = None) -> Iterator[Job]:
        """The items' jobs as they end (:func:`concurrent.futures.as_completed`)."""
        jobs: Iterator[Any] = concurrent.futures.as_completed(self.jobs, timeout)
        return jobs

    def done(self) -> bool:
        return all(j.done() for j in self.jobs)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until every item ended (or ``timeout``); whether they all did."""
        done, _ = concurrent.futures.wait(self.jobs, timeout)
        return len(done) == len(self.jobs)

    def status(self) -> Any:
        """The sweep's :class:`~tsm.sweep.status.SweepStatus` (None for a map of no items)."""
        if self.handle is None:
            return None
        return sweep.sweep_status(self.handle)

    def cancel(self) -> bool:
        """Cancel every item still running and launch no more; False when every item had already ended."""
        if self.handle is None or self.done():
            return False
        sweep.sweep_cancel(self._runner, self.handle)
        return True

    def __repr__(self) -> str:
        done = sum(j.done() for j in self.jobs)
        return f"<tsm.functions.MapJob {self.handle} {done}/{len(self.jobs)} done>"
