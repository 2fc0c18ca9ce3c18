"""The ``mlflow`` tracker: a run's record in an MLflow tracking server, through the official client (``tsm[mlflow]``).

Its config is the tracking URI (else the process's ``MLFLOW_TRACKING_URI``). A tsm run (an app handle) is
the MLflow run tagged ``tsm.app_handle`` with it; inside a job it is the run of ``TSM_MLFLOW_RUN_ID`` (the
``MLFLOW_RUN_ID`` that ``mlflow.start_run()`` resumes), created
at submit (:mod:`tsm.tracker.attempts`) so that every attempt writes to it. What :class:`~tsm.tracker.AppRun`
records goes to that run:

=================  ================================================================================
metadata           a tag per key (a string as it is, any other value as JSON, read back decoded)
metrics            MLflow metrics, one point per :meth:`~tsm.tracker.AppRun.log_metrics` call and key
artifacts          a tag ``tsm.artifact.<name>`` holding the path and metadata (the file is not copied)
sources            the tag ``tsm.sources``: a JSON list of ``[source id, kind]``
=================  ================================================================================

A run id that no MLflow run carries yet gets one when something is first written for it (a job launched
without a tracking URI at submit gets one per attempt: the environment could not name a shared one).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Mapping
from typing import Any

from tsm.tracker.api import (
    ENV_JOB_ID,
    Lineage,
    MetricsTracker,
    TrackerArtifact,
    TrackerBase,
    TrackerError,
    TrackerSource,
    UnknownRunError,
)
from tsm.tracker.attempts import (
    APP_ID_MACRO,
    MLFLOW_EXPERIMENT_ID,
    MLFLOW_RUN_ID,
    MLFLOW_TRACKING_URI,
    TAG_HANDLE,
    TAG_KIND,
    TSM_MLFLOW_RUN_ID,
    _quote,
    mlflow_client,
)

TAG_SOURCES = "tsm.sources"
ARTIFACT_PREFIX = "tsm.artifact."
#: Tags that are MLflow's or tsm's own bookkeeping, never a run's metadata.
_SYSTEM_PREFIXES = ("mlflow.", "tsm.")


class MLflowTracker(TrackerBase, MetricsTracker):
    """Runs in an MLflow tracking server (see the module doc for what goes where)."""

    def __init__(self, tracking_uri: str | None = None, environ: Mapping[str, str] | None = None) -> None:
        self._environ = os.environ if environ is None else environ
        uri = tracking_uri or self._environ.get(MLFLOW_TRACKING_URI)
        if not uri:
            raise TrackerError("the mlflow tracker needs a tracking URI: [tracker:mlflow] config = URI, "
                               "or MLFLOW_TRACKING_URI")
        self.tracking_uri = uri
        self._client = mlflow_client(uri)
        self._runs: dict[str, str] = {}

    # -- which MLflow run ------------------------------------------------------------------------
    def mlflow_run_id(self, run_id: str, create: bool = False) -> str | None:
        """The MLflow run id of the tsm run ``run_id``: this job's ``MLFLOW_RUN_ID``, else found by tag,
        else (``create``) a new run tagged with it."""
        if run_id in self._runs:
            return self._runs[run_id]
        found: str | None = None
        if self._environ.get(ENV_JOB_ID) == run_id:
            # the env's run (a role's own wins), else the one start_run() took out of it, else tsm's copy of it
            found = self._environ.get(MLFLOW_RUN_ID) or _active_run_id() or self._environ.get(TSM_MLFLOW_RUN_ID)
        if found is None:
            runs = self._search(f"tags.`{TAG_HANDLE}` = '{_quote(run_id)}'", max_results=1)
            if runs:
                found = str(runs[0].info.run_id)
        if found is None and create:
            experiment = self._environ.get(MLFLOW_EXPERIMENT_ID) or "0"
            found = str(self._call(self._client.create_run, experiment,
                                   tags={TAG_HANDLE: run_id, TAG_KIND: "app"}).info.run_id)
        if found is not None:
            self._runs[run_id] = found
        return found

    def _search(self, filter_string: str, max_results: int = 1000) -> list[Any]:
        experiments = [str(e.experiment_id) for e in self._call(self._client.search_experiments)]
        if not experiments:
            return []
        return list(self._call(self._client.search_runs, experiments, filter_string=filter_string,
                               max_results=max_results))

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - the client raises its own and the network's errors
            raise TrackerError(f"mlflow tracker at {self.tracking_uri}: {type(e).__name__}: {e}") from e

    def _writable(self, run_id: str) -> str:
        found = self.mlflow_run_id(run_id, create=True)
        assert found is not None
        return found

    def _tags(self, run_id: str) -> dict[str, str]:
        found = self.mlflow_run_id(run_id)
        if found is None:
            raise UnknownRunError(f"no MLflow run is tagged {TAG_HANDLE}={run_id} at {self.tracking_uri}")
        return dict(self._call(self._client.get_run, found).data.tags)

    # -- writes ------------------------------------------------------------------------------------
    def add_metadata(self, run_id: str, **kwargs: object) -> None:
        """One tag per key (strings as they are, other values as JSON)."""
        from mlflow.entities import RunTag

        tags = [RunTag(k, v if isinstance(v, str) else json.dumps(v, default=str)) for k, v in kwargs.items()]
        if tags:
            self._call(self._client.log_batch, self._writable(run_id), tags=tags)

    def log_metrics(self, run_id: str, metrics: Mapping[str, float], step: int | None = None) -> None:
        """One point per metric (``step`` 0 when None, as MLflow's own default)."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        points = [Metric(k, float(v), now, step or 0) for k, v in metrics.items()]
        if points:
            self._call(self._client.log_batch, self._writable(run_id), metrics=points)

    def add_artifact(self, run_id: str, name: str, path: str, metadata: Mapping[str, object] | None = None) -> None:
        """The tag ``tsm.artifact.<name>``: the path and metadata (the file stays where it is)."""
        value = json.dumps({"path": path, "metadata": dict(metadata) if metadata else None}, default=str)
        self._call(self._client.set_tag, self._writable(run_id), ARTIFACT_PREFIX + name, value)

    def add_source(self, run_id: str, source_id: str, artifact_name: str | None = None) -> None:
        """Add ``[source_id, artifact_name]`` to the run's ``tsm.sources`` (once)."""
        found = self._writable(run_id)
        current = json.loads(dict(self._call(self._client.get_run, found).data.tags).get(TAG_SOURCES) or "[]")
        if [source_id, artifact_name] not in current:
            current.append([source_id, artifact_name])
            self._call(self._client.set_tag, found, TAG_SOURCES, json.dumps(current))

    # -- reads ---------------------------------------------------------------------------------------
    def metadata(self, run_id: str) -> Mapping[str, object]:
        """The run's own tags (not MLflow's or tsm's), JSON values decoded."""
        return {k: _decoded(v) for k, v in self._tags(run_id).items() if not k.startswith(_SYSTEM_PREFIXES)}

    def artifacts(self, run_id: str) -> Mapping[str, TrackerArtifact]:
        out = {}
        for key, value in self._tags(run_id).items():
            if key.startswith(ARTIFACT_PREFIX):
                record = json.loads(value)
                name = key[len(ARTIFACT_PREFIX):]
                out[name] = TrackerArtifact(name, record["path"], record.get("metadata"))
        return out

    def sources(self, run_id: str, artifact_name: str | None = None) -> Iterable[TrackerSource]:
        pairs = json.loads(self._tags(run_id).get(TAG_SOURCES) or "[]")
        return [TrackerSource(s, k) for s, k in pairs if artifact_name is None or k == artifact_name]

    def children(self, run_id: str) -> Iterable[str]:
        """Runs whose ``tsm.sources`` names ``run_id``."""
        needle = json.dumps(run_id)
        runs = self._search(f"tags.`{TAG_SOURCES}` LIKE '%{_quote(needle)}%'")
        return [r.data.tags[TAG_HANDLE] for r in runs if TAG_HANDLE in r.data.tags]

    def lineage(self, run_id: str) -> Lineage:
        """The run with its direct parents and children (MLflow holds no graph to walk further cheaply)."""
        node = Lineage(run_id)
        node.parents = [Lineage(s.source_run_id, s.artifact_name) for s in self.sources(run_id)]
        node.children = [Lineage(c) for c in self.children(run_id)]
        return node

    def run_ids(self, **kwargs: str) -> Iterable[str]:
        """Handles of the MLflow runs tsm tagged (``experiment_id=...`` narrows them to one experiment); a run made
        by a dry run that was never submitted has no handle and is left out."""
        query = f"tags.`{TAG_HANDLE}` LIKE '%'"
        if "experiment_id" in kwargs:
            runs = self._call(self._client.search_runs, [kwargs["experiment_id"]], filter_string=query)
        else:
            runs = self._search(query)
        return [r.data.tags[TAG_HANDLE] for r in runs if APP_ID_MACRO not in r.data.tags[TAG_HANDLE]]


def _active_run_id() -> str | None:
    """The run the job's own ``mlflow.start_run()`` made active (it removes ``MLFLOW_RUN_ID`` from the env)."""
    import mlflow

    active = mlflow.active_run()
    return str(active.info.run_id) if active is not None else None


def _decoded(value: str) -> object:
    try:
        return json.loads(value)
    except ValueError:
        return value


def create(config: str | None) -> MLflowTracker:
    """The tracker factory: ``config`` is the tracking URI."""
    return MLflowTracker(config)
