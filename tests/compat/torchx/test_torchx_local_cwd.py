"""``local_cwd`` on tsm's local scheduler: an image that is not a directory is ignored, as TorchX's local_cwd does."""

from __future__ import annotations

from pathlib import Path

import pytest

from tsm.errors import InvalidAppError, InvalidRunOptionError
from tsm.runner.api import get_runner
from tsm.specs import AppDef, AppState, Role


def _app(image: str) -> AppDef:
    # TorchX's custom-component guide: a component written for a container image, run locally
    return AppDef("guide", [Role("guide", image=image, entrypoint="python", args=["-c", "import os; print(os.getcwd())"])])


def test_a_container_image_name_runs_in_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tsm_home: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    with get_runner() as r:
        with pytest.raises(InvalidAppError, match="is not a directory"):
            r.dryrun(_app("my_app:latest"), "local")  # tsm's local keeps its rule
        handle = r.run(_app("my_app:latest"), "local_cwd")
        status = r.wait(handle, timeout=120)
        assert status is not None and status.state == AppState.SUCCEEDED, status
        assert "".join(r.log_lines(handle, "guide")).strip() == str(tmp_path)


def test_a_directory_image_is_still_where_the_role_runs(tmp_path: Path, tsm_home: Path) -> None:
    (tmp_path / "img").mkdir()
    with get_runner() as r:
        info = r.dryrun(_app(str(tmp_path / "img")), "local_cwd")
    assert str(tmp_path / "img") in str(info)


@pytest.mark.parametrize("size", [1, 100])
def test_torchxs_cache_size_is_taken(size: int, tsm_home: Path) -> None:
    with get_runner(cache_size=size) as r:
        r.dryrun(_app(""), "local_cwd")


@pytest.mark.parametrize("size", [0, -1, "10", True])
def test_a_bad_cache_size_is_refused(size: object, tsm_home: Path) -> None:
    with get_runner(cache_size=size) as r, pytest.raises(InvalidRunOptionError, match="cache_size"):
        r.dryrun(_app(""), "local_cwd")
