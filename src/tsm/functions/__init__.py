"""Python functions as jobs: ``runner.submit(fn, *args)`` is a future, on every scheduler.

::

    import tsm

    def square(x: int) -> int:
        return x * x

    with tsm.get_runner() as runner:
        job = runner.submit(square, 7)                         # on the default scheduler (local)
        print(job.result())                                    # 49: a concurrent.futures.Future
        ranks = runner.submit(square, 3, replicas=2).result()  # [9, 9]: every rank's result
        jobs = runner.map(square, range(20), parallel=4)       # one trial of a sweep per item, 4 at a time
        print(jobs.results())                                  # [0, 1, 4, ...]

``runner.submit(fn, *args, scheduler=None, resource=None, replicas=1, kwargs=None, **run_options)``:

* ``fn`` and its arguments are pickled with cloudpickle (``pip install 'tsm[functions]'``); one that will not
  pickle is refused at once, naming it. ``kwargs=`` are ``fn``'s keyword arguments; every other keyword not
  named below is a run option of the scheduler (``time_limit="2h"``, ``partition="gpu"``; also ``cfg=``).
* ``replicas=N`` runs ``fn`` in N replicas; each sees its rank (:func:`environment`: ``rank``,
  ``world_size``, ``local_rank``, ``rank0_host``, ``export_torch()``), and ``result()`` is the list of every
  rank's results, or rank 0's with ``results="rank0"``. ``tasks_per_node=`` says how ranks share nodes.
* ``image=`` (Docker, Kubernetes: an image with this Python, ``cloudpickle`` and tsm), ``resource=`` (a
  :class:`~tsm.specs.Resource` or a named one, ``"gpu.small"``), ``env=``, ``name=``, ``max_retries=``,
  ``workspace=`` (ship a directory, as ``Runner.run`` does), ``channel=`` (``"files"``/``"output"``: see
  :mod:`tsm.functions.app`), ``checkpoint_dir=`` (see :class:`Checkpointable`).

The :class:`~tsm.functions.job.Job` is a :class:`concurrent.futures.Future` (``result(timeout)``,
``exception()``, ``done()``, ``cancel()``, ``add_done_callback``; ``concurrent.futures.wait`` and
``as_completed`` work on it) with the app's ``handle``, ``status()`` and ``logs(rank)``; :func:`attach`
finds it again from its handle in another process. An exception the function raised is raised by
``result()`` as itself, the replica's traceback as its ``__cause__``; a rank killed before it returned is a
:class:`ReplicaLostError` saying how it ended. ``tsm rm`` of the job's app removes everything it left.

``runner.map(fn, *iterables, parallel=N)`` runs one trial per item on the sweep machinery (a Slurm job array
where the scheduler is Slurm); see :mod:`tsm.functions.mapping`. A preempted or timed-out function resumes
from its state: :class:`Checkpointable`.
"""

from __future__ import annotations

import importlib

TYPE_CHECKING = False

_EXPORTS = {
    "Job": "tsm.functions.job",
    "MapJob": "tsm.functions.mapping",
    "Call": "tsm.functions.checkpoint",
    "Checkpointable": "tsm.functions.checkpoint",
    "Environment": "tsm.functions.env",
    "environment": "tsm.functions.env",
    "FunctionError": "tsm.functions.errors",
    "FunctionPickleError": "tsm.functions.errors",
    "FunctionVersionError": "tsm.functions.errors",
    "FunctionLoadError": "tsm.functions.errors",
    "ReplicaLostError": "tsm.functions.errors",
    "RemoteError": "tsm.functions.errors",
    "RemoteTraceback": "tsm.functions.errors",
    "TransportError": "tsm.functions.errors",
}

__all__ = sorted([*_EXPORTS, "attach", "submit", "map"])


def __getattr__(name: str) -> object:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'tsm.functions' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def submit(fn: object, *args: object, **options: object) -> object:
    """:meth:`Runner.submit <tsm.runner.api.Runner.submit>` on a runner of the default session."""
    from tsm.functions.launch import submit as _submit
    from tsm.runner.api import get_runner

    return _submit(get_runner(), fn, *args, **options)  # type: ignore[arg-type]


def attach(handle: str, runner: object = None) -> object:
    """The :class:`~tsm.functions.job.Job` of a function job launched earlier, by this process or another, from
    its handle (on ``runner``, else a runner of the handle's session)."""
    from tsm.functions.job import attach_with

    if runner is None:
        from tsm.runner.api import get_runner
        from tsm.specs.handles import parse_app_handle

        runner = get_runner(parse_app_handle(handle).session)
    return attach_with(runner, handle)


def map(fn: object, *iterables: object, **options: object) -> object:  # noqa: A001 - the builtin's name, on purpose
    """:meth:`Runner.map <tsm.runner.api.Runner.map>` on a runner of the default session."""
    from tsm.functions.launch import map_
    from tsm.runner.api import get_runner

    return map_(get_runner(), fn, *iterables, **options)  # type: ignore[arg-type]


if TYPE_CHECKING:  # pragma: no cover
    from tsm.functions.checkpoint import Call as Call, Checkpointable as Checkpointable
    from tsm.functions.env import Environment as Environment, environment as environment
    from tsm.functions.errors import (
        FunctionError as FunctionError,
        FunctionLoadError as FunctionLoadError,
        FunctionPickleError as FunctionPickleError,
        FunctionVersionError as FunctionVersionError,
        RemoteError as RemoteError,
        RemoteTraceback as RemoteTraceback,
        ReplicaLostError as ReplicaLostError,
        TransportError as TransportError,
    )
    from tsm.functions.job import Job as Job
    from tsm.functions.mapping import MapJob as MapJob
