"""The sweep controller: a detached process that feeds a sweep's trials to the Runner, ``parallel`` at a time.

It is started detached and isolated (:mod:`tsm.util.daemon`: its own session, stdin closed, output to
``controller.log`` in the sweep's folder, no code from the working directory on its ``sys.path``), like the
local scheduler's supervisor, so closing the terminal that started a sweep changes nothing, and of many
processes that find it gone at once (``tsm sweep status`` from two shells) only one starts it again. Its life:

1. take ``controller.lock`` (``flock``, exclusive): one controller per sweep (one started by hand beside it
   waits for it, then finds the sweep ended or continues it). Waiters (:func:`wait_for_exit`) block on the
   same lock, so they wake on the controller's exit, not a timer.
2. reconcile: a trial left ``LAUNCHING`` by a killed controller is looked up by its app name in the
   scheduler's list: found, its handle is adopted and it is waited on; not found, it was never submitted and
   goes back to ``PENDING``. Trials left ``RUNNING`` are waited on. So no trial is submitted twice.
3. the first trial is submitted (and looked at once) before the others, on the controller's own thread, so
   the imports a submission makes never run on two threads at once (see :meth:`Controller._first`).
   ``parallel`` workers, each with its own Runner, then take the next trial: record ``LAUNCHING`` (intent),
   ``runner.run`` it, record its handle, ``runner.wait`` for it (an event on schedulers that have one), record
   its end. A worker that finds the sweep cancelled, or ``max_failures`` trials failed, launches nothing more.
4. finish: SUCCEEDED when every trial succeeded; FAILED with the reason otherwise; CANCELLED when cancelled.

A failed trial is retried only by its own roles' retry policy (the scheduler's); the controller adds nothing.
``python -m tsm.sweep.controller DIR`` runs it by hand; :func:`start` spawns :data:`ENTRY`.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from tsm.sweep.state import LAUNCHING, PENDING, SWEEP_TERMINAL, TRIAL_TERMINAL, SweepState
from tsm.util import daemon

LOCK = "controller.lock"
LOG = "controller.log"

#: The controller's entry point (:func:`tsm.util.daemon.command`).
ENTRY = "tsm.sweep.controller:main"


def alive(sweep: Path) -> bool:
    """Whether a controller holds the sweep's lock now."""
    return daemon.held(sweep / LOCK)


def start(sweep: Path, cwd: str | None = None, ready_timeout: float = 10.0) -> bool:
    """Spawn a detached controller for ``sweep`` unless one runs or is starting; return once it holds the lock
    (or has exited, or ``ready_timeout`` passed). True when this call started it.

    ``cwd``: the working directory its trials are submitted from (the sweep's, where its config files are).
    """
    sweep = sweep.absolute()
    return daemon.start_helper(sweep / LOCK, ENTRY, str(sweep), log=sweep / LOG,
                               cwd=cwd if cwd and os.path.isdir(cwd) else None, ready_timeout=ready_timeout)


def ensure(sweep: Path, state: SweepState) -> bool:
    """Restart the controller of an unfinished sweep whose controller is gone; True when one was started."""
    meta = state.meta()
    if meta.get("state") in SWEEP_TERMINAL or meta.get("native") or alive(sweep):
        return False  # a native sweep (the scheduler holds it whole, tsm.sweep.native) has no controller
    return start(sweep, meta.get("cwd"))


def wait_for_exit(sweep: Path, timeout: float | None) -> bool:
    """Block until the controller releases its lock (it ended or died) or ``timeout`` passes; True if released."""
    return daemon.wait_released(sweep / LOCK, timeout)


