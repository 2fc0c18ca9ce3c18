"""``tsm.runner.plugins``: entry points of tsm's plugin groups without importing importlib.metadata when none exist.

Real distributions on ``sys.path`` (``*.dist-info`` directories written by the test), each check run in a
fresh interpreter so that what is imported can be seen; the answers are compared with
``importlib.metadata`` itself.
"""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

HANG = 60  # seconds: a guard against a hung interpreter, never a performance claim


def _dist(site: Path, name: str, text: str) -> None:
    """A minimal installed distribution ``name`` 1.0 in ``site`` with ``entry_points.txt`` = ``text``."""
    info = site / f"{name}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(text)


def _ask(path: list[str], groups: list[str]) -> dict[str, object]:
    """In a fresh interpreter with ``path`` in front of ``sys.path``: what entry_points(groups) returns,
    what importlib.metadata says, and whether importlib.metadata had been imported by the former."""
    code = (
        "import json, sys\n"
        f"sys.path[:0] = {path!r}\n"
        "from tsm.runner.plugins import entry_points, named_groups\n"
        f"eps = entry_points({groups!r})\n"
        "imported = 'importlib.metadata' in sys.modules\n"
        "from importlib.metadata import entry_points as real\n"
        f"want = [(e.group, e.name, e.value) for g in {groups!r} for e in real(group=g)]\n"
        "print(json.dumps({'got': [(e.group, e.name, e.value) for e in eps], 'want': want,\n"
        "                  'imported': imported, 'scan': named_groups() is not None}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=HANG, check=True)
    result: dict[str, object] = json.loads(out.stdout)
    return result


def test_no_plugin_means_no_importlib_metadata(tmp_path: Path) -> None:
    _dist(tmp_path, "other_tool", "[console_scripts]\nother = other_tool:main\n")
    res = _ask([str(tmp_path)], ["tsm.event_handlers", "torchx.event_handlers"])
    assert res["got"] == res["want"] == []
    assert res["imported"] is False  # the scan alone answered: nothing names these groups


def test_a_plugin_is_found_as_importlib_metadata_finds_it(tmp_path: Path) -> None:
    _dist(tmp_path, "tsm_sink", "[tsm.event_handlers]\nmine = tsm_sink:handle\n\n[torchx.event_handlers]\nold = tsm_sink:old\n")
    res = _ask([str(tmp_path)], ["tsm.event_handlers", "torchx.event_handlers"])
    assert res["got"] == res["want"]
    assert [g for g, _, _ in res["got"]] == ["tsm.event_handlers", "torchx.event_handlers"]  # group order kept


def test_odd_group_headers_count_as_named(tmp_path: Path) -> None:
    # importlib.metadata strips the blanks around a section line (and comments are not sections)
    _dist(tmp_path, "spaced", "# [tsm.tracker]\n  [tsm.tracker]  \nx = spaced:make\n")
    res = _ask([str(tmp_path)], ["tsm.tracker"])
    assert res["got"] == res["want"] and len(res["want"]) == 1  # type: ignore[arg-type]


def test_a_zip_on_the_path_is_left_to_importlib(tmp_path: Path) -> None:
    archive = tmp_path / "plugins.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("zipped-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: zipped\nVersion: 1.0\n")
        z.writestr("zipped-1.0.dist-info/entry_points.txt", "[tsm.schedulers]\nzipped = zipped:create\n")
    res = _ask([str(archive)], ["tsm.schedulers", "torchx.schedulers"])
    assert res["scan"] is False  # the directory scan cannot read a zip: it says so
    assert res["got"] == res["want"] and [n for _, n, _ in res["got"]] == ["zipped"]
