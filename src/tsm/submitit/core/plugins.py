"""submitit's ``core.plugins``: the executors and job environments, submitit's own and its plugins'.

Plugins are entry points of the group ``submitit`` named ``executor`` (an :class:`Executor` subclass) or
``job_environment`` (a :class:`JobEnvironment` subclass), as submitit reads them; one that fails to load is
logged to the ``submitit`` logger and skipped, an entry of another name is logged as unsupported. tsm's
schedulers are not listed here: ``AutoExecutor(cluster=...)`` takes their names besides these
(:mod:`tsm.submitit.auto.auto`).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from importlib import metadata
from typing import TYPE_CHECKING, Any

from tsm.submitit.core import logger

if TYPE_CHECKING:
    from tsm.submitit.core.core import Executor
    from tsm.submitit.core.job_environment import JobEnvironment


def _load(entry: metadata.EntryPoint, executors: list[Any], envs: list[Any]) -> None:
    module = entry.value.split(":", 1)[0]
    try:
        obj = entry.load()
    except Exception as e:  # noqa: BLE001 - a broken plugin is reported and skipped
        logger.exception(f"skipping submitit plugin '{module}': it does not load: {e}")
        return
    if entry.name == "executor":
        executors.append(obj)
        return
    try:
        envs.append(obj())
    except Exception as e:  # noqa: BLE001
        name = getattr(obj, "name", getattr(obj, "__name__", str(obj)))
        logger.exception(f"skipping job environment {name} ({obj}) of submitit plugin '{module}': it does not start: {e}")


@functools.lru_cache
def _get_plugins() -> tuple[list[type[Executor]], list[JobEnvironment]]:
    from tsm.submitit.local import debug, local
    from tsm.submitit.slurm import slurm
    from tsm.submitit.tsmjob import TsmJobEnvironment

    executors: list[Any] = [slurm.SlurmExecutor, local.LocalExecutor, debug.DebugExecutor]
    envs: list[Any] = [slurm.SlurmJobEnvironment(), local.LocalJobEnvironment(), debug.DebugJobEnvironment(),
                       TsmJobEnvironment()]
    for entry in metadata.entry_points(group="submitit"):
        if entry.name not in ("executor", "job_environment"):
            logger.warning(f"ignoring entry point {entry.name} = {entry.value} (a submitit plugin declares executor or job_environment)")
            continue
        _load(entry, executors, envs)
    return executors, envs


@functools.lru_cache
def get_executors() -> Mapping[str, type[Executor]]:
    """``{name: executor class}``: slurm, local, debug and the plugins'."""
    return {ex.name(): ex for ex in _get_plugins()[0]}


@functools.lru_cache
def get_job_environments() -> Mapping[str, JobEnvironment]:
    """``{name: environment}``: slurm, local, debug, tsm and the plugins'."""
    return {env.name(): env for env in _get_plugins()[1]}


def get_job_environment() -> JobEnvironment:
    """The environment this process runs in (``_TEST_CLUSTER_`` names one); RuntimeError outside a job."""
    envs = get_job_environments()
    forced = os.environ.get("_TEST_CLUSTER_")
    if forced is not None:
        if forced not in envs:
            raise ValueError(f"$_TEST_CLUSTER_={forced!r} names no environment ({', '.join(envs)})")
        return envs[forced]
    for env in envs.values():
        if env.activated():
            return env
    raise RuntimeError(f"cannot tell which environment this job runs in (not inside a job?); the environments: "
                       f"{', '.join(envs)}")
