"""The plan of an environment: its lock checked at dry run, and a key that covers exactly what it says."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tsm.env.spec import IndexSettings, content_key, kind_of, plan
from tsm.errors import InvalidAppError, InvalidRunOptionError
from tsm.specs.environment import Environment


def test_same_lock_in_two_folders_is_one_key(lock: Path, tmp_path: Path) -> None:
    other = tmp_path / "copy"
    shutil.copytree(lock.parent, other)
    a = plan(Environment(str(lock), "3.11"))
    b = plan(Environment(str(other / "uv.lock"), "3.11"))
    assert a.key == b.key and a.lock != b.lock


def test_key_changes_with_lock_project_python_platform_and_index(lock: Path, wheelhouse: Path) -> None:
    base = plan(Environment(str(lock), "3.11")).key
    assert plan(Environment(str(lock), "3.12")).key != base
    assert plan(Environment(str(lock), "3.11"), platform="linux-aarch64").key != base
    assert plan(Environment(str(lock), "3.11"), IndexSettings(find_links=(str(wheelhouse),))).key != base
    assert plan(Environment(str(lock), "3.11"), IndexSettings(index_url="https://example.invalid/simple")).key != base
    pyproject = lock.parent / "pyproject.toml"
    pyproject.write_text(pyproject.read_text() + "\n# edited\n")
    assert plan(Environment(str(lock), "3.11")).key != base


def test_key_covers_uv_index_settings_from_the_environment() -> None:
    s = IndexSettings()
    a = content_key("pylock", b"x", b"", "3.11", "linux-x86_64", s, environ={})
    b = content_key("pylock", b"x", b"", "3.11", "linux-x86_64", s, environ={"UV_INDEX_URL": "https://i/simple"})
    assert a != b and len(a) == 16


def test_kinds_by_file_name() -> None:
    assert kind_of("/x/uv.lock") == "uv.lock"
    assert kind_of("/x/pylock.toml") == "pylock"
    assert kind_of("/x/pylock.train.toml") == "pylock"
    assert kind_of("/x/requirements-gpu.txt") == "requirements"
    with pytest.raises(InvalidAppError, match="not a uv.lock"):
        kind_of("/x/environment.yml")


def test_malformed_uv_lock_is_refused_with_its_file(lock: Path) -> None:
    lock.write_text("version = [[\n")
    with pytest.raises(InvalidAppError, match=r"uv\.lock is not valid TOML"):
        plan(Environment(str(lock)))


def test_uv_lock_without_its_pyproject_is_refused(lock: Path) -> None:
    (lock.parent / "pyproject.toml").unlink()
    with pytest.raises(InvalidAppError, match="pyproject.toml beside uv.lock"):
        plan(Environment(str(lock)))


def test_missing_lock_and_bad_python_are_refused(tmp_path: Path, lock: Path) -> None:
    with pytest.raises(InvalidAppError, match="cannot read"):
        plan(Environment(str(tmp_path / "nope" / "uv.lock")))
    with pytest.raises(InvalidAppError, match="not a version"):
        plan(Environment(str(lock), "python3; rm -rf /"))


def test_pylock_needs_its_version_key(tmp_path: Path) -> None:
    f = tmp_path / "pylock.toml"
    f.write_text('[[packages]]\nname = "x"\n')
    with pytest.raises(InvalidAppError, match="lock-version"):
        plan(Environment(str(f)))
    f.write_text('lock-version = "1.0"\n[[packages]]\nname = "x"\n')
    assert plan(Environment(str(f))).kind == "pylock"


def test_requirements_with_partial_hashes_are_refused(tmp_path: Path) -> None:
    f = tmp_path / "requirements.txt"
    f.write_text("a==1 \\\n    --hash=sha256:" + "0" * 64 + "\nb==2  # no hash\n")
    with pytest.raises(InvalidAppError, match="'b==2'"):
        plan(Environment(str(f)))
    f.write_text("# all pinned\na==1 --hash=sha256:" + "0" * 64 + "\n--find-links /w\n")
    assert plan(Environment(str(f))).kind == "requirements"


def test_find_links_must_be_a_folder(lock: Path, tmp_path: Path) -> None:
    with pytest.raises(InvalidRunOptionError, match="find_links"):
        plan(Environment(str(lock)), IndexSettings(find_links=(str(tmp_path / "none"),)))


def test_plan_round_trips_through_a_request_file(lock: Path, wheelhouse: Path) -> None:
    p = plan(Environment(str(lock), "3.11"), IndexSettings(find_links=(str(wheelhouse),)))
    from tsm.env.spec import EnvPlan

    assert EnvPlan.from_dict(p.to_dict()) == p
    assert p.settings.offline


def test_a_built_key_is_not_parsed_again(lock: Path) -> None:
    """A warm launch reads and hashes the lock, but does not parse what already built (the check is for builds)."""
    lock.write_text("version = [[\n")
    seen: list[str] = []
    p = plan(Environment(str(lock)), built=lambda key: seen.append(key) or True)
    assert seen == [p.key]
    with pytest.raises(InvalidAppError, match="not valid TOML"):
        plan(Environment(str(lock)), built=lambda key: False)
