"""One tracker run per app across its attempts, against the real clients: a real MLflow tracking server on
loopback (started here, sqlite backend), W&B in offline mode (its run directories under a tmp dir), and
TensorBoard event files read back with tensorboard's own reader.

A local app with ``max_retries=1`` logs a metric and fails, then logs another and succeeds: its two attempts
are two processes with the env they were submitted with. A sweep of 4 trials is one MLflow parent run with
4 children. Nothing is mocked.
"""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tsm.runner.api import Runner, get_runner
from tsm.specs.api import AppDef, AppState, Role
from tsm.tracker.attempts import tensorboard_dir, wandb_run_id

mlflow = pytest.importorskip("mlflow")  # tsm[mlflow]: `make test` installs it (the $(VENV)/.trackers stamp)

@pytest.fixture
def runner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mlflow_uri: str) -> Iterator[Runner]:
    for k in ("TSM_JOB_ID", "TORCHX_JOB_ID", "TSM_PARENT_RUN_ID", "TORCHX_PARENT_RUN_ID", "MLFLOW_RUN_ID",
              "MLFLOW_EXPERIMENT_ID", "MLFLOW_EXPERIMENT_NAME", "WANDB_RUN_ID"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("TSM_TRACKERS", "mlflow,wandb,tensorboard")
    monkeypatch.setenv("TSM_TRACKER_MLFLOW_CONFIG", mlflow_uri)
    monkeypatch.setenv("TSM_TRACKER_TENSORBOARD_CONFIG", str(tmp_path / "tb"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.chdir(tmp_path)
    with get_runner("trk") as r:
        yield r
        for app in r.list("local"):
            if not app.state.is_terminal:
                r.cancel(app.app_handle)


#: The replica: attempt 1 (no marker yet) logs step 0 and fails; attempt 2 logs step 1 and succeeds. Both use
#: the clients as a user would (``mlflow.start_run()``, ``wandb.init()`` with no id) and tsm's AppRun.
ATTEMPT = """
    import os, sys
    from pathlib import Path
    out = Path(os.environ["OUT"])
    step = 1 if (out / "first-done").exists() else 0
    import mlflow
    run = mlflow.start_run()
    mlflow.log_metric("user_loss", 1.0 - step / 2, step=step)
    import wandb
    wrun = wandb.init()
    wrun.log({"w_loss": 1.0 - step / 2}, step=step)
    from tsm.tracker import AppRun
    AppRun.run_from_env().log_metrics(step=step, loss=2.0 - step)
    (out / f"attempt-{step}").write_text(run.info.run_id + " " + wrun.id)
    wrun.finish()
    mlflow.end_run("FAILED" if step == 0 else "FINISHED")
    (out / "first-done").write_text("")
    sys.exit(1 if step == 0 else 0)
"""


def _wandb_env(tmp_path: Path) -> dict[str, str]:
    wdir = tmp_path / "wandb"
    wdir.mkdir(exist_ok=True)
    return {"WANDB_MODE": "offline", "WANDB_DIR": str(wdir), "WANDB_CONFIG_DIR": str(wdir / "config"),
            "WANDB_CACHE_DIR": str(wdir / "cache"), "WANDB_DATA_DIR": str(wdir / "data"), "WANDB_SILENT": "true",
            "WANDB_DISABLE_GIT": "true", "WANDB_PROJECT": "tsm-test"}


def test_a_retried_app_is_one_mlflow_run_one_wandb_id_and_one_tensorboard_dir(runner: Runner, tmp_path: Path,
                                                                               mlflow_uri: str) -> None:
    out = tmp_path / "out"
    out.mkdir()
    env = {"OUT": str(out), **_wandb_env(tmp_path)}
    role = Role("train", entrypoint=sys.executable, args=["-c", textwrap.dedent(ATTEMPT)], env=env, max_retries=1)
    handle = runner.run(AppDef("retried", roles=[role]), "local")
    status = runner.wait(handle, timeout=600)
    logs = "".join(runner.log_lines(handle, "train", 0))
    assert status is not None and status.state == AppState.SUCCEEDED, f"{status}\n{logs}"
    assert status.num_restarts == 1 or (out / "attempt-0").exists(), status

    # MLflow: one run tagged with the handle, holding both attempts' points of both metrics
    client = mlflow.tracking.MlflowClient(mlflow_uri)
    runs = client.search_runs(["0"], filter_string=f"tags.`tsm.app_handle` = '{handle}'")
    assert len(runs) == 1, [r.data.tags for r in runs]
    run_id = runs[0].info.run_id
    seen = [(out / f"attempt-{i}").read_text().split() for i in (0, 1)]
    assert [s[0] for s in seen] == [run_id, run_id]
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "user_loss")] == [(0, 1.0), (1, 0.5)]
    assert sorted((m.step, m.value) for m in client.get_metric_history(run_id, "loss")) == [(0, 2.0), (1, 1.0)]
    assert client.get_run(run_id).info.status == "FINISHED"

    # W&B: both attempts' offline runs carry the one id derived from the handle
    wid = wandb_run_id(handle)
    assert [s[1] for s in seen] == [wid, wid]
    offline = sorted(p.name for p in (tmp_path / "wandb" / "wandb").glob("offline-run-*"))
    assert len(offline) == 2 and all(name.endswith(f"-{wid}") for name in offline), offline

    # TensorBoard: each attempt's event file in the app's one directory, read back as one series
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logdir = Path(tensorboard_dir(handle, str(tmp_path / "tb")))
    assert len(list(logdir.glob("events.out.tfevents.*"))) == 2, list(logdir.iterdir())
    acc = EventAccumulator(str(logdir))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("loss")] == [(0, 2.0), (1, 1.0)]


