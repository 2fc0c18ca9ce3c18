"""submitit's documented examples, unchanged, under ``python -m tsm.submitit_alias``: locally and on the real
Slurm cluster (Kubernetes: test_functions_kubernetes.py).

The examples are the code blocks of submitit 1.5.4's README and docs, read from its sdist at test time
(:mod:`integration.submitit_docs`): the README's addition; the docs' explained addition followed by its job
array (four additions, at most two at a time: one Slurm job array on Slurm); the docs' ``JobEnvironment``
function in a job of several tasks; a ``helpers.Checkpointable`` as the checkpointing page describes it,
requeued from its checkpoint. What the test adds is said beside it: a line that prints what the example
computed, a driver where the docs leave one to the reader (their ``process()``, the multi-task job's
``results()``: the docs' ``job.result()`` on a job of six tasks is refused by submitit 1.5.4 itself), and on
Slurm ``SBATCH_PARTITION=debug``: the examples name partition ``dev``, which the test cluster does not have,
and sbatch lets that variable override a script's partition.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from integration.submitit_docs import blocks, doc, run_program

pytestmark = pytest.mark.integration

#: the cluster-specific environment of each run
ENV = {"local": {}, "slurm": {"SBATCH_PARTITION": "debug"}}

#: what the test prints after the docs' job array (the docs stop at the list of jobs)
PRINT_ARRAY = "\nprint('results', [j.result() for j in jobs])\n"

#: the driver of the docs' JobEnvironment function (the docs leave ``process`` and the submission to the reader)
MULTI_TASK_DRIVER = """
def process(chunk):
    return sum(chunk)

executor = submitit.AutoExecutor(folder="log_test")
executor.update_parameters(tasks_per_node={tasks}, nodes={nodes}, timeout_min=4)
job = executor.submit(my_func, list(range(12)))
print("results", job.results())
print("task 1", job.task(1).result())
"""

#: a Checkpointable as docs/checkpointing.md describes it: its state is the steps done; the minimal
#: example's checkpoint (inherited from helpers.Checkpointable) resubmits it as it is
CHECKPOINTABLE = """
import os
import time
import submitit


class Steps(submitit.helpers.Checkpointable):
    def __init__(self):
        self.done = 0
        self.attempts = []

    def __call__(self, total):
        self.attempts.append(int(os.environ.get("TSM_ATTEMPT", "0")))
        while self.done < total:
            time.sleep(0.2)
            self.done += 1
        return self.done, self.attempts


executor = submitit.AutoExecutor(folder="log_ckpt", slurm_max_num_timeout=3)
executor.update_parameters(timeout_min={timeout_min}, slurm_signal_delay_s=30)
job = executor.submit(Steps(), {total})
{interrupt}
print("result", job.result())
"""

#: on Slurm (a time limit is a minute there at least) the checkpointing page's way to test a checkpoint: a
#: fake preemption, once the job runs
INTERRUPT = """
while job.state != "RUNNING":
    time.sleep(1)
time.sleep(2)
job._interrupt()
"""


def _printed(out: str, tag: str) -> object:
    line = next(ln for ln in out.splitlines() if ln.startswith(tag + " "))
    return ast.literal_eval(line[len(tag) + 1:])


@pytest.fixture(params=["local", pytest.param("slurm", marks=pytest.mark.slurm)])
def cluster(request: pytest.FixtureRequest) -> str:
    if request.param == "slurm":
        request.getfixturevalue("slurm_cluster")
    return str(request.param)


def test_readme_addition(cluster: str, tmp_path: Path) -> None:
    code = blocks(doc("README.md"))[0]
    assert "executor.submit(add, 5, 7)" in code and "assert output == 12" in code
    run_program(code, tmp_path, cluster, **ENV[cluster])


def test_job_array(cluster: str, tmp_path: Path) -> None:
    page = doc("docs/examples.md")
    first, array = blocks(page)[0], blocks(page, "Job arrays")[0]
    assert "map_array(add, a, b)" in array and "slurm_array_parallelism=2" in array
    out = run_program(first + "\n" + array + PRINT_ARRAY, tmp_path, cluster, **ENV[cluster])
    assert _printed(out, "results") == [11, 22, 33, 44]


def test_job_environment_in_a_multi_task_job(cluster: str, tmp_path: Path) -> None:
    fn = next(b for b in blocks(doc("docs/examples.md"), "Multi-tasks jobs") if "JobEnvironment()" in b)
    tasks, nodes = (3, 1) if cluster == "local" else (2, 2)  # the local executor has one node, as submitit's
    out = run_program(fn + MULTI_TASK_DRIVER.format(tasks=tasks, nodes=nodes), tmp_path, cluster, **ENV[cluster])
    n = tasks * nodes
    chunk = -(-12 // n)
    # each task sums the chunk of its local rank, as the docs' function does
    expected = [sum(list(range(12))[(r % tasks) * chunk:(r % tasks + 1) * chunk]) for r in range(n)]
    assert _printed(out, "results") == expected
    assert _printed(out, "task 1") == expected[1]


def test_a_checkpointable_is_requeued_from_its_checkpoint(cluster: str, tmp_path: Path) -> None:
    local = cluster == "local"
    code = CHECKPOINTABLE.format(timeout_min="6 / 60" if local else 10, total=40 if local else 75,
                                 interrupt="" if local else INTERRUPT)
    out = run_program(code, tmp_path, cluster, **ENV[cluster])
    done, attempts = _printed(out, "result")
    assert done == (40 if local else 75)
    assert len(attempts) >= 2 and attempts[0] == 0 and attempts == sorted(attempts)  # resumed, not started over
