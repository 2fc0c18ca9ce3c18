"""Run submitit 1.5.4's own unit tests, unchanged, on tsm through ``python -m tsm.submitit_alias``; print the count.

    python tests/submitit/submitit_upstream.py [--wheel submitit-1.5.4-py3-none-any.whl] [--timeout SECONDS]

submitit's tests ship in its wheel, inside the package (``submitit/core/test_core.py`` beside
``submitit/core/core.py``). The wheel is downloaded at test time (``pip download submitit==1.5.4 --no-deps``)
and only its test files are taken out of it, byte for byte (the ``test_*.py`` files, ``conftest.py`` and the
recorded sbatch script), into a cached folder with no ``__init__.py``: under the alias every other
``submitit`` module is tsm's (:mod:`tsm.submitit`), as for a submitit user, and these files load from that
folder at their submitit paths (:mod:`tsm.aliasing`). The folder is made a git repository of those files,
as submitit's checkout is where its tests run (its ``RsyncSnapshot`` tests snapshot the repository).

They run with pytest (and pytest-asyncio, pytest-timeout) from a cached virtualenv of their own, built once
and keyed by those pins (``$TSM_SUBMITIT_TESTS_CACHE``, default ``~/.cache/tsm``), with tsm from this tree
through a ``.pth`` file; in a fresh ``TSM_HOME`` and ``HOME``, each test under a time limit. The last line::

    submitit 1.5.4's own tests: N passed, N failed, N not applicable, N skipped or xfailed by submitit itself

and the exit status is 1 when a test failed. :data:`NOT_APPLICABLE` lists the tests that check submitit's
own making rather than its contract, each with the reason; they run too, and one that passes is reported as
a failure, so the list cannot go stale. Without the package index (no download) the run is a skip line
(exit 0), or a failure under ``CI=true``.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SUBMITIT = "submitit==1.5.4"
#: what runs submitit's tests (their own test requirements: pytest, pytest-asyncio), and what tsm needs
PINS = ("pytest==9.2.0", "pytest-asyncio==1.5.0", "pytest-timeout==2.4.0", "cloudpickle==3.1.2")

_MOCKS_SBATCH = "mocks submitit's own sbatch/sacct calls (unittest.mock on subprocess and submitit.core.utils) and " \
                "checks what submitit's code does with the mocked answers; tsm's Slurm jobs are tested on the real " \
                "cluster instead (tests/integration/test_functions_slurm.py)"
_SBATCH_TEXT = "compares the text of submitit's own sbatch script; tsm submits its own (its dry run shows it)"
_SACCT = "tests submitit's parser of sacct's text output; tsm reads Slurm's JSON through its Slurm scheduler"

#: ``path::test`` (parametrized: every case) -> why it does not apply to tsm
NOT_APPLICABLE: dict[str, str] = {
    "submitit/test_documentation.py::test_assert_markdown_links_not_broken":
        "checks the links of submitit's own repository's markdown files, which are not here",
    "submitit/test_helpers.py::test_snapshot_excludes":
        "snapshots submitit's repository and looks for its source (submitit/helpers.py); the repository here holds "
        "submitit's test files only: the package is tsm's",
    "submitit/test_helpers.py::test_job_use_snapshot_modules":
        "checks that `import submitit` in a job loads submitit's source from the snapshot; here submitit is tsm",
    "submitit/local/test_local.py::test_make_subprocess":
        "calls local.start_controller, submitit's internal controller process, which tsm's local jobs do not have",
    "submitit/local/test_local.py::test_cancel":
        "expects -2 as the return code of submitit's controller after a cancel (it sends SIGINT); a cancelled "
        "tsm job's processes end by SIGTERM (-15), as every tsm cancel does",
    "submitit/slurm/test_slurm.py::test_mocked_missing_state": _SACCT,
    "submitit/slurm/test_slurm.py::test_slurm_job_mocked": _MOCKS_SBATCH,
    "submitit/slurm/test_slurm.py::test_slurm_job_array_mocked": _MOCKS_SBATCH,
    "submitit/slurm/test_slurm.py::test_slurm_weird_dir": _MOCKS_SBATCH,
    "submitit/slurm/test_slurm.py::test_slurm_through_auto": _MOCKS_SBATCH,
    "submitit/slurm/test_slurm.py::test_slurm_job_no_stderr": _MOCKS_SBATCH,
    "submitit/slurm/test_slurm.py::test_slurm_through_auto_with_setup_and_teardown": _MOCKS_SBATCH,
    "submitit/slurm/test_slurm.py::test_make_sbatch_string": _SBATCH_TEXT,
    "submitit/slurm/test_slurm.py::test_make_sbatch_string_gpu": _SBATCH_TEXT,
    "submitit/slurm/test_slurm.py::test_make_sbatch_stderr": _SBATCH_TEXT,
    "submitit/slurm/test_slurm.py::test_read_info": _SACCT,
    "submitit/slurm/test_slurm.py::test_read_info_array": _SACCT,
    "submitit/slurm/test_slurm.py::test_read_job_id": _SACCT,
    "submitit/slurm/test_slurm.py::test_get_id_from_submission_command": _SACCT,
    "submitit/slurm/test_slurm.py::test_get_id_from_submission_command_raise": _SACCT,
    "submitit/slurm/test_slurm.py::test_watcher": _SACCT,
}

#: tests whose assertions are on the clock (a result within 1.5 s; jobs given 2 or 3 s to run, interpreter start
#: included): they run and are reported, but a miss is not a failure, since this project never gates on a
#: timed assertion (a loaded CI machine would fail them for submitit itself)
TIMED: dict[str, str] = {
    "submitit/test_helpers.py::test_as_completed": "the first two of three jobs must return within 1.5 s",
    "submitit/local/test_local.py::test_requeuing": "a job of 3 s must finish a 1 s step before its warning at 2 s",
    "submitit/local/test_local.py::test_custom_checkpoint": "a job of 2 s is warned at 1 s",
    "submitit/core/test_utils.py::test_command_function_deadlock": "two jobs of 2 s each start another Python",
}

SUMMARY = ("submitit 1.5.4's own tests: {passed} passed, {failed} failed, {na} not applicable, {own} skipped or "
           "xfailed by submitit itself, {timed} timed ones past their clock (not gated)")


def _cache() -> Path:
    root = Path(os.environ.get("TSM_SUBMITIT_TESTS_CACHE") or Path.home() / ".cache" / "tsm")
    root.mkdir(parents=True, exist_ok=True)
    return root


def _locked(name: str) -> int:
    fd = os.open(_cache() / f".{name}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def venv() -> Path:
    """The cached virtualenv with submitit's test requirements (built once under a lock; tsm via a .pth)."""
    key = hashlib.sha256("\n".join([*PINS, sys.version.split()[0]]).encode()).hexdigest()[:16]
    path = _cache() / f"submitit-tests-venv-{key}"
    fd = _locked(path.name)
    try:
        if not (path / ".complete").exists():
            subprocess.run(["rm", "-rf", str(path)], check=True)
            subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
            subprocess.run([str(path / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                            *PINS], check=True)
            (path / ".complete").write_text("\n".join(PINS) + "\n")
    finally:
        os.close(fd)
    site = next((path / "lib").glob("python3*/site-packages"))
    (site / "tsm-tree.pth").write_text(str(ROOT / "src") + "\n")  # this tree's tsm, written on every run
    return path


def tests_folder(wheel: Path | None) -> Path:
    """submitit's test files out of its wheel (downloaded when not given), in a git repository of their own."""
    if wheel is None:
        drop = _cache() / "submitit-1.5.4-wheel"
        drop.mkdir(exist_ok=True)
        if not list(drop.glob("submitit-1.5.4-*.whl")):
            subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(drop), SUBMITIT],
                           check=True)
        wheel = next(drop.glob("submitit-1.5.4-*.whl"))
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()[:16]
    folder = _cache() / f"submitit-1.5.4-tests-{digest}"
    fd = _locked(folder.name)
    try:
        if not (folder / ".git").exists():
            with zipfile.ZipFile(wheel) as z:
                for name in z.namelist():
                    base = name.rsplit("/", 1)[-1]
                    if name.startswith("submitit/") and (base.startswith("test_") and base.endswith(".py")
                                                         or base in ("conftest.py", "_sbatch_test_record.txt")):
                        z.extract(name, folder)
            git = ["git", "-C", str(folder), "-c", "user.name=tsm", "-c", "user.email=tsm@localhost"]
            subprocess.run([*git, "init", "-q"], check=True)
            subprocess.run([*git, "add", "."], check=True)
            subprocess.run([*git, "commit", "-q", "-m", "submitit 1.5.4's test files, as its wheel ships them"],
                           check=True)
    finally:
        os.close(fd)
    return folder


