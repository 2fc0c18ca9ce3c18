"""submitit 1.5.4's documented examples, read out of its source distribution at test time, and a runner that
runs a program unchanged under ``python -m tsm.submitit_alias``.

The sdist is downloaded once (``pip download submitit==1.5.4 --no-deps --no-binary :all:``) into the cache
(``$TSM_SUBMITIT_TESTS_CACHE``, default ``~/.cache/tsm``); :func:`blocks` gives the ```` ```python ````
blocks under a heading of a markdown file, exactly as written there.
"""

from __future__ import annotations

import fcntl
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _cache() -> Path:
    root = Path(os.environ.get("TSM_SUBMITIT_TESTS_CACHE") or Path.home() / ".cache" / "tsm")
    root.mkdir(parents=True, exist_ok=True)
    return root


def sdist_docs() -> Path:
    """The folder of submitit 1.5.4's sdist (README.md, docs/), downloaded once."""
    out = _cache() / "submitit-1.5.4-sdist"
    with open(_cache() / ".submitit-sdist.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (out / "submitit-1.5.4" / "README.md").exists():
            out.mkdir(exist_ok=True)
            got = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                                  "-d", str(out), "submitit==1.5.4"], capture_output=True, text=True)
            if got.returncode != 0:
                from integration.slurm_cluster import unavailable

                unavailable(f"cannot download submitit 1.5.4's sdist: {got.stderr.strip()[-300:]}")
            with tarfile.open(next(out.glob("submitit-1.5.4.tar.gz"))) as tar:
                for member in tar.getmembers():
                    if member.name.endswith(".md") and member.isfile():
                        tar.extract(member, out, filter="data")
    return out / "submitit-1.5.4"


def blocks(markdown: str, heading: str | None = None) -> list[str]:
    """The python code blocks of ``markdown`` under ``heading`` (up to the next heading of its level or above),
    or of the whole file."""
    lines = markdown.splitlines(keepends=True)
    if heading is not None:
        fence, start, level, out = False, None, 0, []
        for line in lines:
            if line.startswith("```"):
                fence = not fence
            m = None if fence else re.match(r"(#+) (.*?)\s*$", line)
            if m and start is None and m.group(2) == heading:
                start, level = len(out), len(m.group(1))
            elif m and start is not None and len(m.group(1)) <= level:
                break
            if start is not None:
                out.append(line)
        if start is None:
            raise LookupError(f"no heading {heading!r}")
        lines = out
    return re.findall(r"^```python\n(.*?)^```", "".join(lines), re.M | re.S)


def doc(name: str) -> str:
    return (sdist_docs() / name).read_text()


def run_program(code: str, cwd: Path, cluster: str, timeout: float = 600, **env: str) -> str:
    """Run ``code`` as a program under the alias with ``AutoExecutor``'s cluster set to ``cluster``; its stdout
    (the test fails with its output when it exits non-zero)."""
    prog = cwd / "example.py"
    prog.write_text(code)
    full = {**os.environ, "TSM_SUBMITIT_CLUSTER": cluster, **env}
    full["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), full.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-m", "tsm.submitit_alias", str(prog)], cwd=cwd, env=full,
                          capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        pytest.fail(f"the example exited {proc.returncode}:\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}")
    return proc.stdout
