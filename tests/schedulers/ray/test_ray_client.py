"""The ray scheduler against a stand-in dashboard (an HTTP server in the test): issue 30 items 1, 3, 6 and 10
and issue 29 items 18 and 20 for Ray -- which address wins, what an unreachable or silent head gives, private
files, env values kept out of the job's listing, no SDK chatter, and a role without a resource."""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tsm.errors import SchedulerUnavailableError
from tsm.runner.api import get_runner
from tsm.schedulers.ray import create_scheduler
from tsm.schedulers.ray.client import RayClient
from tsm.specs.api import AppDef, AppState, Resource, Role

SECURITY = "Security"
FAULTS = "Faults"


def _listing(items: list[Any]) -> dict[str, Any]:
    """A State API answer, with every field Ray's own client reads."""
    return {"result": True, "msg": "", "data": {"result": {
        "result": items, "total": len(items), "num_after_truncation": len(items), "num_filtered": len(items),
        "partial_failure_warning": "", "warnings": None}}}


class FakeDashboard:
    """Just enough of Ray's dashboard HTTP API: nodes, packages, job submit/info/list/stop; records requests."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, bytes]] = []
        self.packages: set[str] = set()
        self.jobs: dict[str, dict[str, Any]] = {}
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a: Any) -> None:
                pass

            def _send(self, code: int, body: Any) -> None:
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _body(self) -> bytes:
                n = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(n) if n else b""

            def do_GET(self) -> None:
                outer.requests.append(("GET", self.path, b""))
                if self.path.startswith("/api/v0/nodes"):
                    node = {"node_id": "n" * 56, "node_ip": "127.0.0.1", "is_head_node": True, "state": "ALIVE",
                            "state_message": None, "node_name": "127.0.0.1", "labels": {},
                            "resources_total": {"CPU": 8.0, "memory": 1e10}, "start_time_ms": 1, "end_time_ms": 0}
                    self._send(200, _listing([node]))
                elif self.path == "/api/version":
                    self._send(200, {"version": "4", "ray_version": "2.60.0", "ray_commit": "0", "session_name": "s"})
                elif self.path.startswith("/api/v0/actors"):
                    self._send(200, _listing([]))
                elif self.path.startswith("/api/packages/"):
                    self._send(200 if self.path in outer.packages else 404, b"")
                elif self.path == "/api/jobs/":
                    self._send(200, list(outer.jobs.values()))
                elif self.path.startswith("/api/jobs/"):
                    job = outer.jobs.get(self.path.rsplit("/", 1)[1])
                    self._send(200, job) if job else self._send(404, b"Job does not exist")
                else:
                    self._send(404, b"")

            def do_PUT(self) -> None:
                body = self._body()
                outer.requests.append(("PUT", self.path, body))
                outer.packages.add(self.path)
                self._send(200, b"")

            def do_POST(self) -> None:
                body = self._body()
                outer.requests.append(("POST", self.path, body))
                if self.path == "/api/jobs/":
                    req = json.loads(body)
                    outer.jobs[req["submission_id"]] = {**req, "type": "SUBMISSION", "status": "RUNNING", "message": "",
                                                        "driver_node_id": ""}
                    self._send(200, {"submission_id": req["submission_id"], "job_id": None})
                elif self.path.endswith("/stop"):
                    outer.jobs[self.path.split("/")[3]]["status"] = "STOPPED"
                    self._send(200, {"stopped": True})
                else:
                    self._send(404, b"")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def dashboard() -> Iterator[FakeDashboard]:
    d = FakeDashboard()
    yield d
    d.close()


def _dead_address() -> str:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}"


def _app(secret: str = "") -> AppDef:
    return AppDef("echo", [Role("echo", entrypoint="echo", args=["hi"], env={"API_TOKEN": secret} if secret else {},
                                resource=Resource(cpu=1, gpu=0, memMB=64))])


# -- issue 30 item 3: the address --------------------------------------------------------------------------


def test_run_option_address_wins_over_ray_address_for_the_apps_whole_life(
    dashboard: FakeDashboard, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("RAY_ADDRESS", _dead_address())  # a bad $RAY_ADDRESS, a good -c address
    monkeypatch.chdir(tmp_path)
    with get_runner("t") as runner:
        info = runner.dryrun(_app(), "ray", cfg={"address": dashboard.address})
        assert dashboard.address in str(info)  # the dry run says where it goes...
        handle = runner.schedule(info)  # ...and the real call goes there
        status = runner.status(handle)  # and so does every later call about the app, from this process
    assert status is not None and status.state == AppState.RUNNING
    assert any(m == "POST" and p == "/api/jobs/" for m, p, _ in dashboard.requests)
    again = create_scheduler("t")  # another process: the app's record keeps its cluster
    d = again.describe(handle.rsplit("/", 1)[1])
    assert d is not None and d.state == AppState.RUNNING


@pytest.mark.reliability(
    "Ray: an unreachable head or a wrong address",
    expect="one line naming the address and what to do (-c address=, make ray-up), SchedulerUnavailableError",
    group=FAULTS,
)
def test_unreachable_head_is_one_line_saying_what_to_do(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    dead = _dead_address()
    with get_runner("t") as runner, pytest.raises(SchedulerUnavailableError) as e:
        runner.run(_app(), "ray", cfg={"address": dead})
    msg = str(e.value)
    assert "\n" not in msg and dead in msg and "-c address=" in msg and "ServerUnavailable" not in msg


@pytest.mark.reliability(
    "Ray: a head that accepts and never answers",
    expect="every call (status, cancel, logs, list) gives up after its timeout with SchedulerUnavailableError",
    group=FAULTS,
)
def test_a_silent_head_never_hangs_a_call() -> None:
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)  # accepts (the kernel does) and never answers
    client = RayClient(f"http://127.0.0.1:{silent.getsockname()[1]}", timeout=0.5)
    outcome: list[str] = []

    def calls() -> None:
        for call in (client.list_jobs, lambda: client.job("a"), lambda: client.stop("a"), client.nodes,
                     lambda: client.read("n", "f")):
            try:
                call()
                outcome.append("answered")
            except SchedulerUnavailableError as e:
                outcome.append("did not answer" if "did not answer" in str(e) else str(e))

    t = threading.Thread(target=calls, daemon=True)
    t.start()
    t.join(120)  # a guard against the hang itself, not a timing: each call takes the 0.5 s timeout
    silent.close()
    assert outcome == ["did not answer"] * 5


# -- issue 29 items 18 and 20: private files, env values ------------------------------------------------------


@pytest.mark.reliability(
    "Ray: files tsm writes are private whatever $TSM_HOME's mode",
    expect="with $TSM_HOME 0755: the app's folder 0700, app.json and the payload (env values) 0600",
    group=SECURITY,
)
def test_files_are_private_whatever_the_homes_mode(
    dashboard: FakeDashboard, tsm_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    os.chmod(tsm_home, 0o755)
    (tsm_home / "ray").mkdir(mode=0o755)
    os.chmod(tsm_home / "ray", 0o755)
    monkeypatch.chdir(tmp_path)
    s = create_scheduler("t", address=dashboard.address)
    app_id = s.schedule(s.submit_dryrun(_app("s3cr3t-value"), {}))
    app_dir = tsm_home / "ray" / app_id
    paths = [app_dir, *app_dir.rglob("*")]
    loose = [(str(p), oct(p.stat().st_mode & 0o777)) for p in paths if p.stat().st_mode & 0o077]
    assert loose == [] and any(p.name == "payload.json" for p in paths)


@pytest.mark.reliability(
    "Ray: env values are not in the job's listing",
    expect="a role's env value appears in no job field the dashboard lists (entrypoint, metadata, runtime_env)",
    group=SECURITY,
)
def test_env_values_stay_out_of_the_job_listing(
    dashboard: FakeDashboard, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    s = create_scheduler("t", address=dashboard.address)
    s.schedule(s.submit_dryrun(_app("s3cr3t-value"), {}))
    submitted = [body for m, p, body in dashboard.requests if m == "POST" and p == "/api/jobs/"]
    assert len(submitted) == 1 and b"s3cr3t-value" not in submitted[0]
    assert "s3cr3t-value" not in json.dumps(s.client(dashboard.address).list_jobs()[0].__dict__)


# -- issue 30 item 10: no SDK chatter ---------------------------------------------------------------------------


def test_launch_prints_no_ray_sdk_info_lines(
    dashboard: FakeDashboard, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    (tmp_path / ".gitignore").write_text("*.log\n")  # Ray's packaging logs each .gitignore it honours
    (tmp_path / "run.log").write_text("x\n")
    monkeypatch.chdir(tmp_path)
    s = create_scheduler("t", address=dashboard.address)
    with caplog.at_level(logging.DEBUG):
        for _ in range(2):  # the second launch finds every package on the cluster already
            s.schedule(s.submit_dryrun(_app(), {}))
    out, err = capfd.readouterr()
    noisy = [r.getMessage() for r in caplog.records if r.name.startswith("ray") and r.levelno >= logging.INFO]
    assert noisy == [] and "already exists" not in out + err and "INFO" not in out + err


# -- issue 30 item 1: no workspace ---------------------------------------------------------------------------


def test_without_a_workspace_the_launching_directory_is_the_jobs_working_dir(
    dashboard: FakeDashboard, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "train.py").write_text("print('hi')\n")
    monkeypatch.chdir(tmp_path)
    with get_runner("t") as runner:
        info = runner.dryrun(AppDef("t", [Role("t", entrypoint="python", args=["train.py"],
                                               resource=Resource(cpu=1, gpu=0, memMB=64))]),
                             "ray", cfg={"address": dashboard.address})
        assert info.request.working_dir == str(tmp_path)
        assert f"the launching directory {tmp_path}" in str(info)
        runner.schedule(info)
    job = next(iter(dashboard.jobs.values()))
    assert str(job["runtime_env"]["working_dir"]).startswith("gcs://_ray_pkg_")
    assert sum(1 for m, _, _ in dashboard.requests if m == "PUT") == 3  # the directory, tsm, the payload
    s = create_scheduler("t", address=dashboard.address)
    assert not s.submit_dryrun(_app(), {"ship_cwd": False}).request.working_dir


def test_the_home_is_never_shipped(tsm_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tsm.errors import InvalidRunOptionError

    monkeypatch.chdir(tsm_home.parent)
    with pytest.raises(InvalidRunOptionError, match="holds tsm's home"):
        create_scheduler("t").submit_dryrun(_app(), {})


# -- issue 30 item 6: a role without a resource ---------------------------------------------------------------


def test_role_without_resource_gets_the_documented_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with get_runner("t") as runner:
        info = runner.dryrun(AppDef("d", [Role("hello", entrypoint="echo", args=["hi"])]), "ray")
    assert [r.bundle for r in info.request.payload.replicas] == [{"CPU": 1.0}]
    assert "no resource given: each replica holds the default 1 CPU" in str(info)



def test_ray_token_authentication_is_sent(dashboard: FakeDashboard, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []
    real = RayClient._open

    def spy(self: RayClient, what: str, method: str, path: str, body: bytes | None = None, **kw: Any) -> Any:
        import urllib.request

        orig = urllib.request.urlopen

        def capture(req: Any, timeout: float) -> Any:
            seen.append(req.get_header("Authorization") or "")
            return orig(req, timeout=timeout)

        monkeypatch.setattr(urllib.request, "urlopen", capture)
        return real(self, what, method, path, body, **kw)

    monkeypatch.setattr(RayClient, "_open", spy)
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    monkeypatch.setenv("RAY_AUTH_TOKEN", "tok123")
    RayClient(dashboard.address).list_jobs()
    assert seen == ["Bearer tok123"]
