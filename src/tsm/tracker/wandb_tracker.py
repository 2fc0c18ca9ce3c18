"""The ``wandb`` tracker: a run's record in Weights & Biases, through the official client (``tsm[wandb]``).

Its config is the W&B project (else ``WANDB_PROJECT``). The tsm run of a job is the W&B run
``WANDB_RUN_ID`` that the launcher derived from the app handle (:mod:`tsm.tracker.attempts`), resumed by
every attempt (``WANDB_RESUME=allow``); a sweep trial's run is in the sweep's group. A run already started
in the process with that id (the job's own ``wandb.init()``) is used as it is, else the tracker starts it.

=================  ================================================================================
metadata           the run's config (a later value of a key replaces the earlier one)
metrics            ``run.log`` (with ``step`` when given)
artifacts          the config key ``tsm_artifacts``: name -> path and metadata (the file is not uploaded)
sources            the config key ``tsm_sources``: a list of ``[source id, kind]``
=================  ================================================================================

Reads answer for the job's own run only (W&B's offline mode has no server to ask); put the ``tsm``
tracker first in the list to read any run's record.
"""

from __future__ import annotations

import os
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
)
from tsm.tracker.attempts import WANDB_PROJECT, WANDB_RESUME, WANDB_RUN_GROUP, WANDB_RUN_ID, wandb_run_id

KEY_ARTIFACTS = "tsm_artifacts"
KEY_SOURCES = "tsm_sources"


class WandbTracker(TrackerBase, MetricsTracker):
    """The job's own W&B run (see the module doc)."""

    def __init__(self, project: str | None = None, environ: Mapping[str, str] | None = None) -> None:
        self._environ = os.environ if environ is None else environ
        self.project = project or self._environ.get(WANDB_PROJECT)
        self._run: Any = None

    def wandb_run_id(self, run_id: str) -> str:
        """The W&B id of the tsm run ``run_id``: this job's ``WANDB_RUN_ID``, else derived from the handle."""
        if self._environ.get(ENV_JOB_ID) == run_id and self._environ.get(WANDB_RUN_ID):
            return self._environ[WANDB_RUN_ID]
        return wandb_run_id(run_id)

    def run(self, run_id: str) -> Any:
        """The live W&B run of ``run_id`` (started, or resumed, on first use)."""
        try:
            import wandb
        except ImportError as e:
            raise TrackerError("the wandb tracker needs the wandb package: pip install 'tsm[wandb]'") from e
        wanted = self.wandb_run_id(run_id)
        if self._run is not None and self._run.id == wanted:
            return self._run
        current = wandb.run
        if current is not None and current.id == wanted:
            self._run = current
            return current
        settings: dict[str, Any] = {"id": wanted, "resume": self._environ.get(WANDB_RESUME) or "allow",
                                    "project": self.project, "group": self._environ.get(WANDB_RUN_GROUP)}
        try:
            self._run = wandb.init(**settings)
        except Exception as e:  # noqa: BLE001 - the client raises its own and the network's errors
            raise TrackerError(f"wandb tracker: cannot start run {wanted}: {type(e).__name__}: {e}") from e
        return self._run

    def _own(self, run_id: str) -> Any:
        if self._environ.get(ENV_JOB_ID) != run_id:
            raise TrackerError(f"the wandb tracker reads only the job's own run, not {run_id}; "
                               "put the 'tsm' tracker first to read any run")
        return self.run(run_id)

    def add_metadata(self, run_id: str, **kwargs: object) -> None:
        self.run(run_id).config.update(kwargs, allow_val_change=True)

    def log_metrics(self, run_id: str, metrics: Mapping[str, float], step: int | None = None) -> None:
        run = self.run(run_id)
        if step is None:
            run.log(dict(metrics))
        else:
            run.log(dict(metrics), step=step)

    def add_artifact(self, run_id: str, name: str, path: str, metadata: Mapping[str, object] | None = None) -> None:
        run = self.run(run_id)
        artifacts = dict(run.config.get(KEY_ARTIFACTS) or {})
        artifacts[name] = {"path": path, "metadata": dict(metadata) if metadata else None}
        run.config.update({KEY_ARTIFACTS: artifacts}, allow_val_change=True)

    def add_source(self, run_id: str, source_id: str, artifact_name: str | None = None) -> None:
        run = self.run(run_id)
        sources = [list(s) for s in run.config.get(KEY_SOURCES) or []]
        if [source_id, artifact_name] not in sources:
            run.config.update({KEY_SOURCES: [*sources, [source_id, artifact_name]]}, allow_val_change=True)

    def metadata(self, run_id: str) -> Mapping[str, object]:
        config = dict(self._own(run_id).config)
        return {k: v for k, v in config.items() if k not in (KEY_ARTIFACTS, KEY_SOURCES)}

    def artifacts(self, run_id: str) -> Mapping[str, TrackerArtifact]:
        stored = self._own(run_id).config.get(KEY_ARTIFACTS) or {}
        return {n: TrackerArtifact(n, a["path"], a.get("metadata")) for n, a in dict(stored).items()}

    def sources(self, run_id: str, artifact_name: str | None = None) -> Iterable[TrackerSource]:
        stored = self._own(run_id).config.get(KEY_SOURCES) or []
        return [TrackerSource(s, k) for s, k in stored if artifact_name is None or k == artifact_name]

    def lineage(self, run_id: str) -> Lineage:
        """The job's run and its parents (W&B keeps no children that a job could ask for)."""
        node = Lineage(run_id)
        node.parents = [Lineage(s.source_run_id, s.artifact_name) for s in self.sources(run_id)]
        return node

    def run_ids(self, **kwargs: str) -> Iterable[str]:
        """The job's own run (the only one this tracker can name)."""
        job = self._environ.get(ENV_JOB_ID)
        return [job] if job else []


def create(config: str | None) -> WandbTracker:
    """The tracker factory: ``config`` is the W&B project."""
    return WandbTracker(config)
