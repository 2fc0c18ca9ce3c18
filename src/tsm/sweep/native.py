"""Native sweeps: a scheduler that declares :class:`~tsm.sweep.api.SweepNative` runs the whole sweep itself.

On Slurm a sweep of single-role trials is one job array (``--array=0-(N-1)%P``): Slurm holds the cap, so
no controller has to stay alive. What is left to tsm is bookkeeping, done by whoever asks:

* :func:`dryruns` and :func:`record`: every trial's dry run (each materialized with its own parameters and
  app name) is handed to the scheduler at once through the runner (:meth:`Runner.schedule_sweep
  <tsm.runner.api.Runner.schedule_sweep>`, which records each trial in tsm's history and the tracker's
  lineage as it records an app); each trial's handle is recorded in the sweep's state, so ``tsm sweep
  show``, ``tsm log``, ``tsm status`` and the tracker work on each trial unchanged.
* :func:`refresh`: the trials' states from one batched query of the scheduler
  (:meth:`SweepNative.trial_states`), recorded with the start and end times the scheduler reports;
  ``max_failures`` cancels the trials not started yet; the sweep ends when every trial has. Called by
  ``tsm sweep status|wait|show`` (:mod:`tsm.sweep.api`).
* :func:`cancel`: every unfinished trial in one call (:meth:`SweepNative.cancel_trials`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from tsm.sweep.state import SKIPPED, SWEEP_TERMINAL, TRIAL_TERMINAL, SweepState, trial_args

#: A trial the scheduler holds but has not started (the app's PENDING/SUBMITTED): not the sweep's PENDING,
#: which means "not submitted".
QUEUED = "SUBMITTED"


def dryruns(runner: Any, component: str, trials: Sequence[Mapping[str, str]], names: Sequence[str],
            args: Sequence[str], scheduler: str, cfg: Mapping[str, Any] | None, workspace: str | None,
            sweep: str | None = None) -> list[Any]:
    """Every trial's dry run: the component materialized with the trial's parameters, named ``names[i]``; each
    role gets ``TSM_SWEEP_HANDLE=sweep`` (the trackers group the trials under the sweep)."""
    out = []
    for params, name in zip(trials, names, strict=True):
        app = runner.component_app(component, trial_args(params, args))
        app.name = name
        for role in app.roles if sweep else ():
            role.env.setdefault("TSM_SWEEP_HANDLE", sweep)
        out.append(runner.dryrun(app, scheduler, cfg, workspace=workspace))
    return out


def record(state: SweepState, handles: Sequence[str]) -> None:
    """Record each trial's handle once the runner handed the sweep to its scheduler (which recorded each trial
    as it records an app: :meth:`Runner.schedule_sweep <tsm.runner.api.Runner.schedule_sweep>`)."""
    from tsm.specs.handles import parse_app_handle

    state.set_meta(state="RUNNING", array=native_id([parse_app_handle(h).app_id for h in handles]))
    for idx, handle in enumerate(handles):
        state.set_trial(idx, QUEUED, handle=handle)


def native_id(app_ids: Sequence[str]) -> str:
    """The native object's id as the scheduler shows it (``1234`` for the array ``1234_0``..``1234_19``)."""
    firsts = {i.partition("_")[0] for i in app_ids}
    return firsts.pop() if len(firsts) == 1 else ",".join(sorted(firsts))


def _sched(runner: Any, meta: Mapping[str, Any]) -> Any:
    return runner.scheduler(meta["scheduler"])


def refresh(state: SweepState) -> None:
    """Bring the trials' states up to date from the scheduler and end the sweep when every trial has."""
    from tsm.runner.api import get_runner
    from tsm.specs.handles import parse_app_handle

    meta = state.meta()
    if meta.get("state") in SWEEP_TERMINAL:
        return
    live = [t for t in state.trials() if t.handle and t.state not in TRIAL_TERMINAL]
    if live:
        with get_runner(meta["session"]) as runner:
            sched = _sched(runner, meta)
            ids = {parse_app_handle(t.handle).app_id: t for t in live if t.handle}
            states = sched.trial_states(list(ids))
            for app_id, t in ids.items():
                got = states.get(app_id)
                if got is None:
                    state.set_trial(t.idx, "FAILED", msg="the app is gone (the scheduler no longer knows it)")
                    continue
                name = got.state.name
                name = QUEUED if name in ("PENDING", "SUBMITTED", "UNSUBMITTED") else name
                if name == "UNKNOWN" or name == t.state and (name != "RUNNING" or t.launched is not None):
                    continue
                state.set_trial(t.idx, name, msg=" ".join((got.msg or "").split())[:500] or None,
                                launched=got.started if name != QUEUED else None,
                                ended=got.ended if name in TRIAL_TERMINAL else None)
            _stop_after_failures(state, sched, meta)
    conclude(state)


def _stop_after_failures(state: SweepState, sched: Any, meta: Mapping[str, Any]) -> None:
    """``max_failures`` reached: the trials the scheduler has not started are cancelled and SKIPPED."""
    from tsm.specs.handles import parse_app_handle

    k = meta.get("max_failures")
    if k is None or meta.get("stop_reason") or state.counts().get("FAILED", 0) < k:
        return
    reason = f"stopped launching after {k} trial(s) failed (max_failures={k})"
    state.set_meta(stop_reason=reason)
    queued = [t for t in state.trials() if t.state == QUEUED and t.handle]
    sched.cancel_trials([parse_app_handle(t.handle).app_id for t in queued if t.handle])
    for t in queued:
        state.set_trial(t.idx, SKIPPED, msg=f"not started: {reason}")


def cancel(state: SweepState) -> None:
    """Cancel every unfinished trial in one call; the next :func:`refresh` records them and ends the sweep."""
    from tsm.runner.api import get_runner
    from tsm.specs.handles import parse_app_handle

    meta = state.meta()
    state.set_meta(cancel=True)
    live = [t for t in state.trials() if t.handle and t.state not in TRIAL_TERMINAL]
    with get_runner(meta["session"]) as runner:
        _sched(runner, meta).cancel_trials([parse_app_handle(t.handle).app_id for t in live if t.handle])
    state.skip_pending("not launched: the sweep was cancelled")


def conclude(state: SweepState) -> None:
    """End the sweep once every trial ended: CANCELLED, FAILED (with the reason) or SUCCEEDED."""
    counts = state.counts()
    if any(s not in TRIAL_TERMINAL for s in counts):
        return
    meta = state.meta()
    total = sum(counts.values())
    if meta.get("cancel"):
        state.set_meta(state="CANCELLED", reason="cancelled", ended=time.time())
    elif meta.get("stop_reason"):
        state.set_meta(state="FAILED", reason=meta["stop_reason"], ended=time.time())
    elif counts.get("SUCCEEDED", 0) == total:
        state.set_meta(state="SUCCEEDED", reason=f"{total} trial(s) succeeded", ended=time.time())
    else:
        bad = total - counts.get("SUCCEEDED", 0)
        state.set_meta(state="FAILED", reason=f"{bad} of {total} trial(s) did not succeed", ended=time.time())


def wait(state: SweepState, timeout: float | None) -> None:
    """Refresh until the sweep ends or ``timeout`` passes (polls: 1 s, backing off to 5 s)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    pause = 1.0
    while True:
        refresh(state)
        if state.meta().get("state") in SWEEP_TERMINAL:
            return
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            return
        time.sleep(pause if left is None else min(pause, left))
        pause = min(pause * 1.5, 5.0)

