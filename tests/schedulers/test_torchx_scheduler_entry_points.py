"""Scheduler plugins registered under TorchX's entry-point group are found after tsm's own group."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

import tsm.schedulers as registry

PLUGIN = """
def create_scheduler(session_name, **kwargs):
    return ("{tag}", session_name, kwargs)
"""


def install(root: Path, dist: str, group: str, name: str, tag: str) -> str:
    module = f"plugin_{uuid.uuid4().hex[:8]}"
    (root / f"{module}.py").write_text(PLUGIN.format(tag=tag))
    info = root / f"{dist}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[{group}]\n{name} = {module}:create_scheduler\n")
    return module


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "_plugins", None)
    return tmp_path


def test_a_torchx_scheduler_plugin_is_found(site: Path) -> None:
    install(site, "torchx_sched", "torchx.schedulers", "mycluster", "torchx-group")
    assert "mycluster" in registry.scheduler_names()
    assert registry.get_scheduler("mycluster", "s", x=1) == ("torchx-group", "s", {"x": 1})


def test_tsms_group_wins_a_name_both_give_and_builtins_win_over_both(site: Path) -> None:
    install(site, "torchx_sched", "torchx.schedulers", "shared", "torchx-group")
    install(site, "tsm_sched", "tsm.schedulers", "shared", "tsm-group")
    install(site, "torchx_local", "torchx.schedulers", "local", "torchx-local")
    assert registry.get_scheduler_factory("shared")("s") == ("tsm-group", "s", {})
    assert registry.get_scheduler_factory("local").__module__ == "tsm.schedulers.local"
    assert registry.scheduler_names().count("shared") == 1
