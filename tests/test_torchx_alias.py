"""``python -m tsm.torchx_alias``: ``import torchx...`` is tsm in that process tree, only when asked for."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SRC = str(Path(__file__).resolve().parents[1] / "src")


def run(args: list[str], tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "PYTHONPATH": SRC + os.pathsep + env.pop("PYTHONPATH", ""), "TSM_HOME": str(tmp_path / "home"),
            **env}
    full.pop("TSM_TORCHX_ALIAS", None)
    return subprocess.run([sys.executable, *args], cwd=tmp_path, env=full, capture_output=True, text=True, timeout=60)


def test_torchx_names_are_tsm_modules_here_and_in_child_processes(tmp_path: Path) -> None:
    code = (
        "import subprocess, sys, torchx, tsm\n"
        "import torchx.specs.api as a, tsm.specs.api as b\n"
        "from torchx.schedulers.local_scheduler import LocalScheduler\n"
        "from torchx.specs import AppDef\n"
        "print(torchx is tsm, a is b, AppDef.__module__, sys.argv[1:])\n"
        "subprocess.run([sys.executable, '-c', 'import torchx.runner.config as r; print(r.__name__)'], check=True)\n"
    )
    out = run(["-m", "tsm.torchx_alias", "-c", code, "x", "y"], tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["True True tsm.specs.api ['x', 'y']", "tsm.runner.config"]


def test_a_torchx_path_the_wing_has_is_the_wings_module(tmp_path: Path) -> None:
    code = (
        "import torchx.runner, torchx.runner.api as r, torchx.runner.config as c, torchx.specs as s, tsm.specs\n"
        "import torchx.specs.finder as f, torchx.schedulers.local_scheduler as ls, tsm.schedulers.local_scheduler as st\n"
        "print(r.__name__, c.__name__, f.__name__, ls.__name__)\n"
        "print(torchx.runner.Runner is r.Runner, s.AppDef is tsm.specs.AppDef, st.LocalScheduler is ls.LocalScheduler)\n"
    )
    out = run(["-m", "tsm.torchx_alias", "-c", code], tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "tsm.compat.torchx.runner.api tsm.runner.config tsm.compat.torchx.specs.finder "
        "tsm.compat.torchx.schedulers.local_scheduler",
        "True True True",
    ]


def test_a_torchx_folder_that_is_no_package_supplies_what_tsm_lacks(tmp_path: Path) -> None:
    # a program's own files at TorchX paths (TorchX's tests, their fixtures): read from the folder
    mine = tmp_path / "mine" / "torchx" / "specs" / "test"
    mine.mkdir(parents=True)
    (mine / "__init__.py").write_text("")
    (mine / "helper.py").write_text("from torchx.specs import AppDef\nNAME = AppDef.__module__\n")
    code = "from torchx.specs.test.helper import NAME; import torchx.specs.test as t; print(NAME, t.__name__)"
    out = run(["-m", "tsm.torchx_alias", "-c", code], tmp_path, PYTHONPATH=str(tmp_path / "mine"))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "tsm.specs.api torchx.specs.test"
    # a real torchx (a package) is never read for a name tsm lacks, even when shadowed
    real = tmp_path / "site" / "torchx" / "specs" / "test"
    real.mkdir(parents=True)
    (real.parent.parent / "__init__.py").write_text("")
    (real / "__init__.py").write_text("")
    (real / "helper.py").write_text("NAME = 'real'\n")
    out = run(["-m", "tsm.torchx_alias", "--shadow", "-c", "import torchx.specs.test.helper"], tmp_path,
              PYTHONPATH=str(tmp_path / "site"))
    assert out.returncode == 1 and "No module named 'torchx.specs.test'" in out.stderr


def test_scripts_and_modules_run_as_main(tmp_path: Path) -> None:
    (tmp_path / "prog.py").write_text("import sys\nfrom torchx.util.types import none_throws\nprint(__name__, none_throws(1), sys.argv)\n")
    out = run(["-m", "tsm.torchx_alias", "prog.py", "--flag"], tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "__main__ 1 ['prog.py', '--flag']"
    out = run(["-m", "tsm.torchx_alias", "-m", "prog", "a"], tmp_path, PYTHONPATH=str(tmp_path))
    assert out.stdout.strip() == f"__main__ 1 [{str(tmp_path / 'prog.py')!r}, 'a']", out.stderr  # as python -m sets it


def test_a_torchx_path_tsm_lacks_names_itself(tmp_path: Path) -> None:
    out = run(["-m", "tsm.torchx_alias", "-c", "import torchx.no_such_module"], tmp_path)
    assert out.returncode == 1
    assert "No module named 'torchx.no_such_module'" in out.stderr and "torchx-compat.md" in out.stderr


def test_never_on_by_default(tmp_path: Path) -> None:
    out = run(["-c", "import tsm, tsm.specs, tsm.runner.api\nimport torchx"], tmp_path)
    assert out.returncode == 1 and "No module named 'torchx'" in out.stderr


def test_refuses_a_real_torchx_unless_shadowed(tmp_path: Path) -> None:
    real = tmp_path / "site" / "torchx"
    real.mkdir(parents=True)
    (real / "__init__.py").write_text("")
    refused = run(["-m", "tsm.torchx_alias", "-c", "pass"], tmp_path, PYTHONPATH=str(tmp_path / "site"))
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1 and "--shadow" in refused.stderr
    shadowed = run(["-m", "tsm.torchx_alias", "--shadow", "-c", "import torchx, tsm; print(torchx is tsm)"], tmp_path,
                   PYTHONPATH=str(tmp_path / "site"))
    assert shadowed.returncode == 0 and shadowed.stdout.strip() == "True"


def test_usage_error_is_exit_2(tmp_path: Path) -> None:
    out = run(["-m", "tsm.torchx_alias"], tmp_path)
    assert out.returncode == 2 and out.stderr.startswith("usage: python -m tsm.torchx_alias")


def test_install_and_uninstall_in_process() -> None:
    from tsm import torchx_alias

    assert not torchx_alias.installed()
    torchx_alias.install()
    try:
        import torchx.specs as ts  # type: ignore[import-not-found]

        import tsm.specs

        assert ts.AppDef is tsm.specs.AppDef  # torchx.specs is TorchX's face of the package
    finally:
        torchx_alias.uninstall()
        for name in [n for n in sys.modules if n == "torchx" or n.startswith("torchx.")]:
            del sys.modules[name]
    assert not torchx_alias.installed()
    with pytest.raises(ModuleNotFoundError):
        import torchx  # noqa: F401
