"""The fake cluster every Kubernetes fast test runs against, one per test (closed after it)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from schedulers.kubernetes.fake_kube import FakeCluster


@pytest.fixture
def cluster() -> Iterator[FakeCluster]:
    c = FakeCluster()
    yield c
    c.close()
