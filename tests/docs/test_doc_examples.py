"""Examples are tests (issue 30): every fenced shell or Python example in README.md and docs/ runs as written.

Sybil finds the examples (its Markdown parsers, ``sybil.parsers.markdown``) and runs the Python ones (one
namespace per document, so an example may use what an earlier one defined); shell examples (``bash``,
``sh``, ``console``) are run by :class:`Shell` below, in one project directory per document that holds the
files the examples name (``train.py``, ``ps.py``, ``my_components.py``, ``data.txt``).

How a document marks its examples:

* nothing: runnable on the local scheduler, in the main suite;
* ``<!-- example: ENGINE -->`` on the line before (``slurm``, ``docker``, ``ray``, ``kubernetes``): runnable
  against that engine, in the test carrying that engine's marker (its fixture starts the engine; Kubernetes
  runs in the second pytest run, ``-m kubernetes``);
* ``<!-- skip: next "why" -->`` (Sybil's own directive): illustrative, with the reason.

A ``console`` example shows commands after ``$ `` and the output they print below them: the output is
checked line for line with times, dates and ids masked, and a handle the document shows is replaced in
later commands by the one the command really printed. :func:`test_every_example_is_runnable_or_explained`
fails on an example that is neither.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from sybil import Document, Example, Sybil
from sybil.parsers.markdown import CodeBlockParser, PythonCodeBlockParser, SkipParser

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("**/*.md"))]
SHELL = ("bash", "sh", "console")
ENGINES = ("slurm", "docker", "ray", "kubernetes")
HANG = 600  # seconds for one example: a guard against a hang, never a performance claim
BIN = Path(sys.executable).parent

#: the files the examples name, made in each document's project directory
FILES = {
    "train.py": "import sys\nprint('train', *sys.argv[1:], flush=True)\n",
    "ps.py": "print('ps up', flush=True)\n",
    "x.py": "print('x')\n",
    "data.txt": "data\n",
    "my_components.py": None,  # taken from the README's own example (below)
}

_UNLABELLED_SHELL = re.compile(r"^```[ \t]*\n(?:\$ |tsm |make |sudo |pip |python )", re.MULTILINE)
_DIRECTIVE = re.compile(r"<!--\s*example:\s*(?P<engine>\w+)\s*-->\s*$")
_HANDLE = re.compile(r"\b[a-z_]+://[\w.-]+/[\w.-]+")
_MASKS = [
    (re.compile(r"\b\d{4}-\d\d-\d\d[ T]\d\d:\d\d(:\d\d(\.\d+)?)?\b"), "<time>"),
    (re.compile(r"\b\d+(\.\d+)?(ms|s)\b"), "<secs>"),
    (re.compile(r"(?<=-)[0-9a-f]{8}\b"), "<id>"),
    (re.compile(r"\b[0-9a-f]{12,64}\b"), "<digest>"),
    (re.compile(r"\bhost=\S+"), "host=<host>"),
]


def mask(text: str) -> str:
    """``text`` with times, durations, app ids, digests and host names replaced by placeholders."""
    for pattern, repl in _MASKS:
        text = pattern.sub(repl, text)
    return text


@dataclass
class Block:
    """One fenced example of a document: where it is, its language, and how the document marks it."""

    doc: Path
    line: int
    language: str
    example: Example
    engine: str | None = None  # ENGINE from ``<!-- example: ENGINE -->``
    skipped: str | None = None  # the reason of a ``<!-- skip: next "..." -->``

    @property
    def where(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line}"


@dataclass
class Shell:
    """Runs shell examples in a project directory, carrying handles from one command to the next."""

    cwd: Path
    env: dict[str, str]
    handles: dict[str, str] = field(default_factory=dict)

    def __call__(self, example: Example) -> str | None:
        source = example.parsed if isinstance(example.parsed, str) else str(example.parsed)
        if example.region.lexemes.get("arguments", "").strip() == "console":
            return self.transcript(source)
        r = self.run(source)
        return None if r.returncode == 0 else f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"

    def run(self, script: str) -> subprocess.CompletedProcess[str]:
        for shown, real in self.handles.items():
            script = script.replace(shown, real)
        return subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=self.cwd, env=self.env, text=True,
                              capture_output=True, timeout=HANG, stdin=subprocess.DEVNULL)

    def transcript(self, source: str) -> str | None:
        """``$ command`` lines, each followed by the output it must print (checked with ids and times masked)."""
        steps: list[tuple[str, list[str]]] = []
        for line in source.splitlines():
            if line.startswith("$ "):
                steps.append((line[2:], []))
            elif steps:
                steps[-1][1].append(line)
        for command, expected in steps:
            r = self.run(command)
            if r.returncode != 0:
                return f"$ {command}\nexit {r.returncode}\n{r.stdout}\n{r.stderr}"
            got = r.stdout.splitlines()
            if not expected:
                continue
            for shown, real in zip(expected, got, strict=False):  # handles the document shows stand for these
                for s, g in zip(_HANDLE.findall(shown), _HANDLE.findall(real), strict=False):
                    self.handles[s] = g
            if [mask(x) for x in expected] != [mask(x) for x in got]:
                return f"$ {command}\nexpected:\n" + "\n".join(expected) + "\ngot:\n" + r.stdout
        return None


def _language(example: Example) -> str | None:
    arguments = example.region.lexemes.get("arguments")
    return arguments.strip().split()[0] if isinstance(arguments, str) and arguments.strip() else None


def _by_shell(example: Example) -> None:
    raise AssertionError(f"shell examples are run by Shell, not evaluated alone (line {example.line})")


def _document(doc: Path) -> Document:
    """``doc`` parsed by Sybil: Python and shell code blocks and skip directives."""
    shells = [CodeBlockParser(language=lang, evaluator=_by_shell) for lang in SHELL]
    return Sybil(parsers=[PythonCodeBlockParser(), *shells, SkipParser()]).parse(doc)


def blocks(doc: Path) -> list[Block]:
    """Every fenced shell or Python example of ``doc``, in order, with how it is marked."""
    document = _document(doc)
    out: list[Block] = []
    skip_next: str | None = None
    for ex in document:
        if isinstance(ex.parsed, tuple) and ex.parsed and ex.parsed[0] == "next":  # a skip directive
            skip_next = (ex.parsed[1] or "").strip().strip("\"'")
            continue
        language = _language(ex)
        if language not in (*SHELL, "python"):
            skip_next = None
            continue
        before = document.text[: ex.region.start].rstrip("\n").rsplit("\n", 1)[-1]
        m = _DIRECTIVE.match(before.strip())
        out.append(Block(doc, ex.line, language or "", ex, m.group("engine") if m else None, skip_next))
        skip_next = None
    return out


def project(tmp: Path, doc: Path | None = None) -> Path:
    """A project directory with every file the examples name: as ``doc`` shows it, if it shows it."""
    tmp.mkdir(parents=True, exist_ok=True)
    shown = shown_files(doc) if doc is not None else {}
    for name, text in FILES.items():
        text = shown.get(name) or text or readme_component()
        (tmp / name).write_text(text)
    return tmp


def shown_files(doc: Path) -> dict[str, str]:
    """The project files ``doc`` shows: Python examples that start with ``# <name>`` (one of :data:`FILES`)."""
    out = {}
    for b in blocks(doc):
        source = str(b.example.parsed)
        first = source.partition("\n")[0].removeprefix("# ").strip()
        if b.language == "python" and first in FILES:
            out[first] = source
    return out


