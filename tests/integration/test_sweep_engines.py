"""Sweeps on real engines: a small capped grid through the Runner and the detached controller.

Slurm (``scripts/slurm-up``: 4 nodes on this host) and Docker (``scripts/docker-up``). Each checks that every
trial ran exactly once (a marker line per trial, or the engine's record), that the cap held (from the
controller's recorded transitions), and, on Slurm, that the metrics the trials recorded through the tracker
come back in the results table. On Slurm the single-role grid is one job array (SweepNative; its cap is
checked from sacct in test_slurm_sweep.py), so the controller-event cap check there holds trivially.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tsm import get_runner
from tsm.sweep import run_sweep, sweep_trials, sweep_wait
from tsm.sweep.results import read_metrics, rows, sort_rows
from tsm.sweep.state import SweepState, max_concurrent, parse_sweep_handle

HANG = 300.0

SLURM_COMPONENT = '''
import sys
from tsm import AppDef, Resource, Role


def fit(lr: float = 0.1, batch: int = 32, markers: str = "") -> AppDef:
    code = (
        "import os\\n"
        "from tsm.tracker import AppRun\\n"
        f"open(os.path.join({markers!r}, 'lr{lr}-b{batch}'), 'a').write(os.environ['TSM_JOB_ID'] + chr(10))\\n"
        f"AppRun.run_from_env().add_metadata(loss=abs({lr} - 0.01) * 100 + 64 / {batch})\\n"
    )
    return AppDef(name="fit", roles=[Role(name="trainer", image="", entrypoint=sys.executable, args=["-c", code],
                                          resource=Resource(cpu=1, memMB=200))])
'''

DOCKER_COMPONENT = '''
from tsm import AppDef, Resource, Role


def fit(lr: float = 0.1, batch: int = 32) -> AppDef:
    return AppDef(name="fit", roles=[Role(name="trainer", image="{image}", entrypoint="sh",
                                          args=["-c", f"echo lr={{lr}} batch={{batch}}; sleep 0.3"],
                                          resource=Resource(cpu=1, memMB=256))])
'''


def _said(runner: object, handle: str) -> tuple[str, str]:
    """What a failed trial's app says of its end, and its log (for a failure's message)."""
    desc = runner.describe(handle)  # type: ignore[attr-defined]
    try:
        log = "".join(runner.log_lines(handle, "trainer", 0))  # type: ignore[attr-defined]
    except Exception as e:  # noqa: BLE001 (a message, whatever stops the read)
        log = f"(no log: {e})"
    return (desc.msg if desc is not None else "(no app)"), log


def _events(handle: str) -> list[tuple[float, int, str]]:
    state = SweepState.open(parse_sweep_handle(handle))
    try:
        return state.events()
    finally:
        state.close()


@pytest.mark.integration
@pytest.mark.slurm
def test_capped_grid_on_slurm_runs_each_trial_once_and_reads_back_metrics(
    slurm_cluster: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    (tmp_path / "fit.py").write_text(SLURM_COMPONENT)
    markers = tmp_path / "markers"
    markers.mkdir()
    with get_runner("sweepit") as runner:
        handle = run_sweep(runner, f"{tmp_path / 'fit.py'}:fit", {"lr": "0.1,0.01", "batch": "32,64"},
                                  scheduler="slurm", parallel=2, args=["--markers", str(markers)], metric="loss")
        status = sweep_wait(handle, timeout=HANG)
        assert status.state == "SUCCEEDED", status.summary()
        trials = sweep_trials(handle)
        assert all(t.handle and t.handle.startswith("slurm://sweepit/") for t in trials)
    assert max_concurrent(_events(handle)) <= 2
    assert sorted(len(p.read_text().splitlines()) for p in markers.iterdir()) == [1, 1, 1, 1]
    table = sort_rows(rows(trials, read_metrics([t.handle for t in trials if t.handle])), "loss")
    assert [r.params for r in table][0] == {"lr": "0.01", "batch": "64"}
    assert all("loss" in r.metrics for r in table)


@pytest.mark.integration
@pytest.mark.docker
def test_capped_grid_on_docker(docker_engine: object, tmp_path: Path) -> None:
    from integration.docker_engine import PYTHON_IMAGE

    (tmp_path / "fit.py").write_text(DOCKER_COMPONENT.format(image=PYTHON_IMAGE))
    with get_runner("sweepit") as runner:
        handle = run_sweep(runner, f"{tmp_path / 'fit.py'}:fit", {"lr": "0.1,0.01", "batch": "32,64"},
                                  scheduler="docker", parallel=2)
        status = sweep_wait(handle, timeout=HANG)
        trials = sweep_trials(handle)
        assert status.state == "SUCCEEDED", (status.summary(), [
            (t.params, t.state, t.msg, t.handle and _said(runner, t.handle)) for t in trials if t.state != "SUCCEEDED"])
        for t in trials:
            assert t.handle and t.handle.startswith("docker://sweepit/")
            lines = list(runner.log_lines(t.handle, "trainer", 0))
            assert "".join(lines).strip() == f"lr={t.params['lr']} batch={t.params['batch']}"
            runner.delete(t.handle)
    assert max_concurrent(_events(handle)) <= 2


SH_COMPONENT = '''
from tsm import AppDef, Resource, Role


def fit(lr: float = 0.1, batch: int = 32) -> AppDef:
    return AppDef(name="fit", roles=[Role(name="trainer", image={image!r}, entrypoint="sh",
                                          args=["-c", f"echo lr={{lr}} batch={{batch}}; sleep 0.3"],
                                          resource=Resource(cpu=1, memMB=128))])
'''


def _check_trials(runner: object, handle: str, scheme: str) -> None:
    """Every trial is an ordinary app of the scheduler whose log is its own parameter line; the cap held."""
    from tsm.runner.api import Runner

    assert isinstance(runner, Runner)
    status = sweep_wait(handle, timeout=HANG)
    trials = sweep_trials(handle)
    why = [(t.params, t.state, (runner.status(t.handle) or t).msg if t.handle else "") for t in trials]
    assert status.state == "SUCCEEDED", (status.summary(), why)
    assert len(trials) == 4
    for t in trials:
        assert t.handle and t.handle.startswith(f"{scheme}://sweepit/")
        lines = [ln for ln in runner.log_lines(t.handle, "trainer", 0) if ln.strip()]
        assert "".join(lines).strip() == f"lr={t.params['lr']} batch={t.params['batch']}"
    assert max_concurrent(_events(handle)) <= 2


@pytest.mark.integration
@pytest.mark.ray
def test_capped_grid_on_ray(ray_cluster: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # the launching directory is each trial's working_dir: keep it small
    (tmp_path / "fit.py").write_text(SH_COMPONENT.format(image=""))
    address = ray_cluster.address
    with get_runner("sweepit") as runner:
        handle = run_sweep(runner, f"{tmp_path / 'fit.py'}:fit", {"lr": "0.1,0.01", "batch": "32,64"},
                                  scheduler="ray", cfg={"address": address, "ship_cwd": False}, parallel=2)
        _check_trials(runner, handle, "ray")


@pytest.mark.integration
@pytest.mark.kubernetes
def test_capped_grid_on_kubernetes(k8s_cluster: object, tmp_path: Path) -> None:
    image = k8s_cluster.python_image
    (tmp_path / "fit.py").write_text(SH_COMPONENT.format(image=image))
    with get_runner("sweepit") as runner:
        handle = run_sweep(runner, f"{tmp_path / 'fit.py'}:fit", {"lr": "0.1,0.01", "batch": "32,64"},
                                  scheduler="kubernetes", cfg={"request_fraction": 0.1, "gang_timeout": 120.0},
                                  parallel=2)
        _check_trials(runner, handle, "kubernetes")
