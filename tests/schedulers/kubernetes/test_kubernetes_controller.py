"""The Kubernetes scheduler on the fake cluster (``fake_kube.py``): controller, security and hang cases in seconds.

The same cases run on the real cluster in ``tests/integration/test_kubernetes.py`` (the final proof).
"""

from __future__ import annotations

import os
import socket
import stat
import sys
import threading
import time
from pathlib import Path

import pytest

from schedulers.kubernetes.fake_kube import FakeCluster
from tsm.errors import InvalidAppError, SchedulerError
from tsm.schedulers.kubernetes.dryrun import (
    format_request,
)
from tsm.schedulers.kubernetes.request import (
    KubernetesOptions,
    build_request,
    port_name,
    secret_key,
    validate,
)
from tsm.schedulers.kubernetes.scheduler import KubernetesScheduler
from tsm.specs.api import AppDef, AppState, Role

SECURITY, HOSTILE, FAULTS = "Security", "Hostile input", "Faults"
PY = sys.executable
HANG = 60.0


def role(name: str, code: str, image: str = "fake/python", **kw: object) -> Role:
    return Role(name, image=image, entrypoint=PY, args=["-c", code], **kw)  # type: ignore[arg-type]


def sched_on(cluster: FakeCluster, as_owner: str | None = None) -> KubernetesScheduler:
    return KubernetesScheduler("t", client=cluster.client(as_owner))


CFG = {"dns": "yes"}


def test_every_call_is_bounded_in_time(cluster: FakeCluster) -> None:
    s = sched_on(cluster)
    app_id = s.submit(AppDef("t", [role("r", "print('hi')")]), CFG)
    assert s.wait(app_id, timeout=HANG).state == AppState.SUCCEEDED  # type: ignore[union-attr]
    assert "".join(s.log_iter(app_id, "r", 0)) == "hi\n"
    s.cleanup()
    assert cluster.calls and all("_request_timeout" in kw for _, kw in cluster.calls), [
        n for n, kw in cluster.calls if "_request_timeout" not in kw]