def readme_component() -> str:
    """The README's ``my_components.py``, exactly as the README shows it."""
    found = shown_files(ROOT / "README.md").get("my_components.py")
    if found is None:
        raise AssertionError("README.md has no my_components.py example")
    return found


def run_blocks(selected: list[Block], tmp: Path, env_extra: dict[str, str] | None = None) -> None:
    """Evaluate ``selected`` in order (Python in its document's namespace, shell in a project directory)."""
    cwd = project(tmp, selected[0].doc if selected else None)
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", **(env_extra or {}))
    shell = Shell(cwd, env)
    failures = []
    old, old_env = Path.cwd(), dict(os.environ)
    os.chdir(cwd)
    try:
        for b in selected:
            if b.language == "python":
                try:
                    b.example.evaluate()
                except Exception as e:  # noqa: BLE001 - reported with where it is
                    failures.append(f"{b.where}: {type(e).__name__}: {e}")
            else:
                problem = shell(b.example)
                if problem:
                    failures.append(f"{b.where}:\n{textwrap.indent(problem, '    ')}")
    finally:  # a Python example may set variables (as a job's environment): none outlives the document
        os.chdir(old)
        os.environ.clear()
        os.environ.update(old_env)
    assert not failures, "\n".join(failures)


def _runnable(engine: str | None) -> list[Any]:
    params = []
    for doc in DOCS:
        chosen = [b for b in blocks(doc) if b.engine == engine and b.skipped is None]
        if chosen:  # torchrun (the dist builtins) needs torch, which make test installs
            torch = any("dist." in str(b.example.parsed) for b in chosen)
            params.append(pytest.param(doc, id=str(doc.relative_to(ROOT)), marks=[pytest.mark.torch] if torch else []))
    return params


