"""TorchX's ``torchx.schedulers``: TorchX's scheduler names, default and plugin rule, on tsm's backends.

tsm's own registry (:mod:`tsm.schedulers`) defaults to its ``local`` scheduler, keeps ``local_cwd`` as an
alias of it and adds plugins to the builtins. TorchX's, here, is what TorchX code expects:

==================  ========================================================================================
``local_docker``    tsm's Docker scheduler (the default: the first name)
``local_cwd``       TorchX's in-process scheduler (:mod:`tsm.compat.torchx.schedulers.local_scheduler`)
``slurm``           tsm's Slurm scheduler
``kubernetes``      tsm's Kubernetes scheduler
``ray``             tsm's Ray scheduler
==================  ========================================================================================

When any ``torchx.schedulers`` entry point is registered, those *replace* the defaults, as in TorchX.
Each factory imports its backend only when called.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from tsm.compat.torchx.util.entrypoints import load_group
from tsm.schedulers._factory import SchedulerFactory
from tsm.schedulers.api import Scheduler

__all__ = ["DEFAULT_SCHEDULER_MODULES", "Scheduler", "SchedulerFactory", "get_default_scheduler_name",
           "get_scheduler_factories", "load_group"]

#: TorchX's scheduler names -> the module whose ``create_scheduler`` makes it.
DEFAULT_SCHEDULER_MODULES: Mapping[str, str] = {
    "local_docker": "tsm.compat.torchx.schedulers.docker_scheduler",
    "local_cwd": "tsm.compat.torchx.schedulers.local_scheduler",
    "slurm": "tsm.compat.torchx.schedulers.slurm_scheduler",
    "kubernetes": "tsm.compat.torchx.schedulers.kubernetes_scheduler",
    "ray": "tsm.schedulers.ray",
}


def _deferred(module: str) -> SchedulerFactory:
    def create(*args: Any, **kwargs: Any) -> Scheduler[Any]:
        factory: SchedulerFactory = importlib.import_module(module).create_scheduler
        return factory(*args, **kwargs)

    return create


def get_scheduler_factories() -> dict[str, SchedulerFactory]:
    """``{name: factory}``: the ``torchx.schedulers`` entry points if any, else TorchX's defaults (above)."""
    defaults = {name: _deferred(module) for name, module in DEFAULT_SCHEDULER_MODULES.items()}
    found: dict[str, SchedulerFactory] = load_group("torchx.schedulers", default=defaults)
    return found


def get_default_scheduler_name() -> str:
    """The first name of :func:`get_scheduler_factories` (``local_docker`` unless plugins replace them)."""
    return next(iter(get_scheduler_factories()))
