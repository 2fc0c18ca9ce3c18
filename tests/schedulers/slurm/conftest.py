"""Fixtures of the Slurm unit tests."""

from __future__ import annotations

import pytest
from slurm_util import no_slurm

from tsm.schedulers.slurm import SlurmQueries, SlurmScheduler


@pytest.fixture
def sched() -> SlurmScheduler:
    """A Slurm scheduler whose status batcher fails the test if it runs any Slurm command."""
    return SlurmScheduler("test", queries_=SlurmQueries(runner=no_slurm))
