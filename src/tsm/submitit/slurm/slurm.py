"""submitit's ``slurm.slurm``: jobs on a Slurm cluster, through tsm's Slurm scheduler.

``SlurmExecutor(folder)`` takes submitit's Slurm parameters (sbatch's names: ``partition``, ``time`` in
minutes, ``nodes``, ``ntasks_per_node``, ``cpus_per_task``, ``gpus_per_node``, ``mem``, ``qos``,
``account``, ``constraint``, ``exclude``, ``nodelist``, ``comment``, ``mail_type``, ``mail_user``,
``exclusive``, ``setup``, ``teardown``, ``signal_delay_s``, ``array_parallelism``, ``srun_args``,
``additional_parameters``, ...) and submits with tsm's Slurm scheduler (:mod:`tsm.schedulers.slurm`): a
job of ``nodes * ntasks_per_node`` tasks; an array a Slurm job array ``--array=0-(N-1)%array_parallelism``.
The time limit warns the tasks with USR2 ``signal_delay_s`` before it (tsm's ``warn_signal`` and
``warn_before``), a checkpointable callable is requeued at the limit, and a preemption requeues the job
(both spend ``max_num_timeout``, tsm's ``max_preemptions``). The script tsm submits is its dry run (``tsm
dryrun``), not submitit's: parameters with no tsm option of their own go to sbatch as options
(``gres``, ``cpus_per_gpu``, ``mem_per_gpu``, ``dependency``, ``wckey``, ``additional_parameters``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import Any

from tsm.submitit.core import core, job_environment, logger
from tsm.submitit.executor import TsmExecutor, resource_of, warn_ignored
from tsm.submitit.tsmjob import Plan, TsmJob

#: submitit's Slurm parameters and their defaults (what ``update_parameters`` accepts)
_DEFAULTS: dict[str, Any] = {
    "job_name": "submitit", "partition": None, "time": 5, "nodes": 1, "ntasks_per_node": None,
    "cpus_per_task": None, "cpus_per_gpu": None, "num_gpus": None, "gpus_per_node": None, "gpus_per_task": None,
    "qos": None, "setup": None, "teardown": None, "mem": None, "mem_per_gpu": None, "mem_per_cpu": None,
    "signal_delay_s": 90, "comment": None, "constraint": None, "exclude": None, "account": None, "gres": None,
    "mail_type": None, "mail_user": None, "nodelist": None, "dependency": None, "exclusive": None,
    "array_parallelism": 256, "wckey": "submitit", "stderr_to_stdout": False, "additional_parameters": None,
    "srun_args": None, "use_srun": True,
}
#: parameters that are tsm Slurm run options of the same name
_SAME = ("partition", "qos", "account", "constraint", "exclude", "nodelist", "comment", "mail_type", "mail_user")
#: parameters that go to sbatch as options
_SBATCH = ("cpus_per_gpu", "gpus_per_task", "mem_per_gpu", "mem_per_cpu", "gres", "dependency", "wckey")


def _get_default_parameters() -> dict[str, Any]:
    """submitit's Slurm parameters and their defaults."""
    return dict(_DEFAULTS)


def _convert_mem(mem_gb: float) -> str:
    """``2`` -> ``2GB``, ``3.5`` -> ``3584MB`` (sbatch's --mem)."""
    return f"{int(mem_gb)}GB" if mem_gb == int(mem_gb) else f"{int(mem_gb * 1024)}MB"


def _mem_mb(mem: str) -> int:
    units = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024**2}
    text = str(mem).upper().removesuffix("B")
    unit = text[-1] if text and text[-1] in units else "M"
    return int(float(text.rstrip("KMGT")) * units[unit])


class SlurmParseException(Exception):
    """``SLURM_JOB_NODELIST`` is not in a form this parser knows."""


def _expand(suffixes: str) -> list[str]:
    out = []
    for part in suffixes.split(","):
        low, dash, high = part.partition("-")
        if dash:
            out += [f"{n:0{len(low)}d}" for n in range(int(low), int(high) + 1)]
        else:
            out.append(part)
    return out


def _parse_node_list(text: str) -> list[str]:
    """``node[1-3,5],gpu7`` -> ``[node1, node2, node3, node5, gpu7]`` (Slurm's host list form)."""
    try:
        hosts: list[str] = []
        pos = 0
        while pos < len(text):
            prefixes, group_done = [""], False
            while pos < len(text) and not group_done:
                c = text[pos]
                if c == ",":
                    group_done = True
                elif c == "[":
                    end = text.index("]", pos)
                    prefixes = [p + s for p in prefixes for s in _expand(text[pos + 1:end])]
                    pos = end
                else:
                    prefixes = [p + c for p in prefixes]
                pos += 1
            hosts += prefixes
        return hosts
    except ValueError as e:
        raise SlurmParseException(f"SLURM_JOB_NODELIST={text!r} is not a host list this parser reads (prefix[1-3,5],...)", e) from e


class SlurmJobEnvironment(job_environment.JobEnvironment):
    _env = {
        "job_id": "SLURM_JOB_ID", "num_tasks": "SLURM_NTASKS", "num_nodes": "SLURM_JOB_NUM_NODES",
        "node": "SLURM_NODEID", "nodes": "SLURM_JOB_NODELIST", "global_rank": "SLURM_PROCID",
        "local_rank": "SLURM_LOCALID", "array_job_id": "SLURM_ARRAY_JOB_ID", "array_task_id": "SLURM_ARRAY_TASK_ID",
    }

    def _requeue(self, countdown: int) -> None:
        subprocess.check_call(["scontrol", "requeue", self.job_id], timeout=60)
        logger.get_logger().info(f"job {self.job_id} requeued ({countdown} remaining timeouts)")

    @property
    def hostnames(self) -> list[str]:
        """The job's hosts, from ``SLURM_JOB_NODELIST`` (this host when it is not set)."""
        nodes = os.environ.get(self._env["nodes"], "")
        return _parse_node_list(nodes) if nodes else [self.hostname]


