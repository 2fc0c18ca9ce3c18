"""The ``tensorboard`` tracker: one TensorBoard log directory per app, written with tensorboard's own writer.

The directory is ``TSM_TENSORBOARD_DIR`` (set at submit, :mod:`tsm.tracker.attempts`: ``<root>/<scheduler>/
<session>/<app id>``, the root being the tracker's config, else ``$TSM_HOME/tensorboard``), the same for every
attempt: each attempt's writer adds an event file of its own beside the earlier ones, and TensorBoard shows
them as one run. ``tensorboard --logdir <root>`` shows every app.

=================  ================================================================================
metrics            scalars (``step`` when given, else one more than this process's last of that key)
metadata           a text summary ``tsm/metadata`` (JSON), and ``tsm-run.json`` beside the events
artifacts          ``tsm-run.json``: name -> path and metadata (the file is not copied)
sources            ``tsm-run.json``: a list of ``[source id, kind]``
=================  ================================================================================

``tsm-run.json`` is what reads answer from; it is replaced whole under a lock, so replicas writing at
once lose nothing. The writer's package is ``tensorboard`` (``tsm[tensorboard]``).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
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
from tsm.tracker.attempts import ENV_TENSORBOARD_DIR, tensorboard_dir

#: The record beside the event files that reads answer from.
RECORD = "tsm-run.json"


class TensorBoardTracker(TrackerBase, MetricsTracker):
    """A log directory per run (see the module doc)."""

    def __init__(self, root: str | None = None, environ: Mapping[str, str] | None = None) -> None:
        self._environ = os.environ if environ is None else environ
        self.root = root
        self._writers: dict[str, Any] = {}
        self._steps: dict[tuple[str, str], int] = {}

    def logdir(self, run_id: str) -> Path:
        """The directory of ``run_id``: this job's ``TSM_TENSORBOARD_DIR``, else made from the handle."""
        if self._environ.get(ENV_JOB_ID) == run_id and self._environ.get(ENV_TENSORBOARD_DIR):
            return Path(self._environ[ENV_TENSORBOARD_DIR])
        from tsm.errors import MalformedAppHandleError
        from tsm.specs.handles import parse_app_handle

        try:
            parse_app_handle(run_id)  # its parts cannot climb out of the root
        except MalformedAppHandleError as e:
            raise TrackerError(f"tensorboard tracker: {run_id!r} is not an app handle (scheduler://session/app_id)") from e
        return Path(tensorboard_dir(run_id, self.root))

    def _writer(self, run_id: str) -> Any:
        if run_id not in self._writers:
            try:
                from tensorboard.summary.writer.event_file_writer import EventFileWriter
            except ImportError as e:
                raise TrackerError("the tensorboard tracker needs the tensorboard package: "
                                   "pip install 'tsm[tensorboard]'") from e
            path = self.logdir(run_id)
            path.mkdir(parents=True, exist_ok=True, mode=0o700)
            self._writers[run_id] = EventFileWriter(str(path))
        return self._writers[run_id]

    def log_metrics(self, run_id: str, metrics: Mapping[str, float], step: int | None = None) -> None:
        """Scalars, flushed at once (an attempt that is killed next keeps what it logged)."""
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary

        writer = self._writer(run_id)
        for key, value in metrics.items():
            at = step if step is not None else self._steps.get((run_id, key), -1) + 1
            self._steps[(run_id, key)] = at
            summary = Summary(value=[Summary.Value(tag=key, simple_value=float(value))])
            writer.add_event(Event(wall_time=time.time(), step=at, summary=summary))
        writer.flush()

    def _text(self, run_id: str, tag: str, text: str) -> None:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
        from tensorboard.compat.proto.tensor_pb2 import TensorProto
        from tensorboard.compat.proto.tensor_shape_pb2 import TensorShapeProto

        tensor = TensorProto(dtype=7, string_val=[text.encode()], tensor_shape=TensorShapeProto())  # 7: DT_STRING
        meta = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(plugin_name="text"))
        summary = Summary(value=[Summary.Value(tag=tag, tensor=tensor, metadata=meta)])
        writer = self._writer(run_id)
        writer.add_event(Event(wall_time=time.time(), step=0, summary=summary))
        writer.flush()

    @contextmanager
    def _record(self, run_id: str) -> Iterator[dict[str, Any]]:
        """``tsm-run.json`` of ``run_id`` to change, written back whole under an exclusive lock."""
        import fcntl

        path = self.logdir(run_id)
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(path / f".{RECORD}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            record = self._read(path)
            yield record
            tmp = path / f".{RECORD}.{os.getpid()}"
            with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
                json.dump(record, f, default=str)
            os.replace(tmp, path / RECORD)
        finally:
            os.close(fd)

    @staticmethod
    def _read(path: Path) -> dict[str, Any]:
        try:
            record: dict[str, Any] = json.loads((path / RECORD).read_text())
        except FileNotFoundError:
            record = {}
        for key, empty in (("metadata", {}), ("artifacts", {}), ("sources", [])):
            record.setdefault(key, empty)
        return record

    def _stored(self, run_id: str) -> dict[str, Any]:
        path = self.logdir(run_id)
        if not (path / RECORD).exists():
            raise UnknownRunError(f"tensorboard tracker: nothing recorded for {run_id} in {path}")
        return self._read(path)

    def add_metadata(self, run_id: str, **kwargs: object) -> None:
        with self._record(run_id) as record:
            record["metadata"].update(kwargs)
            text = json.dumps(record["metadata"], default=str, sort_keys=True)
        self._text(run_id, "tsm/metadata", text)

    def add_artifact(self, run_id: str, name: str, path: str, metadata: Mapping[str, object] | None = None) -> None:
        with self._record(run_id) as record:
            record["artifacts"][name] = {"path": path, "metadata": dict(metadata) if metadata else None}

    def add_source(self, run_id: str, source_id: str, artifact_name: str | None = None) -> None:
        with self._record(run_id) as record:
            if [source_id, artifact_name] not in record["sources"]:
                record["sources"].append([source_id, artifact_name])

    def metadata(self, run_id: str) -> Mapping[str, object]:
        return dict(self._stored(run_id)["metadata"])

    def artifacts(self, run_id: str) -> Mapping[str, TrackerArtifact]:
        stored = self._stored(run_id)["artifacts"]
        return {n: TrackerArtifact(n, a["path"], a.get("metadata")) for n, a in stored.items()}

    def sources(self, run_id: str, artifact_name: str | None = None) -> Iterable[TrackerSource]:
        stored = self._stored(run_id)["sources"]
        return [TrackerSource(s, k) for s, k in stored if artifact_name is None or k == artifact_name]

    def lineage(self, run_id: str) -> Lineage:
        """The run and its parents (children would need every app's directory read)."""
        node = Lineage(run_id)
        node.parents = [Lineage(s.source_run_id, s.artifact_name) for s in self.sources(run_id)]
        return node

    def run_ids(self, **kwargs: str) -> Iterable[str]:
        """Handles of the runs under the root that have a record (``<root>/<scheduler>/<session>/<app id>``)."""
        root = Path(tensorboard_dir("x://s/a", self.root)).parents[2]
        dirs = [r.parent for r in root.glob(f"*/*/*/{RECORD}")]
        return sorted(f"{d.parent.parent.name}://{d.parent.name}/{d.name}" for d in dirs)

    def close(self) -> None:
        """Flush and close every writer."""
        for writer in self._writers.values():
            writer.close()
        self._writers.clear()


def create(config: str | None) -> TensorBoardTracker:
    """The tracker factory: ``config`` is the root directory of every app's directory."""
    return TensorBoardTracker(config)
