"""submitit's ``auto.auto``: ``AutoExecutor(folder, cluster=...)``, one interface over every executor.

``cluster`` is submitit's (``slurm``, ``local``, ``debug``, a plugin's) or any tsm scheduler's name
(``kubernetes``, ``docker``, ``ray``, ...: :class:`tsm.submitit.executor.TsmExecutor`); without it, the
cluster ``$TSM_SUBMITIT_CLUSTER`` names, else submitit's choice (Slurm when ``srun`` is here, else local).
Parameters work as in submitit: the generic ones (``timeout_min``, ``mem_gb``, ``nodes``, ``cpus_per_task``,
``gpus_per_node``, ``tasks_per_node``, ``name``, ``stderr_to_stdout``) apply on every cluster; a cluster's own
are prefixed by its name (``slurm_partition``, ``local_setup``, ``kubernetes_image``,
``kubernetes_namespace``) and ignored on the others; a prefixed generic (``slurm_timeout_min``) wins on its
cluster. An unknown one raises ``NameError`` naming every mistake; a generic of the wrong type, an
``AssertionError``.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tsm.submitit.core import plugins
from tsm.submitit.core.core import Executor, Job
from tsm.submitit.core.utils import DelayedSubmission

#: the variable that names the cluster when ``cluster=`` is not given
CLUSTER_ENV = "TSM_SUBMITIT_CLUSTER"


def _convert_deprecated_args(kwargs: dict[str, Any], deprecated: Mapping[str, str]) -> None:
    for arg in list(kwargs):
        new = deprecated.get(arg)
        if new:
            kwargs[new] = kwargs.pop(arg)
            warnings.warn(f"'{arg}' is an old name: use '{new}'", stacklevel=4)


def _executors(cluster: str | None = None) -> dict[str, type[Executor]]:
    """submitit's executors (and its plugins'), then ``cluster`` as a tsm scheduler when it is one of those."""
    found: dict[str, type[Executor]] = dict(plugins.get_executors())
    if cluster and cluster not in found:
        from tsm.schedulers import scheduler_names
        from tsm.submitit.executor import tsm_executor

        if cluster in scheduler_names():
            found[cluster] = tsm_executor(cluster)
    return found


def _known_prefixes() -> set[str]:
    from tsm.schedulers import scheduler_names

    return set(plugins.get_executors()) | set(scheduler_names())


class AutoExecutor(Executor):
    """The executor of ``cluster`` with submitit's shared parameters (see the module doc)."""

    _ctor_deprecated_args = {"max_num_timeout": "slurm_max_num_timeout", "conda_file": "chronos_conda_file"}

    def __init__(self, folder: str | Path, cluster: str | None = None, **kwargs: Any) -> None:
        self.cluster = cluster or os.environ.get(CLUSTER_ENV) or self.which()
        executors = _executors(self.cluster)
        if self.cluster not in executors:
            raise ValueError(f"no executor named {self.cluster}: give a submitit cluster (slurm, local, debug) or a tsm scheduler")
        _convert_deprecated_args(kwargs, self._ctor_deprecated_args)
        known = _known_prefixes() | set(executors)
        for name in kwargs:
            if "_" not in name or name.split("_")[0] not in known:
                raise AssertionError(f"argument '{name}' names no executor: prefix it with one ({', '.join(sorted(known))})")
        prefix = self.cluster + "_"
        self._executor = executors[self.cluster](folder, **{k[len(prefix):]: v for k, v in kwargs.items()
                                                           if k.startswith(prefix)})
        valid = self._valid_parameters()
        self._deprecated_args = {arg: f"{name}_{arg}" for name, ex in executors.items()
                                 for arg in ex._valid_parameters() if arg not in valid}
        super().__init__(self._executor.folder, self._executor.parameters)

    @staticmethod
    def which() -> str:
        """The cluster submitit would pick here: the executor of highest affinity (Slurm when ``srun`` is here)."""
        executors = plugins.get_executors()
        best = max(executors, key=lambda name: executors[name].affinity())
        if executors[best].affinity() <= 0:
            raise RuntimeError(f"none of the executors {list(executors)} is available here")
        return best

    def register_dev_folders(self, folders: list[str | Path]) -> None:
        """submitit's internal-cluster feature; here a warning (use ``workspace`` to ship a folder)."""
        warnings.warn("register_dev_folders is ignored: ship a folder with the workspace parameter instead",
                      stacklevel=2)

    @classmethod
    def _typed_parameters(cls) -> dict[str, type]:
        return {"name": str, "timeout_min": int, "mem_gb": float, "nodes": int, "cpus_per_task": int,
                "gpus_per_node": int, "tasks_per_node": int, "stderr_to_stdout": bool}

    @classmethod
    def _valid_parameters(cls) -> set[str]:
        return set(cls._typed_parameters())

    def _check_types(self, kwargs: Mapping[str, Any]) -> None:
        for name, expected in self._typed_parameters().items():
            # mem_gb takes an int as submitit does; timeout_min a float too (submitit takes int only)
            allowed: type | tuple[type, ...] = (int, float) if name in ("mem_gb", "timeout_min") else expected
            if name in kwargs and not isinstance(kwargs[name], allowed):
                raise AssertionError(f'Parameter "{name}" expected type {expected} (but value: "{kwargs[name]}")')

    def _problems(self, specific: list[list[str]], executors: Mapping[str, type[Executor]]) -> list[str]:
        generics = self._typed_parameters()
        invalid = []
        for parts in specific:
            if len(parts) != 2:
                invalid.append(f"'{parts[0]}' needs an executor's name before it (slurm_..., local_...)")
                continue
            ex, arg = parts
            if ex not in executors:
                invalid.append(f"'{ex}_{arg}': no executor is named '{ex}'")
                continue
            valid = executors[ex]._valid_parameters()
            if arg not in valid and arg not in generics:
                invalid.append(f"'{ex}_{arg}': executor '{ex}' has no parameter '{arg}' (it has: "
                               f"{', '.join(sorted(valid))})")
        if invalid:
            invalid += [f"executors: {', '.join(executors)}; parameters every executor takes, unprefixed: "
                        f"{', '.join(generics)}"]
        return invalid

    def _internal_update_parameters(self, **kwargs: Any) -> None:
        kwargs = {k: v for k, v in kwargs.items() if v is not None}
        self._check_types(kwargs)
        _convert_deprecated_args(kwargs, self._deprecated_args)
        generics = self._typed_parameters()
        specific = [k.split("_", 1) for k in kwargs if k not in generics]
        executors = _executors(self.cluster)
        from tsm.schedulers import scheduler_names

        for parts in specific:  # a tsm scheduler named in a parameter is an executor too (its options are checked)
            if len(parts) == 2 and parts[0] not in executors and parts[0] in scheduler_names():
                executors.update(_executors(parts[0]))
        invalid = self._problems(specific, executors)
        if invalid:
            raise NameError("\n".join(invalid))
        kwargs.update({arg: kwargs.pop(f"{ex}_{arg}") for ex, arg in specific
                       if ex == self.cluster and arg in generics})
        parameters = self._executor._convert_parameters({k: v for k, v in kwargs.items() if k in generics})
        for ex, arg in specific:
            if ex == self.cluster and arg not in generics:
                parameters[arg] = kwargs[f"{ex}_{arg}"]
        self._executor._internal_update_parameters(**parameters)

    def _internal_process_submissions(self, delayed_submissions: list[DelayedSubmission]) -> list[Job[Any]]:
        return self._executor._internal_process_submissions(delayed_submissions)
