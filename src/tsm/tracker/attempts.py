"""One tracker run per app, whatever its attempts: the run identity fixed at submit, in every role's env.

A retried, requeued or preempted replica starts again with the environment it was submitted with (every
scheduler keeps the role's env with the app), so what is put there at submit is what every attempt sees:

======================================  ==========================================================
``MLFLOW_RUN_ID``                       the app's MLflow run, created at submit (``mlflow`` tracker
                                        with a tracking URI), so ``mlflow.start_run()`` resumes it
``TSM_MLFLOW_RUN_ID``                   the same (``mlflow.start_run()`` takes ``MLFLOW_RUN_ID`` out of its env)
``MLFLOW_TRACKING_URI``                 the tracker's config (when given there)
``MLFLOW_EXPERIMENT_ID``                the experiment the run was created in
``WANDB_RUN_ID``                        ``tsm-<scheduler>-<session>-<app id>`` (``wandb`` tracker)
``WANDB_RESUME``                        ``allow``: the second attempt's ``wandb.init()`` resumes it
``WANDB_RUN_GROUP``                     a sweep trial's sweep id (the trials of a sweep, one group)
``WANDB_PROJECT``                       the tracker's config (when given)
``TSM_TENSORBOARD_DIR``                 ``<root>/<scheduler>/<session>/<app id>`` (``tensorboard``)
``AIP_TENSORBOARD_LOG_DIR``             the same directory, under the name Vertex AI training sets
======================================  ==========================================================

A sweep trial (its role env has ``TSM_SWEEP_HANDLE``) is an MLflow child run of the sweep's parent run
(``mlflow.parentRunId``), found or created once per sweep; an app launched from inside a job that has an
MLflow run is that run's child. The app id is only known to the scheduler, so values holding it carry the
``${app_id}`` macro, which each scheduler fills in per replica. Nothing here imports a tracker's client
except the MLflow client, and only when the ``mlflow`` tracker has a tracking URI.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

#: The role env naming the sweep an app is a trial of (set by the sweep on each trial's roles).
ENV_SWEEP = "TSM_SWEEP_HANDLE"
#: The TensorBoard directory of the app (``tensorboard`` tracker).
ENV_TENSORBOARD_DIR = "TSM_TENSORBOARD_DIR"
#: The name Vertex AI custom training gives the TensorBoard log directory; code written for it reads this.
ENV_TENSORBOARD_COMMON = "AIP_TENSORBOARD_LOG_DIR"

MLFLOW_RUN_ID = "MLFLOW_RUN_ID"
#: The same run id under tsm's name: ``mlflow.start_run()`` removes ``MLFLOW_RUN_ID`` from its process's env,
#: and the job's :class:`~tsm.tracker.AppRun` still needs it after that.
TSM_MLFLOW_RUN_ID = "TSM_MLFLOW_RUN_ID"
MLFLOW_TRACKING_URI = "MLFLOW_TRACKING_URI"
MLFLOW_EXPERIMENT_ID = "MLFLOW_EXPERIMENT_ID"
MLFLOW_EXPERIMENT_NAME = "MLFLOW_EXPERIMENT_NAME"
WANDB_RUN_ID = "WANDB_RUN_ID"
WANDB_RESUME = "WANDB_RESUME"
WANDB_RUN_GROUP = "WANDB_RUN_GROUP"
WANDB_PROJECT = "WANDB_PROJECT"

#: MLflow tags tsm sets on the runs it creates.
TAG_HANDLE = "tsm.app_handle"
TAG_SWEEP = "tsm.sweep"
TAG_KIND = "tsm.kind"
TAG_PARENT = "tsm.parent_run_id"
TAG_MLFLOW_PARENT = "mlflow.parentRunId"
TAG_RUN_NAME = "mlflow.runName"

APP_ID_MACRO = "${app_id}"
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")


def split_handle(handle: str) -> tuple[str, str, str]:
    """``scheduler://session/app_id`` (the app id may be the ``${app_id}`` macro) as its three parts."""
    scheduler, _, rest = handle.partition("://")
    session, _, app_id = rest.partition("/")
    return scheduler, session, app_id


