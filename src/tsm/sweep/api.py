"""Sweeps through the Runner: plan, launch, watch, cancel and list them (what ``tsm sweep`` calls).

A sweep is a component run once per point of a space (:mod:`tsm.sweep.space`), at most ``parallel`` trials at
a time, each trial an ordinary app with its own handle. Its handle is ``sweep://<session>/<id>``; its state
is durable (:mod:`tsm.sweep.state`) and its trials are fed by a detached controller
(:mod:`tsm.sweep.controller`) that outlives the caller and is restarted, without re-running a trial, by
:func:`sweep_status`, :func:`sweep_wait` or :func:`resume` when it was killed.

**Native sweeps.** A scheduler that can take a whole sweep itself declares :class:`SweepNative` (Slurm: a
job array, ``--array=0-(N-1)%P``, so the engine enforces the cap and nothing of ours stays alive). When
every trial is single-role, :func:`run_sweep` hands it every trial's dry run at once instead of starting a
controller, and records the trials' handles; status, wait, show and cancel then read the trials' states from
the scheduler (:mod:`tsm.sweep.native`). Multi-role trials (a heterogeneous Slurm job cannot be an array)
and every other scheduler go through the controller.
"""

from __future__ import annotations

import inspect
import os
import re
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# the capability is part of the scheduler contract: backends import it from there, never from tsm.sweep
from tsm.schedulers.api import SweepNative as SweepNative, TrialState as TrialState
from tsm.sweep import controller
from tsm.sweep.space import InvalidSweepError, expand, probes, space_of
from tsm.sweep.state import (
    SWEEP_TERMINAL,
    TRIAL_TERMINAL,
    SweepHandle,
    SweepState,
    Trial,
    all_sweeps,
    parse_sweep_handle,
    sweep_dir,
    trial_args,
)
from tsm.sweep.status import SweepStatus, status_of

#: The most trials one sweep runs at once: the controller waits on each running trial in a thread of its own.
MAX_PARALLEL = 1000

#: Values the component itself is called with before a sweep starts (each call builds its parser: a few ms);
#: the values past these are parsed as their parameter's type.
MATERIALIZED = 200


@dataclass
class SweepPlan:
    """What a sweep would run: every trial's parameters, and the first trial's dry run (the request)."""

    component: str
    scheduler: str
    trials: list[dict[str, str]]
    first: Any  # AppDryRunInfo of trial 0


def component_ref(component: str | Callable[..., Any]) -> str:
    """The name a controller can find ``component`` by: the name itself, or ``/abs/file.py:function``."""
    if isinstance(component, str):
        return component
    name = getattr(component, "__name__", "")
    if getattr(component, "__qualname__", None) != name or not callable(component):
        raise InvalidSweepError(
            f"{component!r} cannot be swept: pass a component name or a module-level function "
            "(the detached controller imports it by file and name)"
        )
    try:
        path = inspect.getsourcefile(component)
    except TypeError:
        path = None
    if not path:
        raise InvalidSweepError(f"component function {name} has no source file: define it in a .py file")
    return f"{os.path.abspath(path)}:{name}"


def _param_names(component: str) -> set[str]:
    from tsm.components import get_component

    fn = get_component(component).fn
    return {p.name for p in inspect.signature(fn).parameters.values()
            if p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)}


def _check_types(component: str, axes: Mapping[str, object]) -> None:
    """Parse every value of every list axis as its parameter's type (what the command line would refuse)."""
    import typing

    from tsm.components import get_component
    from tsm.components.cmdline import param_type, parse_value

    hints = typing.get_type_hints(get_component(component).fn)
    for name, axis in axes.items():
        ptype = param_type(hints.get(name.replace("-", "_")))
        if ptype is None:
            continue
        for value in getattr(axis, "values", ()):
            try:
                parse_value(value, ptype)
            except ValueError as e:
                raise InvalidSweepError(f"--{name}: {e}") from None


