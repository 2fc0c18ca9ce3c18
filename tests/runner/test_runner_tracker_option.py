"""The ``trackers`` run option (``-c trackers=tsm,tensorboard``): it chooses an app's trackers over the launcher's
``TSM_TRACKERS`` and the config files, on every scheduler, and an unknown name is refused at dry run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tsm.components.utils import sh
from tsm.errors import InvalidRunOptionError, TrackerError
from tsm.runner.api import get_runner


def test_the_option_chooses_the_trackers_over_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TSM_TRACKERS", "mlflow")  # would need a tracking server at submit: the option wins
    monkeypatch.setenv("TSM_TRACKER_TENSORBOARD_CONFIG", str(tmp_path / "tb"))
    with get_runner() as r:
        info = r.dryrun(sh("true"), "local", cfg={"trackers": ["tsm", "tensorboard"]})
        assert info.app is not None and "trackers" not in info.cfg
        env = info.app.roles[0].env
        assert env["TSM_TRACKERS"] == "tsm,tensorboard" and env["TORCHX_TRACKERS"] == "tsm,tensorboard"
        assert env["TSM_TENSORBOARD_DIR"].startswith(str(tmp_path / "tb"))
        with pytest.raises(TrackerError, match="unknown tracker 'nope'"):
            r.dryrun(sh("true"), "local", cfg={"trackers": ["nope"]})
        with pytest.raises(InvalidRunOptionError):
            r.dryrun(sh("true"), "local", cfg={"trackers": 3})  # type: ignore[dict-item]


def test_the_command_line_takes_it(tmp_path: Path) -> None:
    env = {**os.environ, "TSM_CLI_SERVER": "0", "TSM_TRACKERS": "mlflow"}
    out = subprocess.run([sys.executable, "-m", "tsm.cli.main", "dryrun", "-c", "trackers=tsm", "utils.echo"],
                         capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert "TSM_TRACKERS=tsm" in out.stdout.replace("'", "").replace('"', "").replace(": ", "=")