_CHILD = """import sys
import submitit, submitit.auto, submitit.core, submitit.local, submitit.slurm  # its packages: tsm's, first
import pytest
sys.exit(pytest.main(sys.argv[1:]))
"""


def run(tests: Path, timeout: float) -> tuple[dict[str, str], str]:
    """Run every test under the alias in one process; ``({test id: passed|failed|skipped}, the output)``."""
    python = str(venv() / "bin" / "python")
    with tempfile.TemporaryDirectory(prefix="tsm-submitit-tests-") as tmp:
        work = Path(tmp)
        for name in ("home", "tsm-home"):
            (work / name).mkdir()
        (work / "child.py").write_text(_CHILD)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TSM_", "SUBMITIT_", "PYTEST"))}
        env.update(HOME=str(work / "home"), TSM_HOME=str(work / "tsm-home"), PYTHONPATH=str(tests),
                   TSM_LAUNCHER_IDLE="5", PYTHONDONTWRITEBYTECODE="1")
        report = work / "report.xml"
        cmd = [python, "-m", "tsm.submitit_alias", str(work / "child.py"), "submitit", "-q", "-p", "no:cacheprovider",
               "--import-mode=importlib", "-o", "addopts=", "-o", "asyncio_default_fixture_loop_scope=function",
               f"--timeout={timeout:g}", f"--junitxml={report}", "--basetemp", str(work / "pytest")]
        proc = subprocess.run(cmd, cwd=tests, env=env, capture_output=True, text=True, timeout=timeout * 60 + 300)
        return _outcomes(report), proc.stdout + proc.stderr


