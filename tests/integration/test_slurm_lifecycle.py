"""Long runs on the real Slurm cluster (issue 25): a short time limit warns every task before the end.

``time_limit=1m`` with ``warn_before=45s``: Slurm sends USR1 to the batch shell (``--signal=B:USR1@45``)
between 15 and 45 s in (its controller checks limits every 30 s), the batch shell forwards it to every task
of the job, each task's ``tsm.lifecycle.on_warning`` handler writes a line, and at the limit Slurm ends the
job (TIMEOUT). Asserted from what the tasks wrote and the recorded states; takes one to two minutes.
"""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest

from tsm.schedulers.api import Stream
from tsm.schedulers.slurm import SlurmScheduler, create_scheduler
from tsm.specs.api import AppDef, AppState, Resource, Role

from .conftest import SlurmCluster

pytestmark = [pytest.mark.integration, pytest.mark.slurm]

WARNED = textwrap.dedent(
    """\
    import os, sys, time
    import tsm.lifecycle as lc
    lc.on_warning(lambda: print("warned", os.environ["TSM_REPLICA_ID"], flush=True))
    print("ready", lc.attempt(), lc.restart_count(), repr(lc.last_exit()), os.environ.get("TSM_WARN_SIGNAL"),
          flush=True)
    while True:
        time.sleep(0.5)
    """
)


@pytest.fixture(autouse=True)
def cluster(slurm_cluster: SlurmCluster, monkeypatch: pytest.MonkeyPatch) -> SlurmCluster:
    """The cluster, with this venv's python first on PATH: jobs carry the submitter's PATH."""
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    return slurm_cluster


def test_time_limit_warns_every_task_before_the_end() -> None:
    sched: SlurmScheduler = create_scheduler("it")
    app = AppDef("tlimit", [Role("w", entrypoint=sys.executable, args=["-c", WARNED], num_replicas=2,
                                 resource=Resource(cpu=1, memMB=200))])  # fmt: skip
    app_id = sched.submit(app, {"time_limit": "1m", "warn_signal": "USR1", "warn_before": "45s",
                                "max_preemptions": 0})  # fmt: skip
    try:
        desc = sched.wait(app_id, timeout=240)
    finally:
        sched.cancel(app_id)
    assert desc is not None and desc.state == AppState.FAILED, desc
    assert desc.msg.startswith("TIMEOUT"), desc.msg
    for k in (0, 1):
        lines = list(sched.log_iter(app_id, "w", k, streams=Stream.STDOUT))
        assert lines[0] == "ready 0 0 None USR1\n", lines
        assert lines.count(f"warned {k}\n") == 1, lines  # the warning came once, before Slurm ended the job