class SlurmJob(TsmJob[core.R]):
    scheduler = "slurm"

    def _interrupt(self, timeout: bool = False) -> None:
        """Warn the job as a time limit or a preemption would (for testing a checkpoint), then requeue it once
        its first task kept its checkpoint (at most a minute later): the next attempt starts from there."""
        import time

        from tsm.functions import files

        subprocess.check_call(["scancel", "--batch", f"--signal={SlurmJobEnvironment.USR_SIG}", self.job_id])
        folder = self._job().spec.worker.checkpoint_dir
        if folder:
            kept, pause, deadline = files.checkpoint_path(folder, 0), 0.05, time.monotonic() + 60
            while not kept.exists() and time.monotonic() < deadline:
                time.sleep(pause)  # the task writes it in its signal handler: no event reaches this process
                pause = min(pause * 2, 1.0)
        subprocess.check_call(["scontrol", "requeue", self.job_id])


class SlurmExecutor(TsmExecutor):
    """Runs jobs on Slurm through tsm (see the module doc)."""

    job_class = SlurmJob
    scheduler = "slurm"
    env_name = "slurm"

    def __init__(self, folder: Any, max_num_timeout: int = 3, max_pickle_size_gb: float = 1.0,
                 python: str | None = None) -> None:
        super().__init__(folder, max_num_timeout=max_num_timeout, max_pickle_size_gb=max_pickle_size_gb, python=python)
        if not self.affinity() > 0:
            raise RuntimeError("no srun on this machine's PATH: SlurmExecutor needs a Slurm client (or pick another cluster)")

    @classmethod
    def name(cls) -> str:
        return "slurm"

    @classmethod
    def _equivalence_dict(cls) -> core.EquivalenceDict:
        return {"name": "job_name", "timeout_min": "time", "mem_gb": "mem", "nodes": "nodes",
                "cpus_per_task": "cpus_per_task", "gpus_per_node": "gpus_per_node", "tasks_per_node": "ntasks_per_node"}

    @classmethod
    def _valid_parameters(cls) -> set[str]:
        return set(_DEFAULTS)

    def _convert_parameters(self, params: dict[str, Any]) -> dict[str, Any]:
        params = super()._convert_parameters(params)
        if "mem" in params:
            params["mem"] = _convert_mem(params["mem"])
        return params

    def _internal_update_parameters(self, **kwargs: Any) -> None:
        unknown = sorted(set(kwargs) - set(_DEFAULTS))
        if unknown:
            listing = "\n  - ".join(f"{k} (default: {v!r})" for k, v in sorted(_DEFAULTS.items()))
            raise ValueError(f"unknown Slurm parameter(s) {unknown}; the parameters and their defaults:\n  - {listing}")
        self.parameters.update(kwargs)

    def _tasks(self) -> tuple[int, int]:
        per = max(1, int(self.parameters.get("ntasks_per_node") or 1))
        return int(self.parameters.get("nodes") or 1) * per, per

    def _plan(self, checkpointable: bool) -> Plan:
        from tsm.submitit.tsmjob import default_image, lifecycle

        p = {**_DEFAULTS, **self.parameters}
        replicas, per = self._tasks()
        mem = p.get("mem")
        resource = resource_of({"cpus_per_task": p["cpus_per_task"], "gpus_per_node": p["gpus_per_node"] or p["num_gpus"],
                                "mem_gb": _mem_mb(mem) / 1024 if mem else None}, per)
        cfg: dict[str, Any] = {k: p[k] for k in _SAME if p.get(k) is not None}
        sbatch = [f"--{k.replace('_', '-')}={p[k]}" for k in _SBATCH if p.get(k) is not None]
        sbatch += [f"--{k.replace('_', '-')}={v}" for k, v in (p.get("additional_parameters") or {}).items()]
        if isinstance(p.get("exclusive"), str):
            sbatch.append(f"--exclusive={p['exclusive']}")
        elif p.get("exclusive"):
            cfg["exclusive"] = True
        if per > 1:
            cfg["pack_replicas"] = True
            sbatch += [f"--nodes={p['nodes']}", f"--ntasks-per-node={per}"]
        if sbatch:
            cfg["sbatch_args"] = sbatch
        if p.get("srun_args"):
            cfg["srun_args"] = list(p["srun_args"])
        if not p.get("use_srun", True):
            warn_ignored("use_srun", False, "tsm always starts the tasks with srun")
        cfg.update(lifecycle(float(p["time"]), float(p["signal_delay_s"]), checkpointable, self.max_num_timeout))
        if self.python:
            cfg["python"] = self.python
        opts: dict[str, Any] = {"replicas": replicas, "tasks_per_node": per if per > 1 else None, "resource": resource,
                                "name": p["job_name"], "image": default_image() or None, "setup": list(p.get("setup") or ()),
                                "teardown": list(p.get("teardown") or ()), "env": {}}
        return Plan(opts, cfg, int(p["array_parallelism"]), bool(p.get("stderr_to_stdout")), float(p["time"]))

    @classmethod
    def affinity(cls) -> int:
        return -1 if shutil.which("srun") is None else 2
