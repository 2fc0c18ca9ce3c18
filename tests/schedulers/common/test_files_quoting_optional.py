"""The small kit modules: private files, shell quoting, optional client imports."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tsm.errors import SchedulerUnavailableError
from tsm.schedulers.common.files import make_private_dirs, read_text, rmdir, unlink, write_private
from tsm.schedulers.common.optional import import_client
from tsm.schedulers.common.quoting import is_shell_name, shell_quote


@pytest.mark.parametrize("umask", [0, 0o277])
def test_private_dirs_and_files_whatever_the_umask(tmp_path: Path, umask: int) -> None:
    old = os.umask(umask)
    try:
        make_private_dirs(tmp_path / "a" / "b")
        write_private(tmp_path / "a" / "b" / "f", "x\udcff")
    finally:
        os.umask(old)
    assert (tmp_path / "a").stat().st_mode & 0o777 == 0o700
    assert (tmp_path / "a" / "b").stat().st_mode & 0o777 == 0o700
    assert (tmp_path / "a" / "b" / "f").stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "a" / "b" / "f").read_bytes() == b"x\xff"
    assert read_text(tmp_path / "missing") is None
    (tmp_path / "a" / "keep").write_text("not ours")
    assert unlink(tmp_path / "a" / "b" / "f") and not unlink(tmp_path / "a" / "b" / "f")
    rmdir(tmp_path / "a" / "b")
    rmdir(tmp_path / "a")  # not empty: stays
    assert (tmp_path / "a" / "keep").exists() and not (tmp_path / "a" / "b").exists()


@pytest.mark.parametrize(
    "value", ["", "a b", "'", "$(id)", "`id`", "a\nb", "cr\r\nlf", "\x01\x7f", "é ✓", "\\'"]
)
def test_shell_quote_round_trips_through_bash(value: str) -> None:
    out = subprocess.run(
        ["bash", "-c", f"printf %s {shell_quote(value)}"], capture_output=True, check=True
    ).stdout
    assert out == value.encode()
    assert "\r" not in shell_quote(value)  # sbatch refuses scripts with a CR


def test_shell_names() -> None:
    assert is_shell_name("A_1") and is_shell_name("_x")
    assert not is_shell_name("1A") and not is_shell_name("--unset") and not is_shell_name("a-b")


def test_import_client_names_the_extra() -> None:
    assert import_client("json", extra="x", backend="b").dumps(1) == "1"
    with pytest.raises(SchedulerUnavailableError, match=r"pip install 'tsm\[kube\]'") as e:
        import_client("no_such_client_lib_x.sub", extra="kube", backend="kubernetes")
    assert "the kubernetes scheduler needs the Python package 'no_such_client_lib_x'" in str(e.value)