def wandb_run_id(handle: str) -> str:
    """The W&B run id of the app ``handle``: stable (the same for every attempt), letters, digits, ``_``, ``-``.

    The app id part is kept as it is (the ``${app_id}`` macro at submit); the scheduler and session are
    folded to W&B's alphabet so that the id is a valid one wherever the app id is.
    """
    scheduler, session, app_id = split_handle(handle)
    prefix = _UNSAFE.sub("-", f"tsm-{scheduler}-{session}").strip("-")
    if app_id != APP_ID_MACRO:
        app_id = _UNSAFE.sub("-", app_id)
    return f"{prefix}-{app_id}"


def tensorboard_dir(handle: str, root: str | None) -> str:
    """The app's TensorBoard directory: ``<root>/<scheduler>/<session>/<app id>`` (root: ``$TSM_HOME/tensorboard``)."""
    if not root:
        from tsm.store import tsm_home

        root = str(tsm_home() / "tensorboard")
    scheduler, session, app_id = split_handle(handle)
    return "/".join((root.rstrip("/"), scheduler, session or "default", app_id))


def sweep_id(sweep_handle: str) -> str:
    """``sweep://<session>/<id>``'s id (what a W&B group is named)."""
    return sweep_handle.rstrip("/").rpartition("/")[2] or sweep_handle


def attempt_env(
    handle: str,
    trackers: Mapping[str, str | None],
    roles_env: Sequence[Mapping[str, str]],
    parent: str | None,
    environ: Mapping[str, str] | None = None,
    app_name: str | None = None,
) -> dict[str, str]:
    """The variables that make every attempt of the app ``handle`` write to the same run of each tracker.

    ``trackers`` is what the launch uses (name: config); ``roles_env`` the roles' own env, whose values win
    (an MLflow run is created only when some role has no ``MLFLOW_RUN_ID`` of its own); ``parent`` the
    launch's parent run (lineage). Raises :class:`~tsm.tracker.api.TrackerError` when the MLflow run cannot
    be created: a launch that was asked for a run it cannot have is refused, not split later.
    """
    environ = os.environ if environ is None else environ
    first: Mapping[str, str] = roles_env[0] if roles_env else {}
    sweep = first.get(ENV_SWEEP)
    env: dict[str, str] = {}
    if "wandb" in trackers:
        env[WANDB_RUN_ID] = wandb_run_id(handle)
        env[WANDB_RESUME] = "allow"
        if sweep:
            env[WANDB_RUN_GROUP] = sweep_id(sweep)
        if trackers["wandb"]:
            env[WANDB_PROJECT] = str(trackers["wandb"])
    if "tensorboard" in trackers:
        env[ENV_TENSORBOARD_DIR] = env[ENV_TENSORBOARD_COMMON] = tensorboard_dir(handle, trackers["tensorboard"])
    if "mlflow" in trackers:
        uri = trackers["mlflow"] or environ.get(MLFLOW_TRACKING_URI)
        if uri:
            env[MLFLOW_TRACKING_URI] = uri
            if not all(MLFLOW_RUN_ID in e for e in roles_env):
                env.update(_mlflow_run(uri, handle, sweep, parent, environ, app_name))
    return env


def _mlflow_run(
    uri: str, handle: str, sweep: str | None, parent: str | None, environ: Mapping[str, str], app_name: str | None
) -> dict[str, str]:
    """Create the app's MLflow run (status SCHEDULED until a replica resumes it); its env."""
    from tsm.errors import TrackerError

    try:
        with _launch_limits():
            return _create_mlflow_run(uri, handle, sweep, parent, environ, app_name)
    except TrackerError:
        raise
    except Exception as e:  # noqa: BLE001 - the client raises its own and the network's errors
        raise TrackerError(f"mlflow tracker: cannot create the app's run at {uri}: {type(e).__name__}: {e}") from e


#: MLflow's HTTP limits while a launch creates its run, unless the launching process sets its own: a server
#: that does not answer fails the launch after 3 tries (about 10 s of back-off), not MLflow's 8 (minutes).
LAUNCH_HTTP_LIMITS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_TIMEOUT": "20"}
_limits_lock = threading.Lock()


@contextlib.contextmanager
def _launch_limits() -> Iterator[None]:
    """:data:`LAUNCH_HTTP_LIMITS` in the environment MLflow reads at each request, for the time of the block."""
    with _limits_lock:
        added = [k for k in LAUNCH_HTTP_LIMITS if k not in os.environ]
        os.environ.update({k: LAUNCH_HTTP_LIMITS[k] for k in added})
        try:
            yield
        finally:
            for k in added:
                os.environ.pop(k, None)


