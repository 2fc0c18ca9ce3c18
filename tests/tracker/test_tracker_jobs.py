"""Run tracking with real jobs on the local scheduler, and ``tsm tracker list | show | lineage``.

A job records metadata and an artifact through ``AppRun.run_from_env()``; a job that launches a child
job (through the Runner, from inside the job) gets it recorded as its child with no argument passed:
lineage holds both ways. Nothing is mocked; the store is the test's own ``$TSM_HOME``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from testutil import HANG
from tsm.runner.api import Runner, get_runner
from tsm.specs.api import AppDef, AppState, Role
from tsm.tracker.store import StoreTracker

TSM = [sys.executable, "-m", "tsm.cli.main"]


@pytest.fixture
def runner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Runner]:
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    for k in ("TSM_JOB_ID", "TORCHX_JOB_ID", "TSM_TRACKERS", "TORCHX_TRACKERS", "TSM_PARENT_RUN_ID", "TORCHX_PARENT_RUN_ID"):
        monkeypatch.delenv(k, raising=False)
    with get_runner() as r:
        yield r
        for app in r.list("local"):
            if not app.state.is_terminal:
                r.cancel(app.app_handle)


def py_app(name: str, code: str) -> AppDef:
    return AppDef(name, roles=[Role(name, entrypoint=sys.executable, args=["-c", textwrap.dedent(code)])])


def tsm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*TSM, *args], capture_output=True, text=True, timeout=HANG, stdin=subprocess.DEVNULL)


def finish(runner: Runner, handle: str) -> None:
    status = runner.wait(handle, timeout=HANG)
    logs = "".join(runner.log_lines(handle, runner.describe(handle).roles[0].name, 0))
    assert status.state == AppState.SUCCEEDED, f"{status}\n{logs}"


RECORDER = """
    import os
    from tsm.tracker import AppRun
    run = AppRun.run_from_env()
    assert run.job_id() == os.environ["TSM_JOB_ID"] == os.environ["TORCHX_JOB_ID"], run.job_id()
    run.add_metadata(lr=0.01, epochs=3, name="baseline")
    run.add_artifact("model", "/ckpt/model.pt", {"format": "pt", "bytes": 123})
    print("recorded", run.job_id())
"""


def test_a_job_records_metadata_and_an_artifact(runner: Runner) -> None:
    handle = runner.run(py_app("rec", RECORDER), scheduler="local")
    finish(runner, handle)
    tracker = StoreTracker()
    assert tracker.metadata(handle) == {"lr": 0.01, "epochs": 3, "name": "baseline"}
    model = tracker.artifacts(handle)["model"]
    assert (model.path, model.metadata) == ("/ckpt/model.pt", {"format": "pt", "bytes": 123})
    assert list(tracker.sources(handle)) == []  # launched from outside any job: no parent

    listed = tsm("tracker", "list")
    assert listed.returncode == 0 and handle in listed.stdout
    shown = tsm("tracker", "show", handle, "--json")
    assert shown.returncode == 0, shown.stderr
    data = json.loads(shown.stdout)
    assert data["metadata"]["lr"] == 0.01 and data["artifacts"]["model"]["path"] == "/ckpt/model.pt"
    text = tsm("tracker", "show", handle).stdout
    assert "lr = 0.01" in text and "model: /ckpt/model.pt" in text


PARENT = """
    import os, sys
    from tsm.runner.api import get_runner
    from tsm.specs.api import AppDef, Role
    from tsm.tracker import AppRun

    AppRun.run_from_env().add_metadata(role="parent")
    child_code = (
        "from tsm.tracker import AppRun; r = AppRun.run_from_env(); "
        "r.add_metadata(role='child'); r.add_artifact('out', '/tmp/child.out')"
    )
    with get_runner() as runner:
        child = runner.run(AppDef("child", roles=[Role("child", entrypoint=sys.executable, args=["-c", child_code])]),
                           scheduler="local")
        print("CHILD", child, flush=True)
        assert runner.wait(child, timeout=120).state.name == "SUCCEEDED"
"""


def test_a_job_that_launches_a_job_is_its_parent_both_ways(runner: Runner) -> None:
    parent = runner.run(py_app("parent", PARENT), scheduler="local")
    finish(runner, parent)
    child = next(line.split()[1] for line in runner.log_lines(parent, "parent", 0) if line.startswith("CHILD"))
    tracker = StoreTracker()
    assert [s.source_run_id for s in tracker.sources(child)] == [parent]
    assert list(tracker.children(parent)) == [child]
    assert tracker.metadata(child) == {"role": "child"} and tracker.metadata(parent) == {"role": "parent"}
    assert tracker.artifacts(child)["out"].path == "/tmp/child.out"
    lineage = tracker.lineage(child)
    assert lineage.ancestors() == [parent]
    assert tracker.lineage(parent).descendants() == [child]

    tree = tsm("tracker", "lineage", child)
    assert tree.returncode == 0 and parent in tree.stdout and f"* {child}" in tree.stdout
    down = json.loads(tsm("tracker", "lineage", parent, "--json").stdout)
    assert [c["run_id"] for c in down["children"]] == [child]


def test_explicit_parent_run_id_is_recorded_even_if_the_job_records_nothing(runner: Runner) -> None:
    handle = runner.run(py_app("quiet", "print('no tracking calls')"), scheduler="local", parent_run_id="exp:sweep-42")
    finish(runner, handle)
    assert [s.source_run_id for s in StoreTracker().sources(handle)] == ["exp:sweep-42"]
    assert handle in tsm("tracker", "lineage", "exp:sweep-42").stdout


def test_tracking_off_records_nothing(runner: Runner, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TSM_TRACKERS", "")
    handle = runner.run(py_app("off", RECORDER), scheduler="local")
    finish(runner, handle)
    assert StoreTracker().metadata(handle) == {}
    assert tsm("tracker", "list").stdout == "no tracked runs\n"


def test_unknown_run_is_a_one_line_usage_error() -> None:
    r = tsm("tracker", "show", "local://default/nope")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and "no tracked run" in r.stderr
    assert tsm("tracker", "lineage", "x").returncode == 2
    assert tsm("tracker").returncode == 2
    env_home = os.environ["TSM_HOME"]
    assert env_home  # the test's own store


def test_every_replica_of_a_role_records_at_once(runner: Runner) -> None:
    """Eight replicas write to the same run in the same instant: the store serialises them, none is lost."""
    code = """
        import os
        from tsm.tracker import AppRun
        rank = os.environ["TSM_REPLICA_ID"]
        run = AppRun.run_from_env()
        for i in range(5):
            run.add_metadata(**{f"rank{rank}_step{i}": i})
        run.add_artifact(f"shard{rank}", f"/out/shard{rank}")
    """
    app = AppDef("many", roles=[Role("many", entrypoint=sys.executable, args=["-c", textwrap.dedent(code)], num_replicas=8)])
    handle = runner.run(app, scheduler="local")
    status = runner.wait(handle, timeout=HANG)
    assert status.state == AppState.SUCCEEDED, status
    tracker = StoreTracker()
    assert len(tracker.metadata(handle)) == 40
    assert sorted(tracker.artifacts(handle)) == [f"shard{r}" for r in range(8)]
