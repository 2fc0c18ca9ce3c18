"""The ``tensorboard`` tracker in-process: what it writes is read back by tensorboard's own reader and by the
tracker's reads; a record written from two processes at once loses nothing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from testutil import HANG
from tsm.tracker.api import AppRun, TrackerError, UnknownRunError, build_trackers

pytest.importorskip("tensorboard")  # tsm[tensorboard]: `make test` installs it (the $(VENV)/.trackers stamp)

HANDLE = "local://s/app-1"


def test_metrics_metadata_artifacts_and_sources_round_trip(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (tracker,) = build_trackers({"tensorboard": str(tmp_path)})
    run = AppRun(HANDLE, [tracker])
    run.log_metrics(loss=2.0)
    run.log_metrics(loss=1.0)  # no step: one more than this process's last
    run.log_metrics(step=10, loss=0.5, acc=0.9)
    run.add_metadata(lr=0.01, name="base")
    run.add_artifact("model", "/ckpt/m.pt", {"bytes": 3})
    run.add_source("local://s/parent")
    run.add_source("local://s/parent")
    assert run.metadata() == {"lr": 0.01, "name": "base"}
    assert run.artifacts()["model"].path == "/ckpt/m.pt" and run.artifacts()["model"].metadata == {"bytes": 3}
    assert [s.parent.job_id() for s in run.sources()] == ["local://s/parent"]
    assert run.lineage().ancestors() == ["local://s/parent"]
    assert list(tracker.run_ids()) == [HANDLE]

    acc = EventAccumulator(str(tmp_path / "local" / "s" / "app-1"))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("loss")] == [(0, 2.0), (1, 1.0), (10, 0.5)]
    assert "tsm/metadata" in acc.Tags()["tensors"]


def test_reads_of_an_unknown_run_and_a_non_handle_are_typed_errors(tmp_path: Path) -> None:
    (tracker,) = build_trackers({"tensorboard": str(tmp_path)})
    with pytest.raises(UnknownRunError):
        tracker.metadata("local://s/never")
    for bad in ("../../etc", "local://s/..", "local://../x"):
        with pytest.raises(TrackerError, match="not an app handle"):
            tracker.add_metadata(bad, x=1)
    assert list(tmp_path.iterdir()) == []


def test_two_processes_writing_metadata_at_once_lose_nothing(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from tsm.tracker.api import AppRun, build_trackers\n"
        f"run = AppRun({HANDLE!r}, build_trackers({{'tensorboard': {str(tmp_path)!r}}}))\n"
        "for i in range(40):\n"
        "    run.add_metadata(**{f'{sys.argv[1]}{i}': i})\n"
    )
    procs = [subprocess.Popen([sys.executable, "-c", code, w]) for w in ("a", "b")]
    assert [p.wait(timeout=HANG) for p in procs] == [0, 0]
    (tracker,) = build_trackers({"tensorboard": str(tmp_path)})
    assert len(tracker.metadata(HANDLE)) == 80