def plan_sweep(
    runner: Any,
    component: str | Callable[..., Any],
    space: Mapping[str, object],
    *,
    scheduler: str | None = None,
    cfg: Mapping[str, Any] | None = None,
    args: Sequence[str] = (),
    parallel: int = 1,
    max_failures: int | None = None,
    random: int | None = None,
    seed: int | None = None,
    workspace: str | None = None,
) -> SweepPlan:
    """Check everything and expand the space; nothing is submitted. Raises :class:`InvalidSweepError` (and
    the component's own errors for a value its parameter cannot take)."""
    if not isinstance(parallel, int) or not 1 <= parallel <= MAX_PARALLEL:
        raise InvalidSweepError(f"--parallel must be at least 1 and at most {MAX_PARALLEL:,}, got {parallel}")
    if max_failures is not None and (not isinstance(max_failures, int) or max_failures < 1):
        raise InvalidSweepError(f"--max-failures must be at least 1, got {max_failures}")
    ref = component_ref(component)
    axes = space_of(space)
    known = _param_names(ref)
    for name in axes:
        if name.replace("-", "_") not in known:
            from tsm.errors import did_you_mean

            raise InvalidSweepError(
                f"--{name} is not a parameter of component {ref}{did_you_mean(name.replace('-', '_'), known)}"
            )
    trials = expand(axes, random, seed)
    runner.check_cfg(scheduler, cfg)
    sched = scheduler or runner.default_scheduler
    # every listed value once (so a value its parameter cannot take fails now), then the first trial's request:
    # the component itself judges the first MATERIALIZED ones, its parameters' types every one
    checks = probes(axes, trials[0])
    for params in checks[:MATERIALIZED]:
        runner.component_app(ref, trial_args(params, args))
    if len(checks) > MATERIALIZED:
        _check_types(ref, axes)
    first = runner.dryrun(runner.component_app(ref, trial_args(trials[0], args)), sched, cfg, workspace=workspace)
    return SweepPlan(ref, sched, trials, first)


def _sweep_id(app_name: str) -> str:
    base = re.sub(r"[^a-z0-9]+", "-", app_name.lower()).strip("-")[:24] or "sweep"
    return f"{base}-{secrets.token_hex(4)}"


def run_sweep(
    runner: Any,
    component: str | Callable[..., Any],
    space: Mapping[str, object],
    *,
    scheduler: str | None = None,
    cfg: Mapping[str, Any] | None = None,
    args: Sequence[str] = (),
    parallel: int = 1,
    max_failures: int | None = None,
    random: int | None = None,
    seed: int | None = None,
    metric: str | None = None,
    workspace: str | None = None,
) -> str:
    """Plan the sweep, record it, start its detached controller; returns ``sweep://<session>/<id>``."""
    if "queue" in runner.scheduler(scheduler or runner.default_scheduler).run_opts() and "queue" not in (cfg or {}):
        cfg = {**(cfg or {}), "queue": True}  # trials wait for free CPUs/GPUs (local), unless -c queue=false
    plan = plan_sweep(runner, component, space, scheduler=scheduler, cfg=cfg, args=args, parallel=parallel,
                      max_failures=max_failures, random=random, seed=seed, workspace=workspace)
    app_name = plan.first.app.name if plan.first.app is not None else "sweep"
    handle = SweepHandle(runner.session_name, _sweep_id(app_name))
    names = [f"{handle.sweep_id}-{i}" for i in range(len(plan.trials))]
    sched = runner.scheduler(plan.scheduler)
    infos: list[Any] = []
    if isinstance(sched, SweepNative) and plan.first.app is not None and len(plan.first.app.roles) == 1:
        from tsm.sweep import native

        infos = native.dryruns(runner, plan.component, plan.trials, names, args, plan.scheduler, cfg, workspace,
                               str(handle))
        if not sched.accepts_sweep(infos):
            infos = []
    state = SweepState(sweep_dir(handle), create=True)
    try:
        state.init({
            "handle": str(handle), "session": handle.session, "component": plan.component, "args": list(args),
            "space": {k: str(v) for k, v in space.items()}, "scheduler": plan.scheduler, "cfg": dict(cfg or {}),
            "parallel": parallel, "max_failures": max_failures, "random": random, "seed": seed, "metric": metric,
            "workspace": workspace, "cwd": os.getcwd(), "created": time.time(), "state": "PENDING", "reason": "",
            "total": len(plan.trials), "name": app_name, "native": bool(infos),
        }, plan.trials, names)
        if infos:
            try:
                handles = runner.schedule_sweep(infos, parallel, handle.sweep_id)  # each trial recorded there
            except BaseException:
                state.close()
                import shutil

                shutil.rmtree(sweep_dir(handle), ignore_errors=True)  # nothing was submitted: no sweep either
                raise
            native.record(state, handles)
    finally:
        state.close()
    if not infos:
        controller.start(sweep_dir(handle), os.getcwd())
    return str(handle)