class Controller:
    """Feeds one sweep's trials through Runners; see the module doc."""

    def __init__(self, sweep: Path) -> None:
        self.dir = sweep
        self.state = SweepState(sweep)
        self.meta = self.state.meta()
        self._lock = threading.Lock()
        self._todo: list[tuple[int, str | None]] = []  # (trial, handle to wait on, or None to launch)
        self.stop_reason: str | None = None

    def _runner(self) -> Any:
        from tsm.runner.api import get_runner

        return get_runner(self.meta["session"])

    def _cancelled(self) -> bool:
        return bool(self.state.meta().get("cancel"))

    def reconcile(self, runner: Any) -> None:
        """Queue trials a killed controller left RUNNING or LAUNCHING, without submitting any twice."""
        trials = self.state.trials()
        launching = [t for t in trials if t.state == LAUNCHING]
        by_name: dict[str, str] = {}
        if launching:
            for app in runner.list(self.meta["scheduler"]):
                if app.name and app.app_handle:
                    by_name.setdefault(app.name, app.app_handle)
        for t in trials:
            if t.state == LAUNCHING:
                found = t.handle or by_name.get(t.name)
                if found:
                    self.state.set_trial(t.idx, "RUNNING", handle=found, msg="adopted on resume")
                    self._todo.append((t.idx, found))
                else:
                    self.state.set_trial(t.idx, PENDING)
            elif t.state not in TRIAL_TERMINAL and t.state != PENDING and t.handle:
                self._todo.append((t.idx, t.handle))
        pending = [t.idx for t in self.state.trials() if t.state == PENDING]
        self._todo += [(i, None) for i in pending]
        self._todo.reverse()  # popped from the end: adopted trials first, then in index order

    def _failures(self) -> int:
        return self.state.counts().get("FAILED", 0)

    def _next(self) -> tuple[int, str | None] | None:
        """The next trial for a worker: one to wait on, else (if launching is still allowed) one to launch."""
        with self._lock:
            if not self._todo:
                return None
            idx, handle = self._todo[-1]
            if handle is None:
                if self._cancelled():
                    return None
                k = self.meta.get("max_failures")
                if k is not None and self._failures() >= k:
                    self.stop_reason = f"stopped launching after {k} trial(s) failed (max_failures={k})"
                    return None
                self.state.set_trial(idx, LAUNCHING)  # the intent, before anything is submitted
            self._todo.pop()
            return idx, handle

    def _launch(self, runner: Any, idx: int) -> str | None:
        from tsm.errors import TsmError

        trial = self.state.trial(idx)
        args = [w for name, value in trial.params.items() for w in (f"--{name}", value)] + list(self.meta["args"])
        try:
            app = runner.component_app(self.meta["component"], args)
            app.name = trial.name
            for role in app.roles:  # the trackers group the trials under the sweep (tsm.tracker.attempts)
                role.env.setdefault("TSM_SWEEP_HANDLE", self.meta["handle"])
            handle: str = runner.run(app, self.meta["scheduler"], self.meta.get("cfg"),
                                     workspace=self.meta.get("workspace"))
        except Exception as e:  # noqa: BLE001 - a trial that cannot be launched fails; the sweep goes on
            what = str(e) if isinstance(e, TsmError) else f"{type(e).__name__}: {e}"
            self.state.set_trial(idx, "FAILED", msg=f"not launched: {' '.join(what.split())}"[:500])
            return None
        self.state.set_trial(idx, "RUNNING", handle=handle)
        if self._cancelled():  # cancelled while it was being submitted: `tsm sweep cancel` did not know it
            runner.cancel(handle)
        return handle

    def _worker(self) -> None:
        runner = self._runner()
        try:
            while (item := self._next()) is not None:
                idx, handle = item
                if handle is None:
                    handle = self._launch(runner, idx)
                    if handle is None:
                        continue
                elif self._cancelled():  # adopted on resume after `tsm sweep cancel`, which did not know it
                    runner.cancel(handle)
                status = self._wait(runner, handle)
                if status is None:
                    self.state.set_trial(idx, "FAILED", msg="the app is gone (removed while it ran)")
                else:
                    msg = " ".join((status.msg or "").split())[:500]
                    self.state.set_trial(idx, status.state.name, msg=msg or None)  # None keeps "adopted on resume"
        finally:
            runner.close()

    @staticmethod
    def _wait(runner: Any, handle: str) -> Any:
        """``runner.wait(handle)``, riding out a scheduler that is briefly unreachable (back-off up to 30 s)."""
        pause = 1.0
        while True:
            try:
                return runner.wait(handle)
            except Exception as e:  # noqa: BLE001 - logged; the trial is still running somewhere
                sys.stderr.write(f"tsm sweep: waiting for {handle} failed ({type(e).__name__}: {e}); retrying\n")
                sys.stderr.flush()
                time.sleep(pause)
                pause = min(pause * 2, 30.0)

    def _first(self, runner: Any) -> None:
        """Submit the first trial (or look at the first adopted one) with the reconcile's ``runner``, on this
        thread, before the workers start.

        Python's imports are not safe on several threads at once (CPython gh-83065): two workers importing a
        scheduler's client, or a package and its submodule, for the first time can each get the other's
        partially initialised module ("partially initialized module 'logging' has no attribute 'getLogger'"
        failed two trials of a Docker sweep). The first submission and look import what the later ones use;
        the trial then goes back to the queue's end, so the first worker waits on it.
        """
        item = self._next()
        if item is None:
            return
        idx, handle = item
        if handle is None:
            handle = self._launch(runner, idx)
        if handle is not None:
            with contextlib.suppress(Exception):  # only a warm-up: the worker's wait rides out errors
                runner.status(handle)
            with self._lock:
                self._todo.append((idx, handle))

    def run(self) -> None:
        """Reconcile, run the workers to the end, and record how the sweep ended."""
        self.state.set_meta(state="RUNNING", controller_pid=os.getpid())
        runner = self._runner()
        try:
            self.reconcile(runner)
            self._first(runner)
        finally:
            runner.close()
        n = max(1, min(int(self.meta["parallel"]), len(self._todo)))
        workers = [threading.Thread(target=self._worker, name=f"trial-worker-{i}") for i in range(n)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        self.finish()

    def finish(self) -> None:
        import resource

        usage = resource.getrusage(resource.RUSAGE_SELF)  # the controller's own CPU (its threads included)
        self.state.set_meta(controller_cpu_s=round(usage.ru_utime + usage.ru_stime, 3))
        counts = self.state.counts()
        total = sum(counts.values())
        if any(s not in TRIAL_TERMINAL and s != PENDING for s in counts):
            # a worker died with its trial unresolved: leave the sweep RUNNING for the next controller
            sys.stderr.write("tsm sweep: trials still unresolved; `tsm sweep resume` continues the sweep\n")
            return
        if self._cancelled():
            self.state.skip_pending("not launched: the sweep was cancelled")
            self.state.set_meta(state="CANCELLED", reason="cancelled", ended=time.time())
        elif self.stop_reason or counts.get(PENDING):
            self.state.skip_pending(f"not launched: {self.stop_reason or 'stopped'}")
            self.state.set_meta(state="FAILED", reason=self.stop_reason or "stopped", ended=time.time())
        elif counts.get("SUCCEEDED", 0) == total:
            self.state.set_meta(state="SUCCEEDED", reason=f"{total} trial(s) succeeded", ended=time.time())
        else:
            bad = total - counts.get("SUCCEEDED", 0)
            self.state.set_meta(state="FAILED", reason=f"{bad} of {total} trial(s) did not succeed", ended=time.time())


def main(argv: list[str] | None = None) -> int:
    """``python -m tsm.sweep.controller DIR``: run the sweep in DIR once no other controller runs it."""
    args = sys.argv[1:] if argv is None else argv
    sweep = Path(args[0])
    # a waiter's shared lock is held an instant only; another controller's until it ends (then this one finds
    # the sweep ended, or continues what that one left)
    fd = daemon.take(sweep / LOCK, wait=True)
    daemon.started()
    controller = Controller(sweep)
    if fd is None or controller.meta.get("state") in SWEEP_TERMINAL or controller.meta.get("native"):
        return 0
    with contextlib.suppress(OSError):
        os.chdir(controller.meta.get("cwd") or ".")
    controller.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
