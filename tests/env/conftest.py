"""Fixtures of the environment tests: a wheelhouse with two versions of the demo package, and its locks."""

from __future__ import annotations

from pathlib import Path

import pytest

from envkit import make_wheel, uv_lock


@pytest.fixture(scope="session")
def wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheelhouse")
    make_wheel(out, "1.0")
    make_wheel(out, "2.0")
    return out


@pytest.fixture
def lock(tmp_path: Path, wheelhouse: Path) -> Path:
    """A uv.lock (with its pyproject.toml) pinning the demo package at 1.0."""
    return uv_lock(tmp_path / "proj", wheelhouse, "tsmenvdemo==1.0")
