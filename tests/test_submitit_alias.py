"""``python -m tsm.submitit_alias`` (on :mod:`tsm.aliasing`): ``import submitit...`` is tsm.submitit in that
process tree and in its jobs' replicas, only when asked for, never over a real submitit unless shadowed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[1] / "src")


def run(args: list[str], tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "PYTHONPATH": SRC + os.pathsep + env.pop("PYTHONPATH", ""), "TSM_HOME": str(tmp_path / "h"),
            **env}
    full.pop("TSM_SUBMITIT_ALIAS", None)
    return subprocess.run([sys.executable, *args], cwd=tmp_path, env=full, capture_output=True, text=True, timeout=120)


def test_submitit_names_are_tsm_modules_here_and_in_children(tmp_path: Path) -> None:
    code = ("import subprocess, sys, submitit, tsm.submitit\n"
            "from submitit.core import core\nimport tsm.submitit.core.core as c\n"
            "print(submitit is tsm.submitit, core is c, submitit.AutoExecutor.__module__)\n"
            "subprocess.run([sys.executable, '-c', 'import submitit.helpers as h; print(h.__name__)'], check=True)\n")
    out = run(["-m", "tsm.submitit_alias", "-c", code], tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["True True tsm.submitit.auto.auto", "tsm.submitit.helpers"]


def test_a_path_tsm_lacks_names_the_compat_page(tmp_path: Path) -> None:
    out = run(["-m", "tsm.submitit_alias", "-c", "import submitit.no_such"], tmp_path)
    assert out.returncode == 1 and "No module named 'submitit.no_such'" in out.stderr and "docs/submitit.md" in out.stderr


def test_never_on_by_default_and_never_over_a_real_submitit_unless_shadowed(tmp_path: Path) -> None:
    assert run(["-c", "import tsm.submitit; import submitit"], tmp_path).returncode == 1
    real = tmp_path / "site" / "submitit"
    real.mkdir(parents=True)
    (real / "__init__.py").write_text("")
    refused = run(["-m", "tsm.submitit_alias", "-c", "pass"], tmp_path, PYTHONPATH=str(tmp_path / "site"))
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1 and "--shadow" in refused.stderr
    shadowed = run(["-m", "tsm.submitit_alias", "--shadow", "-c", "import submitit, tsm.submitit as t; print(submitit is t)"],
                   tmp_path, PYTHONPATH=str(tmp_path / "site"))
    assert shadowed.returncode == 0 and shadowed.stdout.strip() == "True"


def test_a_folder_of_submitit_files_supplies_what_tsm_lacks(tmp_path: Path) -> None:
    own = tmp_path / "mine" / "submitit" / "core"
    own.mkdir(parents=True)
    (own / "test_mine.py").write_text("from . import core\nfrom .. import helpers\nVALUE = core.Job.__name__\n")
    code = ("import submitit.core.test_mine as m\nfrom tsm.submitit.core import test_mine as t\n"
            "print(m.VALUE, m is t, m.helpers.__name__)")
    out = run(["-m", "tsm.submitit_alias", "-c", code], tmp_path, PYTHONPATH=str(tmp_path / "mine"))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "Job True tsm.submitit.helpers"


def test_usage_error_is_exit_2(tmp_path: Path) -> None:
    out = run(["-m", "tsm.submitit_alias"], tmp_path)
    assert out.returncode == 2 and out.stderr.startswith("usage: python -m tsm.submitit_alias")
