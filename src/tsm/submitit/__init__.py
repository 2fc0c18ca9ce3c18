"""submitit's public API on tsm: ``AutoExecutor(folder, cluster=...)`` on Slurm, locally, or any tsm scheduler.

::

    import tsm.submitit as submitit        # or, unchanged: python -m tsm.submitit_alias program.py

    executor = submitit.AutoExecutor(folder="log_test", cluster="kubernetes")
    executor.update_parameters(timeout_min=1, kubernetes_image="my/python:3.11")
    job = executor.submit(add, 5, 7)
    assert job.result() == 12

The names and modules are submitit 1.5.4's (``submitit.core.core``, ``submitit.helpers``, ...), so code and
plugins written for submitit import them unchanged. Jobs run as :mod:`tsm.functions` jobs: detached apps of
the chosen scheduler, whose results come back whatever the cluster (the folder keeps submitit's files too).
What is the same, extended or different, name by name: ``docs/submitit.md``.
"""

from __future__ import annotations

from tsm.submitit import helpers as helpers
from tsm.submitit.auto.auto import AutoExecutor as AutoExecutor
from tsm.submitit.core.core import Executor as Executor, Job as Job
from tsm.submitit.core.job_environment import JobEnvironment as JobEnvironment
from tsm.submitit.local.debug import DebugExecutor as DebugExecutor, DebugJob as DebugJob
from tsm.submitit.local.local import LocalExecutor as LocalExecutor, LocalJob as LocalJob
from tsm.submitit.slurm.slurm import SlurmExecutor as SlurmExecutor, SlurmJob as SlurmJob

#: the submitit release whose API this face keeps
__version__ = "1.5.4"