def _native(state: SweepState) -> bool:
    """Whether the sweep was handed to its scheduler whole (:class:`SweepNative`): no controller of ours."""
    return bool(state.meta().get("native"))


def _open(handle: str) -> tuple[SweepHandle, SweepState]:
    parsed = parse_sweep_handle(handle)
    return parsed, SweepState.open(parsed)


def sweep_status(handle: str, restart: bool = True) -> SweepStatus:
    """The sweep's status; an unfinished sweep whose controller was killed gets a new one (``restart``)."""
    parsed, state = _open(handle)
    try:
        if _native(state):
            from tsm.sweep import native

            native.refresh(state)
            return status_of(str(parsed), state, alive=False)
        if restart:
            controller.ensure(state.dir, state)
        return status_of(str(parsed), state, controller.alive(state.dir))
    finally:
        state.close()


def resume(handle: str) -> bool:
    """Restart the controller of an unfinished sweep if it is gone; True when one was started."""
    _, state = _open(handle)
    try:
        return controller.ensure(state.dir, state)
    finally:
        state.close()


def sweep_wait(handle: str, timeout: float | None = None) -> SweepStatus:
    """Block until the sweep ends (or ``timeout`` seconds pass), restarting a killed controller; its status."""
    parsed, state = _open(handle)
    deadline = None if timeout is None else time.monotonic() + timeout
    restarts = 0
    try:
        if _native(state):
            from tsm.sweep import native

            native.wait(state, timeout)
            return status_of(str(parsed), state, alive=False)
        while True:
            if state.meta().get("state") in SWEEP_TERMINAL:
                return status_of(str(parsed), state, alive=False)
            if controller.ensure(state.dir, state):
                restarts += 1
                if restarts > 1:  # it keeps ending with the sweep unfinished: do not spin (see controller.log)
                    time.sleep(min(0.1 * 2**restarts, 5.0))
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return status_of(str(parsed), state, controller.alive(state.dir))
            controller.wait_for_exit(state.dir, left)  # the controller's exit (or death) is the event
    finally:
        state.close()


def sweep_cancel(runner: Any, handle: str, timeout: float | None = 60.0) -> SweepStatus:
    """Launch nothing more and cancel every running trial; returns once the sweep is CANCELLED (or ``timeout``)."""
    parsed, state = _open(handle)
    try:
        if state.meta().get("state") in SWEEP_TERMINAL:
            return status_of(str(parsed), state, alive=False)
        if _native(state):
            from tsm.sweep import native

            native.cancel(state)
            return sweep_wait(handle, timeout)
        state.set_meta(cancel=True)
        for t in state.trials():
            if t.handle and t.state not in TRIAL_TERMINAL:
                runner.cancel(t.handle)
    finally:
        state.close()
    return sweep_wait(handle, timeout)


def sweep_trials(handle: str) -> list[Trial]:
    """The sweep's trials as recorded, in order (a native sweep's brought up to date first)."""
    _, state = _open(handle)
    try:
        if _native(state):
            from tsm.sweep import native

            native.refresh(state)
        return state.trials()
    finally:
        state.close()


def sweeps(session: str | None = None) -> list[SweepStatus]:
    """Every sweep (one session's when given), newest first; reads only (restarts nothing)."""
    out = []
    for h in all_sweeps(session):
        try:
            state = SweepState.open(h)
        except Exception:  # noqa: BLE001 - a sweep being created or removed right now
            continue
        try:
            out.append(status_of(str(h), state, alive=False))
        finally:
            state.close()
    out.sort(key=lambda s: s.created, reverse=True)
    return out


def sweep_metric(handle: str) -> str | None:
    """The metric the sweep was started with (``--metric``), which ``show`` sorts by when not told otherwise."""
    _, state = _open(handle)
    try:
        metric = state.meta().get("metric")
        return metric if isinstance(metric, str) else None
    finally:
        state.close()


def sweep_component(handle: str) -> str:
    """The component the sweep runs, as its controller finds it (a name, or ``/abs/file.py:function``)."""
    _, state = _open(handle)
    try:
        return str(state.meta().get("component", ""))
    finally:
        state.close()
