"""Run tracking: :class:`AppRun` inside jobs, tracker backends by entry point, the built-in store tracker.

See :mod:`tsm.tracker.api` for the environment contract and :mod:`tsm.tracker.store` for what the
built-in ``tsm`` tracker stores.
"""

from __future__ import annotations

from tsm.tracker.api import (
    AppRun,
    AppRunTrackableSource,
    Lineage,
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
    "AppRun", "AppRunTrackableSource", "Lineage", "TrackerArtifact", "TrackerBase", "TrackerError", "TrackerSource",
    "UnknownRunError", "configured_trackers", "record_launch", "tracker_config_env_var_name", "tracker_env",
    "trackers_from_environ",
]
