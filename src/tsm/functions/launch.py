"""``Runner.submit`` and ``Runner.map``: checks, the plan, the app, the launch (what the runner delegates to).

Everything that can be refused is refused before anything is submitted, in one line: an argument that will
not pickle (:class:`~tsm.functions.errors.FunctionPickleError`, naming it), a replica Python that is not
this one where tsm can ask it (local, Slurm: :class:`~tsm.functions.errors.FunctionVersionError`), a call too
big for its channel, an unknown run option. Elsewhere the replica checks its Python as it starts and sends
the refusal back as the job's outcome.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from tsm.functions import payload
from tsm.functions.app import FunctionOptions, Plan, app_of, plan
from tsm.functions.checkpoint import Call, Checkpointable
from tsm.functions.errors import FunctionError, FunctionPickleError, FunctionVersionError
from tsm.functions.job import Job, JobSpec
from tsm.functions.worker import SUBMITIT_ALIAS_ENV
from tsm.schedulers.api import DirectoryWorkspaces
from tsm.specs.api import Resource

#: the run option that sends a scheduler's commands over SSH: its replicas do not share this machine's files
_REMOTE_OPTION = "ssh"
#: interpreter path -> its "major.minor", or the reason it cannot run the worker ("" when it can)
_PROBED: dict[str, tuple[str, str]] = {}
#: how many items of a map run at once when ``parallel`` is not given
DEFAULT_PARALLEL = 32


def split_options(resource: Resource | str | None, options: Mapping[str, Any]) -> tuple[FunctionOptions, dict[str, Any]]:
    """``options`` as the job's :class:`FunctionOptions` (the keywords that are its fields) and the scheduler's
    run options (every other one); a named resource (``"gpu.small"``) is looked up."""
    if isinstance(resource, str):
        from tsm.specs.named_resources import get_named_resource

        resource = get_named_resource(resource)
    known = {f.name for f in dataclasses.fields(FunctionOptions)} - {"resource"}
    mine = {k: v for k, v in options.items() if k in known and v is not None}
    if "env" in mine:
        mine["env"] = dict(mine["env"])
    opts = FunctionOptions(resource=resource, **mine)
    opts.check()
    return opts, {k: v for k, v in options.items() if k not in known}


def _probe(python: str) -> tuple[str, str]:
    """(``major.minor``, why it cannot run the worker or "") of another interpreter, asked once per process."""
    if python not in _PROBED:
        code = ("import sys; v = '%d.%d' % sys.version_info[:2]\n"
                "try:\n import cloudpickle, tsm.functions.worker\nexcept ImportError as e: print(v, e)\n"
                "else: print(v)")
        try:
            out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            out = ""  # a path on the nodes only: the replica checks for itself
        version, _, why = out.partition(" ")
        _PROBED[python] = (version, why)
    return _PROBED[python]


def check_python(env: Mapping[str, str], cfg: Mapping[str, Any]) -> None:
    """Refuse a replica interpreter (the schedulers' rule: :mod:`tsm.schedulers.common.interpreter`) that
    cannot load this Python's pickles or lacks what the worker imports."""
    from tsm.schedulers.common.interpreter import replica_python

    option = cfg.get("python")
    python = replica_python(env, str(option) if option else None).path
    if os.path.realpath(python) == os.path.realpath(sys.executable) or not os.path.isfile(python):
        return
    version, why = _probe(python)
    if version and version != payload.python_version():
        raise FunctionVersionError(
            f"the replicas would run Python {version} ({python}) but this is Python {payload.python_version()}: "
            "a pickled function only loads in the Python that pickled it; submit from that Python, or pass "
            "python= a matching interpreter"
        )
    if why:
        raise FunctionError(f"the replicas' Python ({python}) cannot run the worker: {why}; pip install "
                            "'tsm[functions]' there")


def _alias_env() -> dict[str, str]:
    """What replicas need to see the submitit alias this process runs under (remote ones do not inherit it)."""
    mode = os.environ.get(SUBMITIT_ALIAS_ENV)
    return {SUBMITIT_ALIAS_ENV: mode} if mode else {}


def _check_args(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
    """Name the argument that will not pickle (called once the whole call would not)."""
    cp = payload.cloudpickle()
    name = getattr(fn, "__qualname__", type(fn).__qualname__)
    for what, value in [("the function", fn), *((f"argument {i}", a) for i, a in enumerate(args)),
                        *((f"argument {k}=", v) for k, v in kwargs.items())]:
        try:
            cp.dumps(value, protocol=5)
        except Exception as e:  # noqa: BLE001 - the first value that fails is the one to name
            raise FunctionPickleError(
                f"cannot submit {name}: {what} ({type(value).__module__}.{type(value).__qualname__}) cannot be "
                f"pickled: {type(e).__name__}: {e}"
            ) from e


def _prepare(runner: Any, scheduler: str | None, cfg: Mapping[str, Any] | None, run_options: Mapping[str, Any],
             call: Call, options: FunctionOptions) -> tuple[str, dict[str, Any], Plan]:
    name = scheduler or runner.default_scheduler
    full = {**(cfg or {}), **run_options}
    runner.check_cfg(name, full)
    shares = isinstance(runner.scheduler(name), DirectoryWorkspaces) and not full.get(_REMOTE_OPTION)
    files_channel = options.channel == "files" or (options.channel == "auto" and shares)
    if files_channel:
        check_python(options.env, full)
    try:
        p = plan(call, options, shares, alias_env=_alias_env())
    except FunctionPickleError:
        _check_args(call.function, call.args, call.kwargs)
        raise
    if isinstance(call.function, Checkpointable) and not p.key_dir and not options.checkpoint_dir:
        warnings.warn(f"{p.name} is Checkpointable, but the {name} scheduler's replicas do not share this "
                      "machine's files: pass checkpoint_dir= (a volume they mount), or the next attempt starts over",
                      stacklevel=3)
    return name, full, p


def _call(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any] | None) -> Call:
    """What the job runs: ``fn(*args, **kwargs)``; a :class:`Call` given as ``fn`` is run as it is (its class and
    attributes travel with it), after ``args``."""
    if isinstance(fn, Call):
        if kwargs:
            raise TypeError("give a Call's keyword arguments in the Call, not in kwargs=")
        return fn.extended(*args)
    return Call(fn, *args, **dict(kwargs or {}))


def _discard(p: Plan) -> None:
    if p.key_dir:
        shutil.rmtree(p.key_dir, ignore_errors=True)


def submit(runner: Any, fn: Callable[..., Any], *args: Any, scheduler: str | None = None,
           resource: Resource | str | None = None, kwargs: Mapping[str, Any] | None = None,
           cfg: Mapping[str, Any] | None = None, workspace: str | None = None, parent_run_id: str | None = None,
           **options: Any) -> Job:
    """Run ``fn(*args, **kwargs)`` as a job on ``scheduler``; its :class:`Job`.

    ``options`` are the job's (:class:`~tsm.functions.app.FunctionOptions`: ``replicas``, ``image``, ``env``,
    ``name``, ``max_retries``, ``tasks_per_node``, ``channel``, ``checkpoint_dir``, ``results``, ``setup``,
    ``teardown``), and every other keyword is a run option of the scheduler, as ``cfg`` also gives them.
    """
    opts, run_options = split_options(resource, options)
    sched, full, p = _prepare(runner, scheduler, cfg, run_options, _call(fn, args, kwargs), opts)
    app = app_of(p)
    try:
        info = runner.dryrun(app, sched, full, workspace=workspace, parent_run_id=parent_run_id)
        handle = runner.schedule(info)
    except BaseException:
        _discard(p)  # nothing was submitted: nothing is left
        raise
    return Job(runner, handle, JobSpec.of(app))


def map_items(iterables: tuple[Iterable[Any], ...]) -> list[str]:
    """Each item's sweep value: ``<index>:<its pickled arguments>`` (one argument word at most)."""
    out = []
    for i, item in enumerate(zip(*iterables, strict=False)):  # as map(): the shortest iterable ends it
        words = payload.to_words(payload.dumps(tuple(item), f"the arguments of item {i}"))
        if len(words) > 1:
            raise FunctionError(f"item {i} of the map pickles to over {payload.WORD // 1000} KB of base64: pass "
                                "something smaller (a path, an index) and load the data inside the function")
        out.append(f"{i}:{words[0]}")
    return out


def map_(runner: Any, fn: Callable[..., Any], *iterables: Iterable[Any], parallel: int | None = None,
         scheduler: str | None = None, resource: Resource | str | None = None, kwargs: Mapping[str, Any] | None = None,
         cfg: Mapping[str, Any] | None = None, workspace: str | None = None, max_failures: int | None = None,
         **options: Any) -> Any:
    """``fn`` once per item of ``zip(*iterables)``, ``parallel`` at a time (default 32), as a sweep; its
    :class:`~tsm.functions.mapping.MapJob` (one :class:`Job` per item, in order). ``options`` as for
    :func:`submit`; ``kwargs`` go to every call."""
    from tsm.functions import component
    from tsm.functions.mapping import MapJob

    opts, run_options = split_options(resource, options)
    items = map_items(iterables)
    if not items:
        warnings.warn("map() of no items: nothing was submitted", stacklevel=3)
        return MapJob.empty(runner)
    sched, full, p = _prepare(runner, scheduler, cfg, run_options, _call(fn, (), kwargs), opts)
    import pickle

    try:
        from tsm.sweep import run_sweep

        handle = run_sweep(
            runner,
            f"{os.path.abspath(component.__file__)}:trial", {"item": items}, scheduler=sched, cfg=full,
            args=["--", *payload.to_words(pickle.dumps(p))], parallel=min(parallel or DEFAULT_PARALLEL, len(items)),
            max_failures=max_failures, workspace=workspace,
        )
    except BaseException:
        _discard(p)
        raise
    return MapJob(runner, handle, p, len(items))
