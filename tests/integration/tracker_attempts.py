"""The program and the check of the tests that preempt a replica logging to MLflow and W&B (a Slurm requeue,
a Kubernetes eviction): both attempts must write into one MLflow run and carry one ``WANDB_RUN_ID``."""

from __future__ import annotations

import textwrap
from pathlib import Path

#: Attempt 0 logs step 0 and waits to be preempted; attempt 1 (after the restart) logs step 1 and ends.
PREEMPTED = textwrap.dedent(
    """
    import os, time
    from pathlib import Path
    import tsm.lifecycle as lc
    out = Path(os.environ["OUT"])
    step = lc.attempt()
    import mlflow
    run = mlflow.start_run()
    mlflow.log_metric("loss", 1.0 - step / 2, step=step)
    import wandb
    wrun = wandb.init()
    wrun.log({"w_loss": 1.0 - step / 2}, step=step)
    wrun.finish()
    (out / f"attempt-{step}").write_text(run.info.run_id + " " + wrun.id)
    if step == 0:
        while True:
            time.sleep(0.5)
    mlflow.end_run()
    """
)


def offline_wandb_env(wdir: Path) -> dict[str, str]:
    """The variables that keep W&B offline, quiet and inside ``wdir``."""
    return {"WANDB_MODE": "offline", "WANDB_DIR": str(wdir), "WANDB_CONFIG_DIR": str(wdir / "c"),
            "WANDB_CACHE_DIR": str(wdir / "cache"), "WANDB_DATA_DIR": str(wdir / "d"), "WANDB_SILENT": "true",
            "WANDB_DISABLE_GIT": "true", "WANDB_PROJECT": "tsm-test"}


def assert_one_run_across_attempts(uri: str, handle: str, out: Path, wdir: Path, recreated: bool = False) -> None:
    """Attempts 0 and 1 of ``handle`` (their ``out/attempt-N`` files) wrote into the one MLflow run of the app
    at ``uri``, which holds both steps, and into W&B runs of one id, offline under ``wdir``. ``recreated``: the
    engine may run attempt 0 again before tsm replaces it (a Kubernetes 1.20 Job remakes an evicted pod), so
    step 0 may be logged twice, by the same run and id."""
    from mlflow.tracking import MlflowClient

    from tsm.tracker.attempts import wandb_run_id

    seen = [(out / f"attempt-{i}").read_text().split() for i in (0, 1)]
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("Default").experiment_id],
                              filter_string=f"tags.`tsm.app_handle` = '{handle}'")
    assert len(runs) == 1 and [s[0] for s in seen] == [runs[0].info.run_id] * 2, (runs, seen)
    history = [(m.step, m.value) for m in client.get_metric_history(runs[0].info.run_id, "loss")]
    assert (sorted(set(history)) if recreated else history) == [(0, 1.0), (1, 0.5)], history
    wid = wandb_run_id(handle)
    assert [s[1] for s in seen] == [wid, wid], seen
    offline = sorted(p.name for p in (wdir / "wandb").glob("offline-run-*"))
    assert (len(offline) >= 2 if recreated else len(offline) == 2), offline
    assert all(n.endswith(f"-{wid}") for n in offline), offline
