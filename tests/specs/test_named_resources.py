"""Tests for tsm.specs.named_resources: builtins and the ``tsm.named_resources`` entry-point group.

Plugins are real: each test writes a ``*.dist-info`` directory (METADATA + entry_points.txt) and the
module it points at into a temporary directory on ``sys.path``, and importlib.metadata finds them.
"""

from __future__ import annotations

import importlib
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from tsm.errors import TsmError, UnknownResourceError
from tsm.specs.api import Resource

# ``tsm.specs.named_resources`` as an attribute is the registry re-exported by tsm.specs, so fetch the module.
nr: ModuleType = importlib.import_module("tsm.specs.named_resources")

BUILTINS = {  # TorchX's generic sizes: the same name asks for the same machine
    "cpu.nano": (1, 0, 512),
    "cpu.micro": (1, 0, 1024),
    "cpu.small": (1, 0, 2048),
    "cpu.medium": (2, 0, 4096),
    "cpu.large": (2, 0, 8192),
    "cpu.xlarge": (8, 0, 32768),
    "gpu.small": (8, 1, 32768),
    "gpu.medium": (16, 2, 65536),
    "gpu.large": (32, 4, 131072),
    "gpu.xlarge": (64, 8, 262144),
}


@pytest.fixture(autouse=True)
def fresh_cache(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every test loads the table anew (and leaves no plugin behind for the next)."""
    monkeypatch.setattr(nr, "_cache", None)
    yield
    nr._cache = None


def _install_plugin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, module_source: str, entries: dict[str, str]
) -> str:
    """Write a real distribution (dist-info + module) under ``tmp_path`` and put it on sys.path.

    ``entries`` maps entry-point name to the attribute of the module; returns the module name.
    """
    module = f"tsm_test_resources_{uuid.uuid4().hex[:12]}"
    dist = f"tsm_test_plugin_{uuid.uuid4().hex[:8]}"
    site = tmp_path / "site"
    site.mkdir()
    (site / f"{module}.py").write_text(textwrap.dedent(module_source))
    info = site / f"{dist}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    lines = ["[tsm.named_resources]"] + [f"{name} = {module}:{attr}" for name, attr in entries.items()]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    monkeypatch.syspath_prepend(str(site))  # also invalidates import caches
    monkeypatch.delitem(sys.modules, module, raising=False)
    return module


def test_builtins_are_listed_sorted() -> None:
    names = nr.named_resources()
    assert set(BUILTINS) <= set(names)
    assert names == sorted(names)


@pytest.mark.parametrize(("name", "shape"), sorted(BUILTINS.items()))
def test_builtin_shapes(name: str, shape: tuple[int, int, int]) -> None:
    res = nr.get_named_resource(name)
    assert isinstance(res, Resource)
    assert (res.cpu, res.gpu, res.memMB) == shape


def test_builtin_returns_fresh_resource_each_time() -> None:
    a = nr.get_named_resource("gpu.small")
    a.capabilities["x"] = 1
    a.cpu = 999
    b = nr.get_named_resource("gpu.small")
    assert a is not b
    assert b.cpu == 8 and b.capabilities == {}


def test_reexported_from_specs() -> None:
    import tsm.specs

    assert tsm.specs.get_named_resource is nr.get_named_resource
    assert tsm.specs.named_resources is nr.named_resources


def test_unknown_name_did_you_mean() -> None:
    with pytest.raises(UnknownResourceError) as ei:
        nr.get_named_resource("gpu.smal")
    msg = str(ei.value)
    assert "unknown named resource 'gpu.smal'" in msg
    assert "(did you mean 'gpu.small'?)" in msg
    assert "known: " in msg and all(name in msg for name in BUILTINS)


def test_unknown_name_without_close_match() -> None:
    with pytest.raises(UnknownResourceError) as ei:
        nr.get_named_resource("zzzzzzzzzz")
    assert "did you mean" not in str(ei.value)
    assert "unknown named resource 'zzzzzzzzzz'" in str(ei.value)
    assert isinstance(ei.value, LookupError) and isinstance(ei.value, TsmError)


def test_plugin_entry_points(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _install_plugin(
        tmp_path,
        monkeypatch,
        """
        from tsm.specs.api import Resource

        def trn1():
            return Resource(cpu=128, gpu=0, memMB=512 * 1024, devices={"aws.amazon.com/neuron": 16})

        def gpu_small():
            return Resource(cpu=2, gpu=1, memMB=1)

        BIG = Resource(cpu=96, gpu=8, memMB=1024, capabilities={"c": {"n": 1}})
        """,
        {"aws.trn1": "trn1", "gpu.small": "gpu_small", "fixed.big": "BIG", "as.class": "Resource"},
    )
    names = nr.named_resources()
    assert {"aws.trn1", "fixed.big", "as.class"} <= set(names)
    assert set(BUILTINS) <= set(names)

    trn1 = nr.get_named_resource("aws.trn1")
    assert (trn1.cpu, trn1.gpu, trn1.memMB) == (128, 0, 512 * 1024)
    assert trn1.devices == {"aws.amazon.com/neuron": 16}

    # a plugin may override a builtin
    assert nr.get_named_resource("gpu.small") == Resource(cpu=2, gpu=1, memMB=1)

    # a callable class works too
    assert nr.get_named_resource("as.class") == Resource()

    # did-you-mean covers plugin names
    with pytest.raises(UnknownResourceError, match=r"did you mean 'aws.trn1'"):
        nr.get_named_resource("aws.trn2")


def test_plugin_resource_instance_is_copied(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _install_plugin(
        tmp_path,
        monkeypatch,
        """
        from tsm.specs.api import Resource
        BIG = Resource(cpu=96, gpu=8, memMB=1024, capabilities={"c": {"n": 1}})
        """,
        {"fixed.big": "BIG"},
    )
    a = nr.get_named_resource("fixed.big")
    assert a == Resource(cpu=96, gpu=8, memMB=1024, capabilities={"c": {"n": 1}})
    a.cpu = 1
    a.capabilities["c"]["n"] = 2
    b = nr.get_named_resource("fixed.big")
    assert a is not b
    assert b.cpu == 96 and b.capabilities == {"c": {"n": 1}}


def test_plugin_that_does_not_produce_a_resource(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _install_plugin(
        tmp_path,
        monkeypatch,
        """
        def bad():
            return {"cpu": 1}

        NOT_A_RESOURCE = 42
        """,
        {"bad.fn": "bad", "bad.value": "NOT_A_RESOURCE"},
    )
    with pytest.raises(UnknownResourceError, match=r"named resource 'bad.fn' did not produce a Resource \(got dict\)"):
        nr.get_named_resource("bad.fn")
    with pytest.raises(UnknownResourceError, match=r"named resource 'bad.value' did not produce a Resource \(got int\)"):
        nr.get_named_resource("bad.value")


def test_table_is_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    before = nr.named_resources()
    _install_plugin(tmp_path, monkeypatch, "from tsm.specs.api import Resource\n", {"late.one": "Resource"})
    # loaded once per process: a plugin installed afterwards is seen only once the cache is reset
    assert nr.named_resources() == before
    nr._cache = None
    assert "late.one" in nr.named_resources()