def _outcomes(report: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    if not report.exists():
        return out
    for case in ET.parse(report).getroot().iter("testcase"):
        path = case.get("classname", "").replace(".", "/") + ".py"
        name = f"{path}::{case.get('name')}"
        kinds = {child.tag for child in case}
        out[name] = "failed" if kinds & {"failure", "error"} else "skipped" if "skipped" in kinds else "passed"
    return out


def not_applicable(test_id: str) -> str | None:
    """The reason ``test_id`` does not apply (a parametrized case takes its test's), or None."""
    return NOT_APPLICABLE.get(test_id.split("[", 1)[0])


def verdict(results: dict[str, str]) -> tuple[dict[str, int], list[str]]:
    """Counts and the ids that count as failures (a failure, or a not-applicable test that passed)."""
    counts = {"passed": 0, "failed": 0, "na": 0, "own": 0, "timed": 0}
    bad = []
    for test_id, outcome in sorted(results.items()):
        if test_id in TIMED and outcome == "failed":
            counts["timed"] += 1
            print(f"timed test missed its clock (not gated): {test_id}: {TIMED[test_id]}")
        elif not_applicable(test_id):
            counts["na"] += 1
            if outcome == "passed":
                bad.append(f"{test_id} passed but is listed as not applicable: take it off the list")
        elif outcome == "skipped":
            counts["own"] += 1  # submitit's own skipif / xfail markers
        elif outcome == "passed":
            counts["passed"] += 1
        else:
            counts["failed"] += 1
            bad.append(test_id)
    counts["failed"] = len(bad)
    return counts, bad


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--wheel", type=Path, help="submitit 1.5.4's wheel (default: downloaded with pip)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds each test may take")
    args = p.parse_args(argv)
    try:
        tests = tests_folder(args.wheel)
    except (subprocess.CalledProcessError, StopIteration) as e:
        if os.environ.get("CI", "").lower() == "true":
            print(f"submitit 1.5.4's own tests: FAILED: cannot get submitit's wheel ({e})")
            return 1
        print(f"submitit 1.5.4's own tests: skipped: cannot get submitit's wheel ({e})")
        return 0
    results, output = run(tests, args.timeout)
    counts, bad = verdict(results)
    if not results:
        bad.append("<no report: the run did not start>")
    if bad:
        print(output)
        print("\n".join(f"FAILED: {b}" for b in bad))
    print(SUMMARY.format(**counts))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