def _create_mlflow_run(
    uri: str, handle: str, sweep: str | None, parent: str | None, environ: Mapping[str, str], app_name: str | None
) -> dict[str, str]:
    """:func:`_mlflow_run`'s work: the experiment, the tags, the run."""
    client = mlflow_client(uri)
    experiment = _experiment(client, environ)
    tags = {TAG_HANDLE: handle, TAG_KIND: "app"}
    if app_name:
        tags[TAG_RUN_NAME] = app_name
    if parent:
        tags[TAG_PARENT] = parent
    if sweep:
        tags[TAG_SWEEP] = sweep
        tags[TAG_MLFLOW_PARENT] = sweep_parent_run(client, experiment, sweep)
    elif parent and environ.get(MLFLOW_RUN_ID) and parent == _launcher_job(environ):
        tags[TAG_MLFLOW_PARENT] = environ[MLFLOW_RUN_ID]  # launched from inside a job with an MLflow run
    run = client.create_run(experiment, tags=tags)
    client.set_terminated(run.info.run_id, status="SCHEDULED")
    return {MLFLOW_RUN_ID: run.info.run_id, TSM_MLFLOW_RUN_ID: run.info.run_id, MLFLOW_EXPERIMENT_ID: experiment}


def _launcher_job(environ: Mapping[str, str]) -> str | None:
    return environ.get("TSM_JOB_ID", environ.get("TORCHX_JOB_ID"))


def mlflow_client(uri: str) -> Any:
    """An ``MlflowClient`` for ``uri`` (imported here: only a launch or job that uses MLflow pays for it)."""
    try:
        from mlflow.tracking import MlflowClient
    except ImportError as e:
        from tsm.errors import TrackerError

        raise TrackerError("the mlflow tracker needs the mlflow package: pip install 'tsm[mlflow]'") from e
    return MlflowClient(tracking_uri=uri)


def _experiment(client: Any, environ: Mapping[str, str]) -> str:
    """The experiment id: the launcher's ``MLFLOW_EXPERIMENT_ID``, else ``MLFLOW_EXPERIMENT_NAME`` (made when
    missing), else MLflow's default experiment."""
    if environ.get(MLFLOW_EXPERIMENT_ID):
        return environ[MLFLOW_EXPERIMENT_ID]
    name = environ.get(MLFLOW_EXPERIMENT_NAME)
    if not name:
        return "0"
    found = client.get_experiment_by_name(name)
    return str(found.experiment_id) if found is not None else str(client.create_experiment(name))


_SWEEP_LOCK = threading.Lock()
_SWEEP_RUNS: dict[tuple[str, str], str] = {}


def sweep_parent_run(client: Any, experiment: str, sweep: str) -> str:
    """The MLflow run standing for the sweep ``sweep`` in ``experiment``: found by its tags, else created.

    One lock per process: a sweep's trials are launched by one process (its controller, or the caller of a
    native sweep), whose threads would otherwise race to create two parents.
    """
    key = (experiment, sweep)
    with _SWEEP_LOCK:
        if key in _SWEEP_RUNS:
            return _SWEEP_RUNS[key]
        found = client.search_runs(
            [experiment], filter_string=f"tags.`{TAG_SWEEP}` = '{_quote(sweep)}' and tags.`{TAG_KIND}` = 'sweep'",
            max_results=1,
        )
        if found:
            run_id = str(found[0].info.run_id)
        else:
            run = client.create_run(experiment, tags={TAG_SWEEP: sweep, TAG_KIND: "sweep", TAG_RUN_NAME: sweep_id(sweep)})
            run_id = str(run.info.run_id)
        _SWEEP_RUNS[key] = run_id
        return run_id


def _quote(value: str) -> str:
    """A value inside an MLflow search filter's single quotes."""
    return value.replace("\\", "\\\\").replace("'", "\\'")


def mark_scheduled(handle: str, role_env: Mapping[str, str]) -> None:
    """Once the scheduler named the app: its MLflow run (if tsm made it) gets the real handle for its tag."""
    run_id, uri = role_env.get(TSM_MLFLOW_RUN_ID), role_env.get(MLFLOW_TRACKING_URI)
    if not run_id or not uri or role_env.get(MLFLOW_RUN_ID) != run_id:  # none made here, or the role brought its own
        return
    client = mlflow_client(uri)
    tags = client.get_run(run_id).data.tags
    if APP_ID_MACRO in tags.get(TAG_HANDLE, ""):
        client.set_tag(run_id, TAG_HANDLE, handle)
