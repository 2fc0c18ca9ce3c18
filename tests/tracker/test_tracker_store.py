"""The built-in ``tsm`` tracker on the real store, the env contract, and tracker discovery by entry point."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tsm.tracker import AppRun, TrackerError, UnknownRunError, configured_trackers, record_launch, tracker_env
from tsm.tracker.api import (
    _RUN_CACHE,
    UNDEFINED_JOB_ID,
    TrackerBase,
    tracker_factories,
    trackers_from_environ,
)
from tsm.tracker.store import StoreTracker


@pytest.fixture
def tracker() -> Iterator[StoreTracker]:
    t = StoreTracker()
    yield t
    t.close()


def test_metadata_artifacts_and_sources_round_trip(tracker: StoreTracker) -> None:
    tracker.add_metadata("r1", lr=0.01, epochs=3, tags=["a", "b"], nested={"k": None})
    tracker.add_metadata("r1", lr=0.02)  # a later value replaces the earlier one
    tracker.add_artifact("r1", "model", "/ckpt/model.pt", {"format": "pt"})
    tracker.add_artifact("r1", "log", "/logs/x")
    assert tracker.metadata("r1") == {"lr": 0.02, "epochs": 3, "tags": ["a", "b"], "nested": {"k": None}}
    arts = tracker.artifacts("r1")
    assert arts["model"].path == "/ckpt/model.pt" and arts["model"].metadata == {"format": "pt"}
    assert arts["log"].metadata is None
    tracker.add_source("r2", "r1", "model")
    tracker.add_source("r2", "r1", "model")  # idempotent
    tracker.add_source("r2", "external:dataset-7")
    assert [(s.source_run_id, s.artifact_name) for s in tracker.sources("r2")] == [("r1", "model"), ("external:dataset-7", None)]
    assert [s.source_run_id for s in tracker.sources("r2", artifact_name="model")] == ["r1"]
    assert list(tracker.children("r1")) == ["r2"]
    assert set(tracker.run_ids()) == {"r1", "r2"}
    assert list(tracker.run_ids(source_id="r1")) == ["r2"]


def test_values_json_cannot_hold_are_stored_as_text(tracker: StoreTracker) -> None:
    tracker.add_metadata("r", s={1}, p=Path("/x"))
    assert tracker.metadata("r") == {"s": "{1}", "p": "/x"}


def test_lineage_both_ways_with_depth_and_cycles(tracker: StoreTracker) -> None:
    tracker.add_source("child", "parent")
    tracker.add_source("parent", "grandparent")
    tracker.add_source("grandchild", "child", "ckpt")
    tracker.add_source("sibling", "parent")
    lin = tracker.lineage("child")
    assert lin.ancestors() == ["parent", "grandparent"]
    assert lin.descendants() == ["grandchild"]
    assert lin.children[0].artifact_name == "ckpt"
    top = tracker.lineage("grandparent")
    assert top.descendants() == ["parent", "child", "sibling", "grandchild"]
    tracker.add_source("grandparent", "grandchild")  # a cycle: shown once, not followed round
    assert tracker.lineage("child").ancestors().count("child") == 0


def test_bad_input_is_a_tracker_error(tracker: StoreTracker) -> None:
    with pytest.raises(TrackerError):
        tracker.add_metadata("", x=1)
    with pytest.raises(TrackerError):
        tracker.add_source("a", "a")
    with pytest.raises(TrackerError):
        tracker.add_artifact("a", "n", 3)  # type: ignore[arg-type]
    with pytest.raises(TrackerError, match="source_id"):
        tracker.run_ids(owner="me")
    with pytest.raises(UnknownRunError):
        tracker.require("nobody")


def test_reads_of_an_empty_store_are_empty(tracker: StoreTracker) -> None:
    assert tracker.metadata("x") == {} and list(tracker.sources("x")) == [] and tracker.runs() == []
    assert tracker.lineage("x").parents == []


def test_tracker_env_has_both_names_and_takes_the_parent_from_the_launching_job() -> None:
    env = tracker_env("local://s/${app_id}", None, None, environ={"TSM_JOB_ID": "local://s/parent-1"})
    assert env["TSM_JOB_ID"] == env["TORCHX_JOB_ID"] == "local://s/${app_id}"
    assert env["TSM_PARENT_RUN_ID"] == env["TORCHX_PARENT_RUN_ID"] == "local://s/parent-1"
    assert env["TSM_TRACKERS"] == env["TORCHX_TRACKERS"] == "tsm"
    # an explicit parent wins; TorchX's job id is read too; no job -> no parent
    assert tracker_env("h", "p0", environ={"TSM_JOB_ID": "x"})["TSM_PARENT_RUN_ID"] == "p0"
    assert tracker_env("h", environ={"TORCHX_JOB_ID": "tx"})["TSM_PARENT_RUN_ID"] == "tx"
    assert "TSM_PARENT_RUN_ID" not in tracker_env("h", environ={})
    assert not any(k.startswith("TORCHX_") for k in tracker_env("h", "p", environ={}, torchx=False))


def test_configured_trackers_env_then_config_then_builtin() -> None:
    class Cfg:
        trackers = {"tsm": "/tmp/x.db"}

    assert configured_trackers(None, environ={}) == {"tsm": None}
    assert configured_trackers(Cfg(), environ={}) == {"tsm": "/tmp/x.db"}
    assert configured_trackers(Cfg(), environ={"TSM_TRACKERS": ""}) == {}  # tracking off
    assert configured_trackers(None, environ={"TORCHX_TRACKERS": "tsm", "TORCHX_TRACKER_TSM_CONFIG": "/db"}) == {"tsm": "/db"}
    env = tracker_env("h", environ={"TSM_TRACKERS": "tsm", "TSM_TRACKER_TSM_CONFIG": "/shared/t.db"})
    assert env["TSM_TRACKER_TSM_CONFIG"] == env["TORCHX_TRACKER_TSM_CONFIG"] == "/shared/t.db"


def test_unknown_tracker_is_refused_at_launch_and_skipped_in_a_job(caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(TrackerError, match="unknown tracker 'tms'.*did you mean 'tsm'"):
        tracker_env("h", environ={"TSM_TRACKERS": "tms"})
    with caplog.at_level(logging.WARNING, logger="tsm.tracker"):
        assert trackers_from_environ({"TSM_TRACKERS": "tms,tsm"})[0].__class__ is StoreTracker
    assert "unknown tracker 'tms'" in caplog.text


def test_record_launch_records_the_parent_without_the_child_doing_anything(tracker: StoreTracker) -> None:
    assert record_launch("local://s/child", environ={}) is None
    assert record_launch("local://s/child", environ={"TSM_JOB_ID": "local://s/parent"}) == "local://s/parent"
    assert list(tracker.children("local://s/parent")) == ["local://s/child"]


def test_apprun_outside_a_job_records_nothing(monkeypatch: pytest.MonkeyPatch, tracker: StoreTracker) -> None:
    for k in ("TSM_JOB_ID", "TORCHX_JOB_ID", "TSM_TRACKERS", "TORCHX_TRACKERS", "TSM_PARENT_RUN_ID"):
        monkeypatch.delenv(k, raising=False)
    _RUN_CACHE.clear()
    run = AppRun.run_from_env()
    assert run.job_id() == UNDEFINED_JOB_ID and list(run.backends) == []
    run.add_metadata(x=1)
    assert run.metadata() == {} and run.sources() == [] and run.children() == []
    assert tracker.runs() == []


def test_apprun_from_env_records_its_parent_and_reads_both_ways(monkeypatch: pytest.MonkeyPatch) -> None:
    _RUN_CACHE.clear()
    monkeypatch.setenv("TSM_TRACKERS", "tsm")
    monkeypatch.setenv("TSM_JOB_ID", "local://s/parent")
    monkeypatch.delenv("TSM_PARENT_RUN_ID", raising=False)
    parent = AppRun.run_from_env()
    assert AppRun.run_from_env() is parent  # one run per environment
    monkeypatch.setenv("TSM_JOB_ID", "local://s/child")
    monkeypatch.setenv("TSM_PARENT_RUN_ID", "local://s/parent")
    child = AppRun.run_from_env()
    child.add_artifact("out", "/o")
    assert [s.parent.job_id() for s in child.sources()] == ["local://s/parent"]
    assert [c.job_id() for c in parent.children()] == ["local://s/child"]
    assert child.lineage().ancestors() == ["local://s/parent"]
    assert child.artifacts()["out"].path == "/o"


# -- discovery by entry point ------------------------------------------------------------------------
PLUGIN = textwrap.dedent(
    """
    import json, os
    from tsm.tracker.api import TrackerBase, Lineage

    class FileTracker(TrackerBase):
        '''Appends every call to a JSON-lines file named by its config.'''
        def __init__(self, config):
            self.path = config
        def _log(self, *rec):
            with open(self.path, "a") as f:
                f.write(json.dumps(rec) + "\\n")
        def add_artifact(self, run_id, name, path, metadata=None): self._log("artifact", run_id, name, path)
        def artifacts(self, run_id): return {}
        def add_metadata(self, run_id, **kw): self._log("metadata", run_id, kw)
        def metadata(self, run_id): return {}
        def add_source(self, run_id, source_id, artifact_name=None): self._log("source", run_id, source_id)
        def sources(self, run_id, artifact_name=None): return []
        def lineage(self, run_id): return Lineage(run_id)
        def run_ids(self, **kw): return []

    def create(config):
        return FileTracker(config)
    """
)


@pytest.fixture
def plugin_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A real installed-looking distribution (dist-info with entry points) on sys.path and PYTHONPATH."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "filetracker.py").write_text(PLUGIN)
    info = site / "filetracker-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: filetracker\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[tsm.tracker]\nfiles = filetracker:create\n\n[torchx.tracker]\ntxfiles = filetracker:create\n"
        "tsm = filetracker:create\n"
    )
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("PYTHONPATH", str(site))
    return site


def test_plugins_from_both_entry_point_groups_are_found_and_never_replace_the_builtin(plugin_path: Path) -> None:
    factories = tracker_factories()
    assert {"tsm", "files", "txfiles"} <= set(factories)
    assert isinstance(factories["tsm"](None), StoreTracker)
    assert isinstance(factories["files"](str(plugin_path / "x")), TrackerBase)


def test_a_job_writes_to_every_tracker_its_env_names(plugin_path: Path, tmp_path: Path) -> None:
    log = tmp_path / "calls.jsonl"
    env = tracker_env("local://s/job-1", "local://s/up", environ={"TSM_TRACKERS": "tsm,files",
                                                                    "TSM_TRACKER_FILES_CONFIG": str(log)})
    code = "from tsm.tracker import AppRun; r = AppRun.run_from_env(); r.add_metadata(acc=0.9)"
    import os

    subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, check=True, timeout=120)
    assert [line.split('"')[1] for line in log.read_text().splitlines()] == ["source", "metadata"]
    t = StoreTracker()
    assert t.metadata("local://s/job-1") == {"acc": 0.9}
    assert [s.source_run_id for s in t.sources("local://s/job-1")] == ["local://s/up"]


def test_record_scheduled_reads_what_the_roles_were_told(tracker: StoreTracker, plugin_path: Path, tmp_path: Path) -> None:
    from tsm.specs.api import AppDef, Role
    from tsm.tracker.api import record_scheduled

    env = tracker_env("local://s/${app_id}", "local://s/p", environ={})
    app = AppDef("a", roles=[Role("r", env=dict(env))])
    assert record_scheduled("local://s/a-1", app) == "local://s/p"
    assert list(tracker.children("local://s/p")) == ["local://s/a-1"]
    off = AppDef("a", roles=[Role("r", env={**env, "TSM_TRACKERS": "", "TORCHX_TRACKERS": ""})])
    assert record_scheduled("local://s/a-2", off) is None
    # a tracker that fails is logged, never raised: the launched app keeps its handle
    broken = AppDef("a", roles=[Role("r", env={**env, "TSM_TRACKERS": "files"})])  # config None: open(None) fails
    assert record_scheduled("local://s/a-3", broken) == "local://s/p"