class SilentServer:
    """A TCP server on loopback that accepts every connection and never answers (a hung API server)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)

    def close(self) -> None:
        self.sock.close()
        for c in self.conns:
            c.close()


@pytest.mark.reliability(
    "a Kubernetes API server that accepts and never answers",
    expect="status and cancel fail with 'did not answer within' one line, within the request timeout; no hang",
    group=FAULTS,
)
def test_a_silent_api_server_gives_a_clear_error_within_the_timeout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                    figure) -> None:  # type: ignore[no-untyped-def]
    import tsm.schedulers.kubernetes.client as client_mod
    from tsm.runner.api import Runner

    monkeypatch.setattr(client_mod, "REQUEST_TIMEOUT", 1.5, raising=False)
    server = SilentServer()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters: [{{name: k, cluster: {{server: 'http://127.0.0.1:{server.port}'}}}}]\n"
        "users: [{name: u, user: {token: t}}]\ncontexts: [{name: c, context: {cluster: k, user: u}}]\n")
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    results: dict[str, object] = {}

    def attempt(name: str, fn: object) -> None:
        start = time.monotonic()
        try:
            fn()  # type: ignore[operator]
            results[name] = "no error"
        except SchedulerError as e:
            results[name] = str(e)
        results[name + " s"] = time.monotonic() - start

    runner = Runner("t", scheduler_factories={"kubernetes": lambda *a, **k: KubernetesScheduler("t")})
    work = [threading.Thread(target=attempt, args=("status", lambda: runner.status("kubernetes://t/app-00000000"))),
            threading.Thread(target=attempt, args=("cancel", lambda: runner.cancel("kubernetes://t/app-00000000")))]
    for t in work:
        t.daemon = True
        t.start()
    for t in work:
        t.join(timeout=30)  # a generous guard: the old client waited for ever
    server.close()
    assert all(not t.is_alive() for t in work), "status or cancel hung on a silent API server"
    for name in ("status", "cancel"):
        assert "did not answer within 1.5s" in str(results[name]), results
        figure(f"{name} failed after", results[name + " s"], "s", limit=10.0)


@pytest.mark.reliability(
    "Kubernetes keeps an app's files private even in a world-readable $TSM_HOME",
    expect="with $TSM_HOME 0755 and umask 022: request, record, attempts, final status and log snapshots 0600, folders 0700",
    group=SECURITY,
)
def test_every_file_is_private_whatever_tsm_homes_mode(cluster: FakeCluster, tsm_home: Path, figure) -> None:  # type: ignore[no-untyped-def]
    tsm_home.chmod(0o755)
    old = os.umask(0o022)
    try:
        s = sched_on(cluster)
        app_id = s.submit(AppDef("secret", [role("r", "print('out')", env={"TOKEN": "hunter2"})]), CFG)
        assert s.wait(app_id, timeout=HANG).state == AppState.SUCCEEDED  # type: ignore[union-attr]
    finally:
        os.umask(old)
    root = tsm_home / "kubernetes"
    names = {p.name for p in root.rglob("*") if p.is_file()}
    assert {"request.json", "app.json", "final.json", "service-uid"} <= names and any(n.endswith(".log") for n in names)
    loose = [f"{p} {oct(stat.S_IMODE(p.stat().st_mode))}" for p in root.rglob("*")
             if stat.S_IMODE(p.stat().st_mode) != (0o700 if p.is_dir() else 0o600)]
    assert loose == [] and stat.S_IMODE(root.stat().st_mode) == 0o700
    figure("paths checked", len(list(root.rglob("*"))), "")


YAML11 = ["True", "NO", "On", "Null", "Yes", "off", "y", "~", "0x1F", "1_000", "1e3", "12:30", ".inf", ""]


@pytest.mark.reliability(
    "Kubernetes dry-run YAML reads back exactly under YAML 1.1",
    expect="env values True/NO/On/Null/Yes/~/0x1F stay strings for a YAML 1.1 reader; port_map keys 8080, a--b, x- become valid port names",
    group=HOSTILE,
)
def test_dry_run_yaml_is_exact_for_a_yaml_11_reader_and_port_names_are_valid(figure) -> None:  # type: ignore[no-untyped-def]
    import re

    yaml = pytest.importorskip("yaml")  # PyYAML reads YAML 1.1, as kubectl does
    env = {f"V{i}": v for i, v in enumerate(YAML11)}
    ports = {"8080": 8080, "a--b": 81, "x-": 82, "Metrics_Port": 83, "_": 84}
    app = AppDef("y", [Role("r", "img", "python", ["-c", "pass", *YAML11], env=env, port_map=ports,
                            resource=__import__("tsm").Resource(cpu=1, memMB=64, capabilities={"yes": "on"}))])
    validate(app)
    req = build_request(app, KubernetesOptions(), "s", "/tmp", 1.0, "me")
    docs = [d for d in yaml.safe_load_all(format_request(req)) if d]
    assert docs == [req.service, req.secret, *req.jobs]
    assert req.secret["stringData"] and set(req.secret["stringData"].values()) >= set(YAML11)
    names = [p["name"] for p in req.jobs[0]["spec"]["template"]["spec"]["containers"][0]["ports"]]
    assert all(re.fullmatch(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?", n) and "--" not in n and len(n) <= 15
               and re.search("[a-z]", n) for n in names), names
    assert port_name("8080") == "p8080" and port_name("a--b") == "a-b" and port_name("x-") == "x"
    with pytest.raises(InvalidAppError, match="port name"):
        validate(AppDef("c", [Role("r", "img", "sh", port_map={"a_b": 1, "a-b": 2})]))
    figure("values and keys read back", len(YAML11) + len(ports), "")


@pytest.mark.reliability(
    "Kubernetes env values live in a Secret per app, deleted with it",
    expect="no Job holds a role's env value; the app's Secret holds them and is gone once the app ended",
    group=SECURITY,
)
def test_env_values_are_in_a_secret_not_in_the_job(cluster: FakeCluster, figure) -> None:  # type: ignore[no-untyped-def]
    s = sched_on(cluster)
    code = "import os; print(os.environ['TOKEN'], os.environ['PLAIN'])"
    app_id = s.submit(AppDef("sec", [role("r", code, env={"TOKEN": "hunter2 $(HOME)", "PLAIN": "yes"})]), CFG)
    jobs = [j for j in cluster.jobs.values() if j["metadata"]["labels"]["tsm/app-id"] == app_id]
    assert jobs and "hunter2" not in str(jobs)
    assert [s_["stringData"] for s_ in cluster.secrets.values()][0].get(secret_key("hunter2 $(HOME)")) == "hunter2 $(HOME)"
    assert s.wait(app_id, timeout=HANG).state == AppState.SUCCEEDED  # type: ignore[union-attr]
    assert "".join(s.log_iter(app_id, "r", 0)) == "hunter2 $(HOME) yes\n"
    assert app_id not in cluster.secrets and app_id not in cluster.services
    figure("Secrets left after the app", len(cluster.secrets), "", limit=0)


@pytest.mark.reliability(
    "Kubernetes list, cancel and cleanup touch only the caller's apps",
    expect="another user's list shows none of them; their cleanup(include_running) and cancel leave them running",
    group=SECURITY,
)
def test_another_owner_neither_sees_nor_deletes_the_app(cluster: FakeCluster, tmp_path: Path, tsm_home: Path,
                                                        monkeypatch: pytest.MonkeyPatch, figure) -> None:  # type: ignore[no-untyped-def]
    mine = sched_on(cluster)
    app_id = mine.submit(AppDef("mine", [role("r", "import time; time.sleep(60)")]), CFG)
    monkeypatch.setenv("TSM_HOME", str(tmp_path / "mallory"))  # another user: their own home
    mallory = sched_on(cluster, as_owner="mallory")
    assert mallory.describe(app_id) is None and app_id not in [r.app_id for r in mallory.list()]
    mallory.cancel(app_id)
    assert mallory.cleanup(include_running=True) == []
    monkeypatch.setenv("TSM_HOME", str(tsm_home))
    assert mine.describe(app_id).state in (AppState.PENDING, AppState.RUNNING)  # type: ignore[union-attr]
    objs = [*cluster.services.values(), *cluster.secrets.values(), *cluster.jobs.values()]
    assert all(o["metadata"]["labels"]["tsm/owner"] == mine.client.owner for o in objs)
    figure("objects of the app", len(objs), "")
    mine.cancel(app_id)


def test_the_gang_timeout_fails_an_app_that_cannot_be_scheduled_and_deletes_it(cluster: FakeCluster) -> None:
    cluster.unschedulable.add("fake/huge")
    s = sched_on(cluster)
    app = AppDef("gang", [role("a", "import time; time.sleep(60)"), role("b", "pass", image="fake/huge")])
    app_id = s.submit(app, {**CFG, "gang_timeout": 1.0})
    desc = s.wait(app_id, timeout=HANG)
    assert desc is not None and desc.state == AppState.FAILED
    assert "gang_timeout=1s" in desc.msg and "Unschedulable" in desc.msg
    assert not cluster.jobs and not cluster.services and not cluster.secrets


def test_an_image_no_registry_has_fails_the_app_at_once_not_after_the_gang_timeout(cluster: FakeCluster) -> None:
    cluster.bad_images.add("fake/mistyped")
    s = sched_on(cluster)
    app = AppDef("typo", [role("a", "import time; time.sleep(60)"), role("b", "pass", image="fake/mistyped")])
    app_id = s.submit(app, {**CFG, "gang_timeout": 3600.0})
    desc = s.wait(app_id, timeout=HANG)
    assert desc is not None and desc.state == AppState.FAILED
    assert "a replica cannot start: role 'b' replica 0: ErrImagePull: pull access denied for fake/mistyped" in desc.msg
    assert "gang_timeout" not in desc.msg
    assert not cluster.jobs and not cluster.services and not cluster.secrets


def test_the_status_of_an_ended_app_comes_from_the_store_without_asking_the_cluster(cluster: FakeCluster) -> None:
    s = sched_on(cluster)
    app_id = s.submit(AppDef("done", [role("a", "print('ok')")]), CFG)
    ended = s.wait(app_id, timeout=HANG)
    assert ended is not None and ended.state == AppState.SUCCEEDED
    assert s.final_status(app_id) is not None  # its objects went, its end was kept
    cluster.calls.clear()
    later = sched_on(cluster)  # a later `tsm status`: a new process, no watcher yet
    desc = later.describe(app_id)
    assert desc is not None and (desc.state, desc.msg) == (ended.state, ended.msg)
    assert [r.state for r in desc.roles_statuses[0].replicas] == [AppState.SUCCEEDED]
    assert cluster.calls == [], cluster.calls


def test_an_app_of_another_home_is_reported_never_acted_on(cluster: FakeCluster, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch, tsm_home: Path) -> None:
    """describe() of an app this home did not submit acts on nothing (no retry, no deletion)."""
    mine = sched_on(cluster)
    app_id = mine.submit(AppDef("done", [role("r", "pass")]), CFG)
    monkeypatch.setenv("TSM_HOME", str(tmp_path / "other"))
    other = sched_on(cluster)
    deadline = time.monotonic() + HANG
    while (d := other.describe(app_id)) is None or d.state != AppState.SUCCEEDED:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert cluster.jobs and app_id in cluster.services  # still there: only the submitter deletes it
    monkeypatch.setenv("TSM_HOME", str(tsm_home))
    assert mine.wait(app_id, timeout=HANG).state == AppState.SUCCEEDED  # type: ignore[union-attr]
    assert not cluster.jobs


def test_following_a_cancelled_replica_shows_no_runtime_error(cluster: FakeCluster) -> None:
    """Issue 30 item 10: Ctrl-C (a cancel) while following adds no ``rpc error: ... No such container``."""
    s = sched_on(cluster)
    app_id = s.submit(AppDef("follow", [role("r", "import time\nprint('up', flush=True)\ntime.sleep(60)")]), CFG)
    lines: list[str] = []
    follower = threading.Thread(target=lambda: lines.extend(s.log_iter(app_id, "r", 0, should_tail=True)), daemon=True)
    follower.start()
    deadline = time.monotonic() + HANG
    while lines != ["up\n"]:
        assert time.monotonic() < deadline, lines
        time.sleep(0.05)
    s.cancel(app_id)
    follower.join(timeout=HANG)
    assert not follower.is_alive() and lines == ["up\n"], lines


def test_a_finished_app_reports_when_it_started_and_ended(cluster: FakeCluster) -> None:
    """Issue 30 item 4: a fixed DURATION for an ended app (its pods are deleted: the final status keeps the times)."""
    s = sched_on(cluster)
    app_id = s.submit(AppDef("timed", [role("r", "import time; time.sleep(1.2)")]), CFG)
    assert s.wait(app_id, timeout=HANG).state == AppState.SUCCEEDED  # type: ignore[union-attr]
    (view,) = s.view_snapshot([app_id])
    assert view.started is not None and view.ended is not None and view.ended >= view.started
