"""Run tracking: :class:`AppRun` inside jobs, tracker backends by entry point, the built-in store tracker.

See :mod:`tsm.tracker.api` for the environment contract, :mod:`tsm.tracker.store` for what the built-in
``tsm`` tracker stores, :mod:`tsm.tracker.attempts` for the run every attempt of an app shares, and
``mlflow_tracker``, ``wandb_tracker`` and ``tensorboard_tracker`` for the other built-in backends.
"""

from __future__ import annotations

from tsm.tracker.api import (
    AppRun,
    AppRunTrackableSource,
    Lineage,
    MetricsTracker,
    TrackerArtifact,
    TrackerBase,
    TrackerError,
    TrackerSource,
    UnknownRunError,
    configured_trackers,
    record_launch,
    tracker_config_env_var_name,
    tracker_env,
    trackers_from_environ,
)

__all__ = [
    "AppRun", "AppRunTrackableSource", "Lineage", "MetricsTracker", "TrackerArtifact", "TrackerBase", "TrackerError", "TrackerSource",
    "UnknownRunError", "configured_trackers", "record_launch", "tracker_config_env_var_name", "tracker_env",
    "trackers_from_environ",
]
