"""``tsm.compat.torchx.plugins`` (TorchX's nightly ``torchx.plugins``): namespace-package plugins, found lazily, errors recorded."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tsm.compat.torchx import plugins


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("TORCHX_PLUGINS_SOURCE", raising=False)
    yield tmp_path
    for name in [n for n in sys.modules if n.startswith("torchx_plugins")]:
        del sys.modules[name]
    plugins.registry.cache_clear()


def _write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_namespace_plugins_are_found_on_first_use_and_broken_ones_recorded(site: Path) -> None:
    _write(site, "torchx_plugins/schedulers/good.py",
           "from tsm.compat.torchx.plugins import register\n\n@register.scheduler()\ndef good(session_name, **kw):\n    return 'good'\n\n"
           "@register.scheduler(name='renamed')\ndef other(session_name, **kw):\n    return 'other'\n")
    _write(site, "torchx_plugins/schedulers/broken.py", "import no_such_dependency_here\n")
    _write(site, "torchx_plugins/schedulers/wrong.py",
           "from tsm.compat.torchx.plugins import register\n\n@register.tracker()\ndef t():\n    return None\n")
    _write(site, "torchx_plugins/schedulers/nested/deeper.py",
           "from tsm.compat.torchx.plugins import register\n\n@register.scheduler()\ndef deep(session_name):\n    return 'deep'\n")
    reg = plugins.PluginRegistry(plugin_sources=plugins.PluginSource.NAMESPACE_PKG)
    assert "torchx_plugins.schedulers.broken" not in sys.modules  # nothing imported before it is asked for
    assert reg.errors == []
    found = reg.get(plugins.PluginType.SCHEDULER)
    assert sorted(found) == ["deep", "good", "renamed"] and found["good"]("s") == "good"
    errors = reg.load_errors(plugins.PluginType.SCHEDULER)
    by_module = {e.module: e for e in errors}
    assert "ModuleNotFoundError" in by_module["torchx_plugins.schedulers.broken"].error
    wrong = by_module["torchx_plugins.schedulers.wrong"]
    assert wrong.name == "t" and wrong.plugin_type == "tracker" and "torchx_plugins.tracker" in wrong.error
    assert reg.load_errors(plugins.PluginType.TRACKER) == [wrong]  # tagged with the type it really is
    text = str(reg)
    assert "schedulers" not in text.splitlines()[0] and "scheduler:" in text and "errors:" in text


def test_no_namespace_installed_is_an_empty_registry_not_an_error(site: Path) -> None:
    reg = plugins.PluginRegistry(plugin_sources=plugins.PluginSource.NAMESPACE_PKG)
    assert reg.get(plugins.PluginType.NAMED_RESOURCE) == {} and reg.load_errors() == []


def test_registry_is_cached_and_reads_the_channel_variable(site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert plugins.registry() is plugins.registry()
    plugins.registry().clear()
    monkeypatch.setenv("TORCHX_PLUGINS_SOURCE", "0")
    assert plugins.registry().get(plugins.PluginType.SCHEDULER) == {}
    plugins.registry.cache_clear()
    monkeypatch.setenv("TORCHX_PLUGINS_SOURCE", "9")
    with pytest.raises(ValueError, match="TORCHX_PLUGINS_SOURCE"):
        plugins.registry()
