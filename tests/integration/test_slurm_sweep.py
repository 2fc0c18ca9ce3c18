"""Sweeps on the real Slurm cluster (``scripts/slurm-up``: 4 nodes on this host), issue 24.

A sweep of single-role trials is one job array whose ``%P`` cap Slurm enforces: checked from the array's
script, from ``scontrol``'s ``ArrayTaskThrottle`` and from the start and end times Slurm's accounting
recorded for each task (never by timing the test). Every trial is an ordinary app: its logs (its own
command line) and the metrics it recorded through the tracker come back through tsm. A sweep of two-role
trials (a heterogeneous job, which cannot be an array) still runs through the controller.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tsm import get_runner
from tsm.specs.handles import parse_app_handle
from tsm.sweep import run_sweep, sweep_status, sweep_trials, sweep_wait
from tsm.sweep.results import read_metrics, rows, sort_rows
from tsm.sweep.state import SweepState, parse_sweep_handle

HANG = 400.0

COMPONENT = '''
import sys
from tsm import AppDef, Resource, Role


def fit(lr: float = 0.1, batch: int = 32, tag: str = "", roles: int = 1, sleep: float = 2) -> AppDef:
    code = (
        "import os, time\\n"
        "from tsm.tracker import AppRun\\n"
        f"print('lr=' + {str(lr)!r} + ' batch=' + {str(batch)!r} + ' tag=' + {tag!r}, flush=True)\\n"
        f"time.sleep({sleep})\\n"
        f"AppRun.run_from_env().add_metadata(loss=abs({lr} - 0.01) * 100 + 64 / {batch})\\n"
    )
    return AppDef(name="fit", roles=[
        Role(name=f"r{i}", image="", entrypoint=sys.executable, args=["-c", code], resource=Resource(cpu=1, memMB=100))
        for i in range(roles)
    ])
'''


def _meta(handle: str) -> dict[str, object]:
    state = SweepState.open(parse_sweep_handle(handle))
    try:
        return state.meta()
    finally:
        state.close()


def _most_overlapping(intervals: list[tuple[int, int]]) -> int:
    """The most intervals ``[start, end)`` that hold one same instant."""
    edges = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])  # an end before a start
    most = live = 0
    for _, step in edges:
        live += step
        most = max(most, live)
    return most


@pytest.mark.integration
@pytest.mark.slurm
def test_single_role_sweep_is_one_capped_job_array(
    slurm_cluster: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    (tmp_path / "fit.py").write_text(COMPONENT)
    with get_runner("arraysweep") as runner:
        handle = run_sweep(runner,
            f"{tmp_path / 'fit.py'}:fit",
            {"lr": "0.1,0.05,0.01,0.005,0.001", "batch": "32,64", "tag": ["it's $HOME", "a `b` c"]},
            scheduler="slurm", parallel=4, metric="loss",
        )
        trials = sweep_trials(handle)
        assert len(trials) == 20
        app_ids = [parse_app_handle(t.handle or "").app_id for t in trials]
        array_id = app_ids[0].partition("_")[0]
        assert app_ids == [f"{array_id}_{i}" for i in range(20)]  # one job: the array, task i is trial i
        meta = _meta(handle)
        assert meta["native"] is True and meta["array"] == array_id
        scontrol = subprocess.run(["scontrol", "show", "job", array_id], capture_output=True, text=True).stdout
        assert "ArrayTaskThrottle=4" in scontrol, scontrol

        status = sweep_wait(handle, timeout=HANG)
        assert status.state == "SUCCEEDED", status.summary()
        trials = sweep_trials(handle)
        for t in trials:
            assert t.state == "SUCCEEDED" and t.handle
            out = "".join(runner.log_lines(t.handle, "r0", 0))
            assert out == f"lr={float(t.params['lr'])} batch={t.params['batch']} tag={t.params['tag']}\n"
            st = runner.status(t.handle)
            assert st is not None and st.state.name == "SUCCEEDED"

    job_dir = Path(_job_dir_of(app_ids[0]))
    array_script = (job_dir.parent / f"{job_dir.name}-array" / "job.sbatch").read_text()
    assert "#SBATCH --array=0-19%4" in array_script

    # the cap, as Slurm recorded it: every task's start and end in its accounting
    spans = _task_spans(array_id, 20)
    assert len(spans) == 20 and all(0 < s <= e for s, e in spans)
    assert _most_overlapping(spans) <= 4
    assert _most_overlapping(spans) >= 2  # the cap was reached, not just respected by running one at a time

    table = sort_rows(rows(trials, read_metrics([t.handle for t in trials if t.handle])), "loss")
    assert all("loss" in r.metrics for r in table)
    assert table[0].params["lr"] == "0.01" and table[0].params["batch"] == "64"


def _task_spans(array_id: str, n: int) -> list[tuple[int, int]]:
    """Each task's (start, end) from ``sacct``; slurmdbd records an ended task a moment after squeue shows it
    ended, so this asks again (up to a minute) until all ``n`` tasks have an end."""
    spans: list[tuple[int, int]] = []
    for _ in range(60):
        sacct = subprocess.run(["sacct", "--json", "-j", array_id], capture_output=True, text=True, check=True)
        spans = [(j["time"]["start"], j["time"]["end"]) for j in json.loads(sacct.stdout)["jobs"]
                 if (j.get("array") or {}).get("job_id") == int(array_id) and j["time"]["end"]]
        if len(spans) >= n:
            break
        time.sleep(1.0)
    return spans


def _job_dir_of(app_id: str) -> str:
    from tsm.schedulers.slurm.scheduler import SlurmScheduler

    found = SlurmScheduler("sweep").job_dir(app_id)
    assert found is not None
    return str(found)


@pytest.mark.integration
@pytest.mark.slurm
def test_multi_role_sweep_runs_through_the_controller(
    slurm_cluster: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    (tmp_path / "fit.py").write_text(COMPONENT)
    with get_runner("hetsweep") as runner:
        handle = run_sweep(runner, f"{tmp_path / 'fit.py'}:fit", {"lr": "0.1,0.01"}, scheduler="slurm",
                                  parallel=1, args=["--roles", "2"], metric="loss")
        status = sweep_wait(handle, timeout=HANG)
        assert status.state == "SUCCEEDED", status.summary()
        trials = sweep_trials(handle)
    meta = _meta(handle)
    assert meta["native"] is False and "controller_pid" in meta
    for t in trials:
        assert t.handle and parse_app_handle(t.handle).app_id.isdigit()  # a heterogeneous job each, no array
    table = rows(trials, read_metrics([t.handle for t in trials if t.handle]))
    assert all("loss" in r.metrics for r in table)


@pytest.mark.integration
@pytest.mark.slurm
def test_cancelling_an_array_sweep_from_the_command_line_ends_every_trial(
    slurm_cluster: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    (tmp_path / "fit.py").write_text(COMPONENT)
    with get_runner("cancelsweep") as runner:
        handle = run_sweep(runner, f"{tmp_path / 'fit.py'}:fit", {"lr": "0.1,0.2,0.3,0.4,0.5,0.6"},
                                  scheduler="slurm", parallel=2, args=["--sleep", "300"])
        for _ in range(120):  # until Slurm started the first two (an observation, not a timing)
            if sweep_status(handle).counts.get("RUNNING", 0) == 2:
                break
            time.sleep(0.5)
        assert sweep_status(handle).counts == {"RUNNING": 2, "SUBMITTED": 4}
    tsm = [sys.executable, "-m", "tsm.cli.main"]
    done = subprocess.run([*tsm, "sweep", "cancel", handle], capture_output=True, text=True, timeout=200)
    assert done.returncode == 0, done.stderr
    shown = subprocess.run([*tsm, "sweep", "status", handle], capture_output=True, text=True, timeout=60)
    assert "CANCELLED (6 trials: 6 cancelled)" in shown.stdout, shown.stdout + shown.stderr
    table = subprocess.run([*tsm, "sweep", "show", handle, "--json"], capture_output=True, text=True, timeout=60)
    assert {r["state"] for r in json.loads(table.stdout)} == {"CANCELLED"}
    array_id = _meta(handle)["array"]
    queue = subprocess.run(["squeue", "-h", "-t", "PENDING,RUNNING", "-o", "%i"], capture_output=True, text=True)
    assert not [line for line in queue.stdout.split() if line.startswith(f"{array_id}_")]
