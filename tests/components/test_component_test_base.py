"""ComponentTestCase, as a user's test suite uses it: real unittest runs, real local apps."""

from __future__ import annotations

import importlib.util
import os
import sys
import time
import unittest
import uuid
from pathlib import Path
from types import ModuleType

import pytest

import tsm.components.utils as utils
from tsm.components.component_test_base import ComponentTestCase
from tsm.specs.api import AppDef, AppState, Role

USER_MODULE = '''
from typing import Dict, List, Optional
from tsm.specs.api import AppDef, Role


def good(msg: str, times: int = 1, tags: Optional[List[str]] = None, env: Dict[str, int] = {}) -> AppDef:
    """Echo a message.

    Args:
        msg: what to say
        times: how many replicas
        tags: labels
        env: numbers
    """
    return AppDef("good", roles=[Role("good", entrypoint="echo", args=[msg], num_replicas=times)])


def unannotated(msg) -> AppDef:
    """Missing an annotation."""
    return AppDef("bad", roles=[Role("bad", entrypoint="echo", args=[msg])])
'''


def load(tmp_path: Path) -> ModuleType:
    path = tmp_path / f"user_components_{uuid.uuid4().hex[:8]}.py"
    path.write_text(USER_MODULE)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module


def run_case(case: type[unittest.TestCase], name: str) -> unittest.TestResult:
    result = unittest.TestResult()
    case(name).run(result)
    return result


def test_validate_passes_good_components_and_fails_bad_ones(tmp_path: Path) -> None:
    module = load(tmp_path)

    class UserTest(ComponentTestCase):
        def test_good(self) -> None:
            self.validate(module, "good")

        def test_builtin(self) -> None:
            self.validate(utils, "copy")

        def test_bad(self) -> None:
            self.validate(module, "unannotated")

        def test_missing(self) -> None:
            self.validate(module, "nope")

    assert run_case(UserTest, "test_good").wasSuccessful()
    assert run_case(UserTest, "test_builtin").wasSuccessful()
    bad = run_case(UserTest, "test_bad")
    assert len(bad.failures) == 1 and "parameter 'msg' has no type annotation" in bad.failures[0][1]
    missing = run_case(UserTest, "test_missing")
    assert len(missing.failures) == 1 and "function 'nope' not found" in missing.failures[0][1]


def test_each_test_has_a_scratch_folder_which_is_removed_and_keeps_the_working_directory() -> None:
    seen: dict[str, str] = {}
    before = os.getcwd()

    class UserTest(ComponentTestCase):
        def test_dir(self) -> None:
            seen["dir"] = self.test_dir
            seen["cwd"] = os.getcwd()
            seen["exists"] = str(os.path.isdir(self.test_dir))

    assert run_case(UserTest, "test_dir").wasSuccessful()
    assert seen["cwd"] == before and seen["exists"] == "True"
    assert not os.path.exists(seen["dir"]) and os.getcwd() == before


def script_component(script: str) -> AppDef:
    """Runs a Python script named relative to the working directory.

    Args:
        script: the script
    """
    return AppDef("script", [Role("script", image="my_app:latest", entrypoint="python", args=[script])])


def test_run_component_runs_a_script_relative_to_the_tests_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the README's example: the component names train.py, beside the test; the image is a container's name,
    # which local_cwd (the default, TorchX's) ignores
    (tmp_path / "train.py").write_text("print('trained')\n")
    monkeypatch.chdir(tmp_path)
    got = {}

    class UserTest(ComponentTestCase):
        def test_train(self) -> None:
            got["status"] = self.run_component(script_component, {"script": "train.py"}, timeout=60)

    assert run_case(UserTest, "test_train").wasSuccessful()
    status = got["status"]
    assert status is not None and status.state == AppState.SUCCEEDED, status


def test_run_component_returns_the_final_status() -> None:
    got = {}

    class UserTest(ComponentTestCase):
        def test_echo(self) -> None:
            got["status"] = self.run_component(utils.echo, {"msg": "hi", "num_replicas": 2}, timeout=60)

    assert run_case(UserTest, "test_echo").wasSuccessful()
    status = got["status"]
    assert status is not None and status.state == AppState.SUCCEEDED


def sleeper(marker: str) -> AppDef:
    """Sleeps for a long time.

    Args:
        marker: a unique sleep length to find the process by
    """
    return AppDef("sleeper", roles=[Role("sleeper", entrypoint="sleep", args=[marker])])


def test_an_app_still_running_at_the_end_of_the_test_is_cancelled() -> None:
    marker = f"1000.{uuid.uuid4().int % 10**6}"
    got = {}

    class UserTest(ComponentTestCase):
        def test_sleep(self) -> None:
            got["status"] = self.run_component(sleeper, {"marker": marker}, timeout=0.5)

    assert run_case(UserTest, "test_sleep").wasSuccessful()
    assert got["status"] is not None and not got["status"].is_terminal()
    deadline = time.monotonic() + 30
    while any(_cmdline_has(marker, pid) for pid in _pids()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_cmdline_has(marker, pid) for pid in _pids()), "the sleeper outlived its test"


def _pids() -> list[str]:
    return [p for p in os.listdir("/proc") if p.isdigit()]


def _cmdline_has(marker: str, pid: str) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return marker.encode() in f.read()
    except OSError:
        return False
