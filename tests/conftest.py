"""Shared test setup: every test gets its own ``$TSM_HOME`` so state never leaks between tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def tsm_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh, private ``$TSM_HOME`` for the test (also seen by processes the test starts)."""
    home = tmp_path_factory.mktemp("tsm_home")
    monkeypatch.setenv("TSM_HOME", str(home))
    return home


@pytest.fixture
def in_ci() -> bool:
    """True under CI (``CI=true``), where integration tests must run rather than skip."""
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Under CI, tests that need torch must run: a missing torch is a failed setup, not a skip."""
    if item.get_closest_marker("torch") is None:
        return
    try:
        import torch  # noqa: F401
    except ImportError:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail("torch is not installed but CI must run the torch tests: make test installs torch==2.13.0")
        pytest.skip("needs torch==2.13.0 (make test installs it)")
