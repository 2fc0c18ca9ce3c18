"""No new import cycle among tsm's modules, counting imports inside functions and under ``TYPE_CHECKING``.

Every ``import`` and ``from ... import`` anywhere in a module is an edge (``from a import b`` goes to the module
``a.b`` when there is one, else to ``a``); a cycle is a strongly connected group of two or more modules. The
groups still left are listed in :data:`KNOWN`, each to be broken: a cycle outside them fails, and so does an
entry of :data:`KNOWN` that is no longer a cycle (take it off the list).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

#: the cycles not broken yet (the runner's door to sweeps and functions; the scheduler API's shared helpers;
#: submitit's face, whose modules import each other as submitit's own do)
KNOWN = [
    {"tsm.functions.launch", "tsm.functions.mapping", "tsm.runner.api", "tsm.sweep", "tsm.sweep.api",
     "tsm.sweep.controller", "tsm.sweep.native"},
    {"tsm.submitit.core.job_environment", "tsm.submitit.core.plugins", "tsm.submitit.executor",
     "tsm.submitit.local.debug", "tsm.submitit.local.local", "tsm.submitit.slurm.slurm", "tsm.submitit.tsmjob"},
]


def _modules() -> dict[str, Path]:
    out = {}
    for path in (SRC / "tsm").rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The tsm modules ``name`` imports anywhere in its text."""

    def known(mod: str) -> str | None:
        while mod and mod not in modules:
            mod = mod.rpartition(".")[0]
        return mod or None

    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str | None] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(known(a.name) for a in node.names if a.name.split(".")[0] == "tsm")
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, *([node.module] if node.module else [])])
            if base.split(".")[0] != "tsm":
                continue
            out.update(f"{base}.{a.name}" if f"{base}.{a.name}" in modules else known(base) for a in node.names)
    return {m for m in out if m is not None and m != name}


def cycles() -> list[set[str]]:
    """The strongly connected groups of two or more modules (Tarjan's algorithm, without recursion)."""
    modules = _modules()
    graph = {name: sorted(_imports(name, path, modules)) for name, path in modules.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            v, i = work.pop()
            if i == 0:
                index[v] = low[v] = len(index)
                stack.append(v)
                on_stack.add(v)
            edges = graph[v]
            if i < len(edges):
                work.append((v, i + 1))
                w = edges[i]
                if w not in index:
                    work.append((w, 0))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            if work:  # back in the caller: carry the low link up
                parent = work[-1][0]
                low[parent] = min(low[parent], low[v])
            if low[v] == index[v]:
                group = set()
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    group.add(w)
                    if w == v:
                        break
                if len(group) > 1:
                    found.append(group)
    return found


def test_the_finder_finds_a_cycle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check is not vacuous: two modules that import each other (one inside a function) are a cycle."""
    pkg = tmp_path / "tsm"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from tsm import b\n")
    (pkg / "b.py").write_text("def f():\n    from .a import x\n")
    (pkg / "c.py").write_text("import tsm.a\n")
    monkeypatch.setattr(sys.modules[__name__], "SRC", tmp_path)
    assert cycles() == [{"tsm.a", "tsm.b"}]


def test_no_import_cycle_but_the_known_ones() -> None:
    found = cycles()
    new = [sorted(g) for g in found if not any(g <= known for known in KNOWN)]
    assert new == [], f"an import cycle: {new}"
    gone = [sorted(k) for k in KNOWN if not any(g & k for g in found)]
    assert gone == [], f"no longer a cycle, take it off KNOWN: {gone}"
