"""tsm.submitit's own behaviours, where it extends or differs from submitit 1.5.4 (submitit's own tests, run by
test_submitit_upstream.py, check what is the same): any tsm scheduler as a cluster, the cluster from the environment,
Slurm's parameters as tsm's options, a job found again from its folder and id, jobs that travel by pickle."""

from __future__ import annotations

import pickle
import shutil
from pathlib import Path

import pytest

import tsm.submitit as submitit
from tsm.submitit.auto.auto import CLUSTER_ENV
from tsm.submitit.core.utils import FailedJobError

WAIT = 120


def add(a: int, b: int) -> int:
    return a + b


def fail() -> None:
    raise RuntimeError("Failed on purpose")


def test_any_tsm_scheduler_is_a_cluster_and_its_run_options_are_parameters(tmp_path: Path) -> None:
    ex = submitit.AutoExecutor(tmp_path, cluster="docker")
    assert ex.cluster == "docker" and type(ex._executor).__name__ == "DockerExecutor"
    ex.update_parameters(docker_image="img:1", timeout_min=3, slurm_partition="ignored-here", docker_grace_period=2)
    assert ex._executor.parameters == {"image": "img:1", "timeout_min": 3, "grace_period": 2}
    with pytest.raises(NameError, match="executor 'docker' has no parameter 'bogus'"):
        ex.update_parameters(docker_bogus=1)


def test_the_cluster_comes_from_the_environment_when_not_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CLUSTER_ENV, "local")
    assert submitit.AutoExecutor(tmp_path).cluster == "local"
    monkeypatch.setenv(CLUSTER_ENV, "kubernetes")
    assert submitit.AutoExecutor(tmp_path).cluster == "kubernetes"
    monkeypatch.setenv(CLUSTER_ENV, "no-such-cluster")
    with pytest.raises(ValueError, match="no executor named no-such-cluster"):
        submitit.AutoExecutor(tmp_path)


def test_slurm_parameters_become_tsm_options(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: "/usr/bin/srun" if name == "srun" else None)
    ex = submitit.AutoExecutor(tmp_path, cluster="slurm")
    ex.update_parameters(timeout_min=30, mem_gb=8, tasks_per_node=2, nodes=2, cpus_per_task=3, gpus_per_node=4,
                         slurm_partition="gpu", slurm_additional_parameters={"mem_per_gpu": 12}, slurm_gres="gpu:4")
    plan = ex._executor._plan(checkpointable=True)
    assert plan.options["replicas"] == 4 and plan.options["tasks_per_node"] == 2
    res = plan.options["resource"]
    assert (res.cpu, res.gpu, res.memMB) == (3, 2, 4096)  # per task: a node's GPUs and memory over its tasks
    assert plan.cfg["partition"] == "gpu" and plan.cfg["pack_replicas"] is True
    assert {"--gres=gpu:4", "--mem-per-gpu=12", "--nodes=2", "--ntasks-per-node=2"} <= set(plan.cfg["sbatch_args"])
    assert plan.cfg["time_limit"] == "1800s" and plan.cfg["warn_signal"] == "USR2" and plan.cfg["warn_before"] == "90s"
    assert plan.cfg["requeue_on_time_limit"] is True and plan.cfg["max_preemptions"] == 3


def test_a_job_found_again_from_its_folder_and_id_and_by_pickle(tmp_path: Path) -> None:
    ex = submitit.LocalExecutor(tmp_path)
    job = ex.submit(add, 2, 3)
    assert job.result() == 5
    again = submitit.LocalJob(tmp_path, job.job_id)
    assert again.result() == 5 and again.submission().args == (2, 3)
    assert pickle.loads(pickle.dumps(job)).result() == 5
    assert (tmp_path / f"{job.job_id}_0_result.pkl").exists()  # submitit's file, written once the job ended


def test_a_failed_job_is_a_failed_job_error_with_the_remote_traceback(tmp_path: Path) -> None:
    job = submitit.AutoExecutor(tmp_path, cluster="local").submit(fail)
    err = job.exception()
    assert isinstance(err, FailedJobError)
    assert "Traceback" in str(err) and "Failed on purpose" in str(err) and "in fail" in str(err)
    with pytest.raises(FailedJobError):
        job.result()
    assert job.state == "FINISHED"
