"""Functions as jobs on the real Kubernetes cluster (scripts/k8s-up): every rank's result, an exception with
its remote traceback (both through the pods' output), and submitit's documented examples unchanged under the
alias with ``cluster="kubernetes"`` (``TSM_SUBMITIT_CLUSTER``; the image from ``TSM_SUBMITIT_IMAGE``; the
cluster's run options from a ``tsm.toml`` beside the program): the docs' explained addition followed by their
job array in one program, and their ``JobEnvironment`` function in a job of two tasks. Pods run the functions image
(:mod:`integration.functions_image`) with a tenth of their requests, as the other Kubernetes tests do.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

from tsm import get_runner
from tsm.functions import RemoteTraceback, environment

pytestmark = [pytest.mark.integration, pytest.mark.kubernetes]

WAIT = 600.0
CFG = {"request_fraction": 0.1, "gang_timeout": 300.0}
CONFIG = "[scheduler.kubernetes]\nrequest_fraction = 0.1\ngang_timeout = 300.0\n"


@pytest.fixture(scope="module")
def image(k8s_cluster: Any) -> str:
    from integration.functions_image import functions_image

    return functions_image(k8s_cluster.python_image)


def test_two_ranks_and_a_remote_traceback_on_kubernetes(image: str) -> None:
    def where(tag: str) -> tuple[str, int, int]:
        env = environment()
        return tag, env.rank, env.world_size

    def fails() -> None:
        raise KeyError("missing on purpose")

    with get_runner("fnit") as runner:
        job = runner.submit(where, "k8s", replicas=2, scheduler="kubernetes", image=image, cfg=CFG)
        bad = runner.submit(fails, scheduler="kubernetes", image=image, cfg=CFG)
        assert job.result(WAIT) == [("k8s", 0, 2), ("k8s", 1, 2)]
        with pytest.raises(KeyError, match="missing on purpose") as err:
            bad.result(WAIT)
        assert isinstance(err.value.__cause__, RemoteTraceback) and "in fails" in err.value.__cause__.text
        for j in (job, bad):
            runner.delete(j.handle)


def test_submitit_examples_on_kubernetes(image: str, tmp_path: Path) -> None:
    from integration.submitit_docs import blocks, doc, run_program
    from integration.test_submitit_examples import MULTI_TASK_DRIVER, PRINT_ARRAY

    (tmp_path / "tsm.toml").write_text(CONFIG)
    env = {"TSM_SUBMITIT_IMAGE": image}
    page = doc("docs/examples.md")  # its first block is the README's addition, explained: run once, with the array
    out = run_program(blocks(page)[0] + "\n" + blocks(page, "Job arrays")[0] + PRINT_ARRAY, tmp_path, "kubernetes",
                      **env)
    assert "results [11, 22, 33, 44]" in out
    fn = next(b for b in blocks(page, "Multi-tasks jobs") if "JobEnvironment()" in b)
    out = run_program(fn + MULTI_TASK_DRIVER.format(tasks=2, nodes=1), tmp_path, "kubernetes", **env)
    line = next(ln for ln in out.splitlines() if ln.startswith("results "))
    assert ast.literal_eval(line[len("results "):]) == [sum(range(6)), sum(range(6, 12))]
