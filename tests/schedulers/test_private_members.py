"""The views, the CLI, sweeps, the backends' view helpers and the local scheduler's helpers ask a scheduler's public methods: none
of them reaches a private member (``_watcher``, ``_final``, ``_dir``, ...) of a class of ``tsm.schedulers``.

An AST check: the private members are every ``_name`` method and ``self._name`` attribute a class under
``src/tsm/schedulers`` defines; a module checked may not read one off anything but ``self``, ``cls``,
``super()`` or a module it imported, nor ask ``getattr`` for one by name.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "tsm"
#: the packages and modules that must ask the public methods
CHECKED = ("views", "cli", "sweep", "schedulers/docker/view.py", "schedulers/kubernetes/view.py", "schedulers/ray/view.py",
           "schedulers/local/control.py", "schedulers/local/spawn.py")


def _private(name: str) -> bool:
    return name.startswith("_") and not name.endswith("__")


@functools.cache
def scheduler_privates(root: Path = SRC / "schedulers") -> frozenset[str]:
    """The private member names the classes under ``root`` define (methods and ``self._x = ...``)."""
    names: set[str] = set()
    for f in root.rglob("*.py"):
        for cls in (n for n in ast.walk(ast.parse(f.read_text())) if isinstance(n, ast.ClassDef)):
            for n in ast.walk(cls):
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and _private(n.name):
                    names.add(n.name)
                elif (isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store) and _private(n.attr)
                      and isinstance(n.value, ast.Name) and n.value.id == "self"):
                    names.add(n.attr)
    return frozenset(names)


def reaches(source: str, privates: frozenset[str]) -> list[str]:
    """``line: expression`` for each place ``source`` reaches one of ``privates`` on another object."""
    tree = ast.parse(source)
    imported = {(a.asname or a.name).split(".")[0] for n in ast.walk(tree)
                if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
    found = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Attribute) and n.attr in privates:
            v = n.value
            if isinstance(v, ast.Name) and (v.id in ("self", "cls") or v.id in imported):
                continue
            if isinstance(v, ast.Call) and isinstance(v.func, ast.Name) and v.func.id == "super":
                continue
            found.append(f"{n.lineno}: {ast.unparse(n)}")
        elif (isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in ("getattr", "setattr")
              and len(n.args) >= 2 and isinstance(n.args[1], ast.Constant) and n.args[1].value in privates):
            found.append(f"{n.lineno}: {ast.unparse(n)}")
    return found


def _modules() -> list[Path]:
    out: list[Path] = []
    for part in CHECKED:
        p = SRC / part
        out += sorted(p.rglob("*.py")) if p.is_dir() else [p]
    return out


def test_the_check_sees_a_reach_into_a_scheduler() -> None:
    privates = scheduler_privates()
    assert {"_watcher", "_lookup", "_finish"} <= privates
    bad = ("def snapshot(self, ids):\n"
           "    listed = self.sched._watcher.all()\n"
           "    return getattr(sched, '_lookup')(ids), super()._finish(), self._lookup\n")
    assert reaches(bad, privates) == ["2: self.sched._watcher", "3: getattr(sched, '_lookup')"]


@pytest.mark.parametrize("module", _modules(), ids=lambda p: str(p.relative_to(SRC)))
def test_no_view_cli_or_sweep_module_reaches_a_schedulers_private_member(module: Path) -> None:
    assert reaches(module.read_text(), scheduler_privates()) == [], (
        f"{module.relative_to(SRC)} reaches a scheduler's private member: ask a public method (declared in "
        "tsm.schedulers.api or on the scheduler's base) instead"
    )
