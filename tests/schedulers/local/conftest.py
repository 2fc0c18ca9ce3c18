"""Fixtures the local scheduler's tests share."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tsm.schedulers.local.scheduler import LocalScheduler


@pytest.fixture
def sched() -> Iterator[LocalScheduler]:
    """A local scheduler on the test's own ``$TSM_HOME``, closed afterwards."""
    s = LocalScheduler("test")
    yield s
    s.close()