def test_every_example_is_runnable_or_explained() -> None:
    """Each shell or Python example names a known engine, runs locally, or says why it is illustrative."""
    bad = []
    for doc in DOCS:
        for m in _UNLABELLED_SHELL.finditer(doc.read_text()):  # a shell example hidden from the check by no label
            line = doc.read_text().count("\n", 0, m.start()) + 1
            bad.append(f"{doc.relative_to(ROOT)}:{line}: label the fence (```bash, ```console or ```text)")
        for b in blocks(doc):
            if b.skipped is not None and not b.skipped:
                bad.append(f"{b.where}: a skipped example must say why (<!-- skip: next \"why\" -->)")
            if b.engine is not None and b.engine not in ENGINES:
                bad.append(f"{b.where}: unknown engine {b.engine!r}; one of {', '.join(ENGINES)}")
    assert not bad, "\n".join(bad)


def test_getting_started_shows_the_train_py_its_examples_run() -> None:
    """A newcomer copies the page: its Python example asserts on what ``train.py`` prints, so the page shows
    that file, and the examples are run with it as shown (:func:`project`)."""
    shown = shown_files(ROOT / "docs" / "getting-started.md")
    assert "train.py" in shown, "docs/getting-started.md runs a train.py it never shows"
    out = subprocess.run([sys.executable, "-c", shown["train.py"], "--lr", "0.1"], capture_output=True, text=True,
                         timeout=HANG, check=True).stdout
    assert out == "train --lr 0.1\n", out


@pytest.mark.parametrize("doc", _runnable(None))
def test_local_examples_run_as_written(doc: Path, tmp_path: Path) -> None:
    run_blocks([b for b in blocks(doc) if b.engine is None and b.skipped is None], tmp_path / "project")


def _engine_examples(doc: Path, engine: str, tmp_path: Path, env: dict[str, str] | None = None) -> None:
    run_blocks([b for b in blocks(doc) if b.engine == engine and b.skipped is None], tmp_path / "project", env)


@pytest.mark.integration
@pytest.mark.slurm
@pytest.mark.parametrize("doc", _runnable("slurm"))
def test_slurm_examples_run_as_written(doc: Path, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    request.getfixturevalue("slurm_cluster")
    _engine_examples(doc, "slurm", tmp_path)


@pytest.mark.integration
@pytest.mark.docker
@pytest.mark.parametrize("doc", _runnable("docker"))
def test_docker_examples_run_as_written(doc: Path, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    request.getfixturevalue("docker_engine")
    _engine_examples(doc, "docker", tmp_path)


@pytest.mark.integration
@pytest.mark.ray
@pytest.mark.parametrize("doc", _runnable("ray"))
def test_ray_examples_run_as_written(doc: Path, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    request.getfixturevalue("ray_cluster")
    _engine_examples(doc, "ray", tmp_path)


@pytest.mark.integration
@pytest.mark.kubernetes
@pytest.mark.parametrize("doc", _runnable("kubernetes"))
def test_kubernetes_examples_run_as_written(doc: Path, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    cluster = request.getfixturevalue("k8s_cluster")
    kubeconfig = getattr(cluster, "kubeconfig", None)
    _engine_examples(doc, "kubernetes", tmp_path, {"KUBECONFIG": str(kubeconfig)} if kubeconfig else None)
