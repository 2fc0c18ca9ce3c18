"""The run identity fixed at submit (tsm.tracker.attempts), without a server: what each role's env gets.

W&B and TensorBoard need nothing at submit but the handle, so these run a real dry run through the Runner
and read the roles' env; the user's own value always stays. ``import tsm`` and a submit that uses only
those trackers import no tracker client.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from testutil import HANG
from tsm.runner.api import get_runner
from tsm.specs.api import AppDef, Role
from tsm.tracker.api import TrackerError, tracker_env
from tsm.tracker.attempts import tensorboard_dir, wandb_run_id


def _app(env: dict[str, str] | None = None, roles: int = 1) -> AppDef:
    return AppDef("train", roles=[Role(f"r{i}", entrypoint="true", env=dict(env or {})) for i in range(roles)])


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in ("TSM_JOB_ID", "TORCHX_JOB_ID", "TSM_TRACKERS", "TORCHX_TRACKERS", "MLFLOW_TRACKING_URI", "MLFLOW_RUN_ID",
              "WANDB_RUN_ID", "TSM_TENSORBOARD_DIR"):
        monkeypatch.delenv(k, raising=False)


def test_wandb_id_is_stable_and_in_wandbs_alphabet() -> None:
    assert wandb_run_id("local://default/${app_id}") == "tsm-local-default-${app_id}"
    assert wandb_run_id("slurm://my session:x/1234_5") == wandb_run_id("slurm://my session:x/1234_5")
    assert wandb_run_id("slurm://my.sess/1234_5") == "tsm-slurm-my-sess-1234_5"
    for bad in ":;,#?/'":
        assert bad not in wandb_run_id("k8s://a:b/c")


def test_tensorboard_dir_is_one_per_app(tmp_path: Path) -> None:
    assert tensorboard_dir("local://s/${app_id}", str(tmp_path)) == f"{tmp_path}/local/s/${{app_id}}"
    assert tensorboard_dir("local://s/a1", None).endswith("/tensorboard/local/s/a1")


def test_every_role_gets_the_same_wandb_and_tensorboard_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TSM_TRACKERS", "tsm,wandb,tensorboard")
    monkeypatch.setenv("TSM_TRACKER_TENSORBOARD_CONFIG", str(tmp_path / "tb"))
    monkeypatch.setenv("TSM_TRACKER_WANDB_CONFIG", "proj")
    with get_runner("t") as runner:
        info = runner.dryrun(_app(roles=2), "local")
    assert info.app is not None
    envs = [r.env for r in info.app.roles]
    assert envs[0]["WANDB_RUN_ID"] == "tsm-local-t-${app_id}" and envs[0]["WANDB_RESUME"] == "allow"
    assert envs[0]["WANDB_PROJECT"] == "proj" and "WANDB_RUN_GROUP" not in envs[0]
    assert envs[0]["TSM_TENSORBOARD_DIR"] == envs[0]["AIP_TENSORBOARD_LOG_DIR"] == f"{tmp_path}/tb/local/t/${{app_id}}"
    keys = ("WANDB_RUN_ID", "WANDB_RESUME", "TSM_TENSORBOARD_DIR")
    assert [envs[0][k] for k in keys] == [envs[1][k] for k in keys]
    assert "MLFLOW_RUN_ID" not in envs[0]  # the mlflow tracker is not chosen


def test_the_users_own_values_stay_and_a_sweep_trial_is_grouped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TSM_TRACKERS", "wandb,tensorboard")
    mine = {"WANDB_RUN_ID": "mine", "TSM_TENSORBOARD_DIR": "/my/dir", "TSM_SWEEP_HANDLE": "sweep://t/lr-1a2b"}
    with get_runner("t") as runner:
        info = runner.dryrun(_app(mine), "local")
    assert info.app is not None
    env = info.app.roles[0].env
    assert (env["WANDB_RUN_ID"], env["TSM_TENSORBOARD_DIR"]) == ("mine", "/my/dir")
    assert env["WANDB_RUN_GROUP"] == "lr-1a2b" and env["WANDB_RESUME"] == "allow"


def test_mlflow_without_a_tracking_uri_fixes_no_run_and_an_unreachable_one_refuses_the_launch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    env = tracker_env("local://s/${app_id}", environ={"TSM_TRACKERS": "mlflow"}, app=_app())
    assert "MLFLOW_RUN_ID" not in env and env["TSM_TRACKERS"] == "mlflow"
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # MLflow's own setting (its default retries for minutes)
    with pytest.raises(TrackerError, match="mlflow tracker: cannot create the app's run at http://127.0.0.1:9"):
        tracker_env("local://s/${app_id}", environ={"TSM_TRACKERS": "mlflow", "MLFLOW_TRACKING_URI": "http://127.0.0.1:9"},
                    app=_app())


def test_a_role_that_brings_its_mlflow_run_needs_no_server() -> None:
    env = tracker_env("local://s/${app_id}", environ={"TSM_TRACKERS": "mlflow", "MLFLOW_TRACKING_URI": "http://127.0.0.1:9"},
                      app=_app({"MLFLOW_RUN_ID": "abc"}))
    assert env["MLFLOW_TRACKING_URI"] == "http://127.0.0.1:9" and "MLFLOW_RUN_ID" not in env


def test_import_tsm_and_a_wandb_tensorboard_submit_import_no_tracker_client(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "import tsm, tsm.tracker\n"
        "from tsm.specs.api import AppDef, Role\n"
        "from tsm.tracker.api import tracker_env\n"
        "app = AppDef('a', roles=[Role('r', entrypoint='true')])\n"
        "env = tracker_env('local://s/${app_id}', environ={'TSM_TRACKERS': 'tsm,wandb,tensorboard,mlflow'}, app=app)\n"
        "assert env['WANDB_RUN_ID'], env\n"
        "heavy = [m for m in ('mlflow', 'wandb', 'tensorboard') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=HANG, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
