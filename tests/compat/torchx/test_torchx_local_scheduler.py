"""TorchX's scheduler modules at TorchX's paths, and the in-process ``LocalScheduler`` shape tools subclass.

The subclass below is written the way NeMo-Run's local executor is: it skips ``__init__`` and sets TorchX's
private attributes itself, builds its request with ``_to_popen_request``, and reads ``_apps`` of
``_LocalAppDef`` and the replica log files.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tsm.compat.torchx.schedulers import local_scheduler as ls
from tsm.specs import AppDef, AppDryRunInfo, AppState, Role


class ToolScheduler(ls.LocalScheduler):
    """A tool's subclass: no ``super().__init__``, its own cfg object turned into TorchX's dict."""

    def __init__(self, session_name: str, log_dir: str) -> None:
        self.backend = "local"
        self.session_name = session_name
        self._apps: dict[str, ls._LocalAppDef] = {}
        self._image_provider_class = ls.CWDImageProvider
        self._cache_size = 100
        self._extra_paths: list[str] = []
        self._base_log_dir: str | None = None
        self._created_tmp_log_dir = False
        self._log_dir = log_dir

    def submit_dryrun(self, app: AppDef, cfg: Any) -> AppDryRunInfo[ls.PopenRequest]:  # type: ignore[override]
        info = self._submit_dryrun(app, cfg)  # the tool's cfg is its own object, not a mapping
        info._app = app
        return info

    def _submit_dryrun(self, app: AppDef, cfg: Any) -> AppDryRunInfo[ls.PopenRequest]:
        return AppDryRunInfo(self._to_popen_request(app, {"log_dir": self._log_dir}))


def _wait(s: ls.LocalScheduler, app_id: str) -> AppState:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        desc = s.describe(app_id)
        assert desc is not None
        if desc.state.is_terminal:
            return desc.state
        time.sleep(0.05)
    raise AssertionError("app did not end")


def test_a_tool_subclass_runs_an_app_and_reads_torchxs_log_layout(tmp_path: Path) -> None:
    s = ToolScheduler("tool", str(tmp_path / "logs"))
    app = AppDef("hi", [Role("r", entrypoint=sys.executable,
                             args=["-c", "import os,sys; print('out', os.environ['TORCHX_RANK0_HOST']); print('err', file=sys.stderr)"],
                             num_replicas=2)])
    info = s.submit_dryrun(app, object())
    request = info.request
    assert isinstance(request, ls.PopenRequest) and request.app_id.startswith("hi-")
    assert request.log_dir == str(tmp_path / "logs" / "tool" / request.app_id)
    app_id = s.schedule(info)
    assert isinstance(s._apps[app_id], ls._LocalAppDef)
    assert _wait(s, app_id) == AppState.SUCCEEDED
    local_app = s._apps[app_id]
    assert local_app.state == AppState.SUCCEEDED and sorted(local_app.role_replicas) == ["r"]
    replica_dir = Path(local_app.log_dir) / "r" / "1"
    assert (replica_dir / ls.STDOUT_LOG).read_text() == "out localhost\n"
    assert (replica_dir / ls.STDERR_LOG).read_text() == "err\n"
    assert sorted((replica_dir / ls.COMBINED_LOG).read_text().splitlines()) == ["err", "out localhost"]
    lines = list(ls.LogIterator(app_id, str(replica_dir / ls.STDOUT_LOG), s))
    assert "".join(lines) == "out localhost\n"
    assert list(s.log_iter(app_id, "r", 0, streams=None)) != []
    s.close()


def test_kill_ends_the_replicas_whole_process_group(tmp_path: Path) -> None:
    s = ls.create_scheduler("kill")
    marker = tmp_path / "child.pid"
    script = f"import subprocess,sys,time; p=subprocess.Popen(['sleep','60']); open({str(marker)!r},'w').write(str(p.pid)); time.sleep(60)"
    app_id = s.submit(AppDef("k", [Role("r", entrypoint=sys.executable, args=["-c", script])]), {})
    deadline = time.monotonic() + 30
    while not (marker.exists() and marker.read_text()):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    child = int(marker.read_text())
    s._apps[app_id].kill()  # as a tool calls it
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{child}") and Path(f"/proc/{child}/stat").read_text().split()[2] != "Z":
        assert time.monotonic() < deadline, "the replica's child outlived kill()"
        time.sleep(0.05)
    s.cancel(app_id)  # idempotent on an ended app
    s.close()


def test_cancel_and_torchx_spellings(tmp_path: Path) -> None:
    s = ls.create_scheduler("c", cache_size=1)
    app_id = s.submit(AppDef("s", [Role("r", entrypoint="sleep", args=["60"])]), {"log_dir": str(tmp_path)})
    assert s._run_opts().get("log_dir") is not None and s.run_opts().get("prepend_cwd") is not None
    s._validate(AppDef("s"), "local", {})  # TorchX's three-argument form
    s.cancel(app_id)
    desc = s.describe(app_id)
    assert desc is not None and desc.state == AppState.CANCELLED
    assert desc.ui_url == f"file://{tmp_path}/c/{app_id}"
    assert s.describe("nope") is None
    s.cancel("nope")
    s.submit(AppDef("t", [Role("r", entrypoint="true")]), {"log_dir": str(tmp_path)})  # evicts the ended one
    assert app_id not in s._apps
    s.close()


def test_failed_replica_fails_the_app_and_reports_its_exit(tmp_path: Path) -> None:
    s = ls.create_scheduler("f")
    app_id = s.submit(AppDef("f", [Role("r", entrypoint="sh", args=["-c", "exit 3"])]), {"log_dir": str(tmp_path)})
    assert _wait(s, app_id) == AppState.FAILED
    desc = s.describe(app_id)
    assert desc is not None and desc.roles_statuses[0].replicas[0].exit_code == 3
    s.close()


def test_image_providers() -> None:
    role = Role("r", image="/img", entrypoint="train.py", args=["--x"])
    cwd = ls.CWDImageProvider({})
    assert cwd.fetch("anything") == os.getcwd()
    assert cwd.get_replica_param(cwd.fetch(""), role).args == ["train.py", "--x"]
    d = ls.LocalDirectoryImageProvider({})
    with pytest.raises(ValueError):
        d.fetch("/does/not/exist")
    assert d.get_cwd("/img") == "/img"


def test_docker_slurm_kubernetes_modules_at_torchx_paths() -> None:
    from tsm.schedulers import docker_scheduler, kubernetes_scheduler, slurm_scheduler
    from tsm.schedulers.docker.scheduler import DockerScheduler
    from tsm.schedulers.kubernetes.scheduler import KubernetesScheduler
    from tsm.schedulers.slurm.scheduler import SlurmScheduler

    assert docker_scheduler.DockerScheduler is DockerScheduler and callable(docker_scheduler.create_scheduler)
    assert docker_scheduler._to_str(b"caf\xc3\xa9") == "café" and docker_scheduler._to_str("x") == "x"
    assert slurm_scheduler.SlurmScheduler is SlurmScheduler and callable(slurm_scheduler.create_scheduler)
    states = slurm_scheduler.SLURM_STATES
    assert states["COMPLETED"] == AppState.SUCCEEDED and states["TIMEOUT"] == AppState.FAILED
    assert states["CANCELLED"] == AppState.CANCELLED and states["PENDING"] == AppState.PENDING
    assert slurm_scheduler.appstate_from_slurm_state("NEW_STATE") == AppState.UNKNOWN
    assert kubernetes_scheduler.KubernetesScheduler is KubernetesScheduler


def test_signal_group_never_signals_init() -> None:
    class Fake:
        pid = 1

    rep = ls._LocalReplica("r", 0, Fake(), "/nonexistent", [])  # type: ignore[arg-type]
    rep.signal_group(signal.SIGKILL)  # a no-op, not a kill of every process