def test_a_sweep_of_4_trials_is_one_mlflow_parent_with_4_children(runner: Runner, tmp_path: Path,
                                                                    mlflow_uri: str) -> None:
    from tsm.sweep import run_sweep, sweep_trials, sweep_wait

    component = tmp_path / "trial.py"
    component.write_text(textwrap.dedent('''
        from tsm import AppDef, Role


        def trial(lr: float = 0.1) -> AppDef:
            return AppDef("trial", roles=[Role("t", entrypoint="true")])
    '''))
    sweep = run_sweep(runner, f"{component}:trial", {"lr": "0.1,0.2,0.3,0.4"}, scheduler="local", parallel=2)
    status = sweep_wait(sweep, timeout=600)
    assert status.state == "SUCCEEDED", status
    handles = sorted(str(t.handle) for t in sweep_trials(sweep))
    assert len(handles) == 4

    client = mlflow.tracking.MlflowClient(mlflow_uri)
    parents = client.search_runs(["0"], filter_string=f"tags.`tsm.sweep` = '{sweep}' and tags.`tsm.kind` = 'sweep'")
    assert len(parents) == 1, [p.data.tags for p in parents]
    children = client.search_runs(["0"], filter_string=f"tags.`mlflow.parentRunId` = '{parents[0].info.run_id}'")
    assert sorted(c.data.tags["tsm.app_handle"] for c in children) == handles
    assert {c.data.tags["tsm.sweep"] for c in children} == {sweep}


def test_the_mlflow_tracker_reads_back_what_apprun_wrote(runner: Runner, mlflow_uri: str) -> None:
    from tsm.tracker.api import AppRun, UnknownRunError, build_trackers

    (tracker,) = build_trackers({"mlflow": mlflow_uri})
    child, parent = "local://trk/child-1", "local://trk/parent-1"
    run = AppRun(child, [tracker])
    run.add_metadata(lr=0.01, name="base", layers=[1, 2])
    run.add_artifact("model", "/ckpt/m.pt", {"bytes": 3})
    run.add_source(parent)
    run.add_source(parent)
    run.log_metrics(step=3, loss=0.25)
    assert run.metadata() == {"lr": 0.01, "name": "base", "layers": [1, 2]}
    assert (run.artifacts()["model"].path, run.artifacts()["model"].metadata) == ("/ckpt/m.pt", {"bytes": 3})
    assert [s.parent.job_id() for s in run.sources()] == [parent]
    assert [c.job_id() for c in AppRun(parent, [tracker]).children()] == [child]
    assert child in list(tracker.run_ids())
    mlflow_id = tracker.mlflow_run_id(child)  # type: ignore[attr-defined]
    history = mlflow.tracking.MlflowClient(mlflow_uri).get_metric_history(mlflow_id, "loss")
    assert [(m.step, m.value) for m in history] == [(3, 0.25)]
    with pytest.raises(UnknownRunError):
        tracker.metadata("local://trk/never")
