"""End-to-end tests of the Runner with real processes on the real local scheduler (nothing mocked).

Time limits here are hang guards only, never assertions about speed.
"""

from __future__ import annotations

import select
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import tsm
from testutil import assert_all_end, procs_with, sleep_marker
from tsm.errors import (
    ConfigError,
    InvalidAppError,
    InvalidRunOptionError,
    MalformedAppHandleError,
    SchedulerError,
    UnknownAppError,
    UnknownSchedulerError,
)
from tsm.runner.api import Runner, get_runner
from tsm.schedulers.api import Stream
from tsm.specs.api import AppDef, AppDryRunInfo, AppState, Role

HANG = 120  # seconds: a guard against a hang, never a performance claim


def sh_app(name: str, script: str, replicas: int = 1, **env: str) -> AppDef:
    return AppDef(name, roles=[Role(name, entrypoint="sh", args=["-c", script], num_replicas=replicas, env=env)])


def python_subprocess(code: str) -> subprocess.CompletedProcess[str]:
    """Run ``python -c code`` in another process (same $TSM_HOME and directory)."""
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=HANG, stdin=subprocess.DEVNULL
    )


@pytest.fixture(autouse=True)
def workdir(tsm_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A private working directory without config files; stops whatever a failed test left running."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    yield work
    with get_runner() as runner:
        for app in runner.list("local"):
            if not app.state.is_terminal:
                runner.cancel(app.app_handle)


@pytest.fixture
def runner() -> Iterator[Runner]:
    with get_runner("rtest") as r:
        yield r


# -- the object --------------------------------------------------------------------------------------------
def test_get_runner_is_a_context_manager_with_the_whole_api() -> None:
    with get_runner() as r:
        assert isinstance(r, Runner)
        assert r.session_name == "default"
        for name in ("dryrun", "dryrun_component", "run", "run_component", "schedule", "status", "wait",
                     "cancel", "describe", "log_lines", "list", "scheduler_run_opts", "scheduler_backends",
                     "close", "remove"):
            assert callable(getattr(r, name)), name
    assert tsm.get_runner is get_runner and tsm.Runner is Runner
    with pytest.raises(InvalidAppError):
        get_runner("bad session")


def test_close_is_safe_and_the_runner_stays_usable(runner: Runner) -> None:
    handle = runner.run(sh_app("one", "echo 1"))
    runner.close()
    runner.close()
    assert runner.wait(handle).state == AppState.SUCCEEDED  # reopens what it needs


def test_backends_and_run_opts(runner: Runner) -> None:
    assert "local" in runner.scheduler_backends()
    opts = runner.scheduler_run_opts("local")
    assert "grace_period" in str(opts)
    with pytest.raises(UnknownSchedulerError, match="did you mean 'local'"):
        runner.scheduler_run_opts("locall")


# -- launch ------------------------------------------------------------------------------------------------
def test_a_local_launch_writes_its_record_and_the_history_in_one_transaction(runner: Runner,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """``run()`` on the local scheduler costs the caller one store write: the app's rows and the history's."""
    from tsm.store import Store

    writes: list[list[str]] = []
    real = Store.write

    def counting(self: Store, statements: Any) -> int:
        writes.append([sql.split(" (")[0] for sql, _ in statements])
        return real(self, statements)

    monkeypatch.setattr(Store, "write", counting)
    handle = runner.run(sh_app("once", "true"), "local")
    assert writes == [["INSERT INTO local_apps", "INSERT INTO local_replicas", "INSERT OR REPLACE INTO apps"]], writes
    monkeypatch.setattr(Store, "write", real)
    assert runner.wait(handle, wait_interval=0.05).state == AppState.SUCCEEDED  # type: ignore[union-attr]
    assert [a.app_handle for a in runner.list()] == [handle]  # the history has it, as before


def test_dryrun_then_schedule_unchanged(runner: Runner) -> None:
    info = runner.dryrun(sh_app("dry", "echo from-dryrun"), "local", {"grace_period": 1.5})
    assert isinstance(info, AppDryRunInfo)
    assert info.scheduler == "local"
    assert info.cfg["grace_period"] == 1.5
    assert "echo from-dryrun" in str(info)
    assert runner.list() == []  # a dry run submits nothing
    handle = runner.schedule(info)
    assert handle.startswith("local://rtest/dry-")
    assert runner.wait(handle).state == AppState.SUCCEEDED
    assert list(runner.log_lines(handle, "dry")) == ["from-dryrun\n"]


def test_every_replica_sees_its_own_full_handle(runner: Runner) -> None:
    app = AppDef("hdl", roles=[
        Role("a", entrypoint="sh", args=["-c", 'echo "$TSM_APP_HANDLE"'], num_replicas=2),
        Role("b", entrypoint="sh", args=["-c", 'echo "$TSM_APP_HANDLE"'], num_replicas=2),
    ])
    handle = runner.run(app, "local")
    assert runner.wait(handle).state == AppState.SUCCEEDED
    for role in ("a", "b"):
        for k in range(2):
            assert list(runner.log_lines(handle, role, k)) == [handle + "\n"]
    assert "TSM_APP_HANDLE" not in app.roles[0].env  # the caller's app is not modified


def test_run_validates_the_app(runner: Runner) -> None:
    with pytest.raises(InvalidAppError, match="no roles"):
        runner.run(AppDef("empty"))
    with pytest.raises(InvalidAppError, match="app name"):
        runner.dryrun(AppDef("bad name", roles=[Role("r", entrypoint="true")]))
    with pytest.raises(InvalidAppError, match="num_replicas"):
        runner.run(AppDef("zero", roles=[Role("r", entrypoint="true", num_replicas=0)]))
    with pytest.raises(InvalidAppError, match="used twice"):
        runner.run(AppDef("dup", roles=[Role("r", entrypoint="true"), Role("r", entrypoint="true")]))
    with pytest.raises(InvalidAppError, match="entrypoint"):
        runner.run(AppDef("noexe", roles=[Role("r", entrypoint="/no/such/program")]))
    assert runner.list() == []


def test_run_options_are_checked(runner: Runner, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="tsm"):  # an undeclared key is passed on unchecked, the warning names it
        info = runner.dryrun(sh_app("x", "true"), "local", {"grace_perod": 1.0})
    assert info.cfg["grace_perod"] == 1.0 and info.cfg["grace_period"] == 10.0
    assert "unknown run option 'grace_perod' (did you mean 'grace_period'?)" in caplog.text
    with pytest.raises(InvalidRunOptionError, match="grace_period"):
        runner.dryrun(sh_app("x", "true"), "local", {"grace_period": "soon"})


def test_run_component(runner: Runner) -> None:
    handle = runner.run_component("utils.echo", ["--msg", "hi there", "--num_replicas", "2"], "local")
    assert runner.wait(handle).state == AppState.SUCCEEDED
    assert [list(runner.log_lines(handle, "echo", k)) for k in range(2)] == [["hi there\n"]] * 2
    info = runner.dryrun_component("utils.echo", [], "local")
    assert info.app is not None and info.app.roles[0].args == ["hello world"]
    with pytest.raises(tsm.ComponentNotFoundError, match="did you mean 'utils.echo'"):
        runner.dryrun_component("utils.ecko")


def test_unknown_scheduler_did_you_mean(runner: Runner) -> None:
    with pytest.raises(UnknownSchedulerError, match="did you mean 'local'"):
        runner.dryrun(sh_app("x", "true"), "loacl")
    with pytest.raises(UnknownSchedulerError, match="did you mean 'local'"):
        runner.status("loca://rtest/x-1")


# -- config files ------------------------------------------------------------------------------------------
def test_run_options_come_from_tsm_toml_in_cwd(workdir: Path) -> None:
    (workdir / "tsm.toml").write_text(
        'default_scheduler = "local"\n\n[scheduler.local]\ngrace_period = 2.5\n\n'
        '[component."utils.echo"]\nmsg = "from the file"\n'
    )
    with get_runner() as r:
        assert r.dryrun(sh_app("x", "true")).cfg["grace_period"] == 2.5
        assert r.dryrun(sh_app("x", "true"), cfg={"grace_period": 0.5}).cfg["grace_period"] == 0.5  # caller wins
        handle = r.run_component("utils.echo")
        assert r.wait(handle).state == AppState.SUCCEEDED
        assert list(r.log_lines(handle, "echo")) == ["from the file\n"]


def test_bad_option_in_tsm_toml_names_the_file(workdir: Path) -> None:
    (workdir / "tsm.toml").write_text("[scheduler.local]\ngrace_period = 'soon'\n")
    with get_runner() as r, pytest.raises(ConfigError, match="tsm.toml"):
        r.dryrun(sh_app("x", "true"))


@pytest.mark.reliability(
    "a project's config file cannot make tsm run a command through a kubeconfig",
    expect="kubeconfig set in ./tsm.toml, [tool.tsm] or ./.torchxconfig is one ConfigError naming the file; "
    "from the command line or the user's own file it is taken; the kubeconfig's exec plugin never runs",
    group="Security",
)
def test_a_project_file_cannot_name_a_kubeconfig(workdir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("TORCHXCONFIG", raising=False)
    marker = tmp_path / "ran"
    evil = workdir / "kubeconfig"
    evil.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\nclusters: [{name: k, cluster: {server: 'https://127.0.0.1:1'}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\n"
        f"users: [{{name: u, user: {{exec: {{apiVersion: client.authentication.k8s.io/v1, command: touch, args: ['{marker}']}}}}}}]\n"
    )
    app = AppDef("x", [Role("r", image="img", entrypoint="true")])
    files = {
        "tsm.toml": f"[scheduler.kubernetes]\nkubeconfig = '{evil}'\n",
        "pyproject.toml": f"[tool.tsm.scheduler.kubernetes]\nkubeconfig = '{evil}'\n",
        ".torchxconfig": f"[kubernetes]\nkubeconfig = {evil}\n",
    }
    for name, text in files.items():
        (workdir / name).write_text(text)
        with get_runner() as r, pytest.raises(ConfigError, match=f"{name}.*'kubeconfig' can make this machine run"):
            r.dryrun(app, "kubernetes")
        cli = subprocess.run([sys.executable, "-m", "tsm.cli.main", "run", "--dryrun", "-s", "kubernetes",
                              "utils.sh", "true"], capture_output=True, text=True, timeout=120)
        assert cli.returncode != 0 and cli.stderr.count("\n") == 1 and "kubeconfig" in cli.stderr, cli
        (workdir / name).unlink()
    with get_runner() as r:  # the command line and the user's own file may name one
        assert r.dryrun(app, "kubernetes", cfg={"kubeconfig": str(evil)}).cfg["kubeconfig"] == str(evil)
    (home / ".torchxconfig").write_text(f"[kubernetes]\nkubeconfig = {evil}\n")
    with get_runner() as r:
        assert r.dryrun(app, "kubernetes").cfg["kubeconfig"] == str(evil)
    assert not marker.exists()


def test_default_scheduler_from_tsm_toml_did_you_mean(workdir: Path) -> None:
    (workdir / "tsm.toml").write_text('default_scheduler = "lcal"\n')
    with get_runner() as r, pytest.raises(ConfigError, match=r"tsm.toml: default_scheduler: .*did you mean 'local'"):
        r.dryrun(sh_app("x", "true"))


# -- handles -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "handle",
    ["", "echo-1", "local://", "local://rtest", "local://rtest/", "local:/rtest/echo-1", "://rtest/echo-1",
     "local://rtest/echo-1/extra", "local://rtest/..", "local://rtest/a b", "local://../echo-1"],
)
def test_malformed_handles(runner: Runner, handle: str) -> None:
    for call in (runner.status, runner.wait, runner.cancel, runner.describe):
        with pytest.raises(MalformedAppHandleError):
            call(handle)
    with pytest.raises(MalformedAppHandleError):
        runner.log_lines(handle, "echo")


def test_unknown_app(runner: Runner) -> None:
    handle = "local://rtest/echo-0000dead"
    # TorchX's contract: status/wait/describe of an app the scheduler does not know are None; cancel does nothing
    assert runner.status(handle) is None
    assert runner.wait(handle) is None
    assert runner.describe(handle) is None
    assert runner.cancel(handle) is None  # type: ignore[func-returns-value]
    with pytest.raises(UnknownAppError):
        runner.log_lines(handle, "echo")
    with pytest.raises(UnknownAppError):
        runner.remove([handle])


# -- watching and stopping ---------------------------------------------------------------------------------
def test_status_wait_cancel_describe_remove(runner: Runner) -> None:
    marker = sleep_marker()
    app = sh_app("life", f"echo started; sleep {marker}", replicas=2)
    handle = runner.run(app, "local", {"grace_period": 5.0})
    for k in range(2):
        assert next(iter(runner.log_lines(handle, "life", k, should_tail=True))) == "started\n"

    status = runner.status(handle)
    assert status.state == AppState.RUNNING
    assert [(r.role, r.id, r.state) for rs in status.roles for r in rs.replicas] == [
        ("life", 0, AppState.RUNNING), ("life", 1, AppState.RUNNING)
    ]
    assert runner.wait(handle, timeout=0.1).state == AppState.RUNNING  # timed out: still running

    described = runner.describe(handle)
    assert described.name == "life" and described.roles[0].num_replicas == 2
    assert described.roles[0].args == app.roles[0].args

    with pytest.raises(SchedulerError, match="cancel it first"):
        runner.remove([handle])

    runner.cancel(handle)
    assert_all_end(marker)  # nothing of the app outlives cancel()
    runner.cancel(handle)  # idempotent
    status = runner.wait(handle)
    assert status.state == AppState.CANCELLED
    assert all(r.state == AppState.CANCELLED for rs in status.roles for r in rs.replicas)
    with pytest.warns(PendingDeprecationWarning, match="cancel"):
        runner.stop(handle)  # the seed API's and TorchX's deprecated name

    assert runner.remove([handle]) == [handle]
    assert runner.status(handle) is None
    assert runner.describe(handle) is None
    assert handle not in [a.app_handle for a in runner.list()]


def test_failed_app_status(runner: Runner) -> None:
    handle = runner.run(AppDef("fail", roles=[
        Role("ok", entrypoint="sh", args=["-c", "sleep 30"]),
        Role("bad", entrypoint="sh", args=["-c", "echo oops >&2; exit 7"]),
    ]), "local", {"grace_period": 5.0})
    status = runner.wait(handle)
    assert status.state == AppState.FAILED
    assert "bad/0" in status.msg
    bad = next(r for rs in status.roles for r in rs.replicas if r.role == "bad")
    assert bad.exit_code == 7
    assert list(runner.log_lines(handle, "bad", streams=Stream.STDERR)) == ["oops\n"]


def test_log_lines_filters(runner: Runner) -> None:
    script = 'echo "out1 $TSM_REPLICA_ID"; echo "err1" >&2; echo "out2 $TSM_REPLICA_ID"; printf "last"'
    handle = runner.run(sh_app("logs", script, replicas=2), "local")
    assert runner.wait(handle).state == AppState.SUCCEEDED
    assert list(runner.log_lines(handle, "logs", 1, streams=Stream.STDOUT)) == ["out1 1\n", "out2 1\n", "last"]
    assert list(runner.log_lines(handle, "logs", 1, streams=Stream.STDERR)) == ["err1\n"]
    assert sorted(runner.log_lines(handle, "logs", 0)) == sorted(["out1 0\n", "err1\n", "out2 0\n", "last"])
    assert list(runner.log_lines(handle, "logs", 0, regex=r"^out\d")) == ["out1 0\n", "out2 0\n"]
    hour = timedelta(hours=1)
    assert len(list(runner.log_lines(handle, "logs", 0, since=datetime.now() - hour))) == 4
    assert list(runner.log_lines(handle, "logs", 0, until=datetime.now() - hour)) == []
    assert list(runner.log_lines(handle, "logs", 0, since=datetime.now() + hour)) == []
    assert len(list(runner.log_lines(handle, "logs", 0, should_tail=True))) == 4  # ended: tail returns
    with pytest.raises(UnknownAppError, match="no role"):
        list(runner.log_lines(handle, "nope"))
    with pytest.raises(UnknownAppError):
        list(runner.log_lines(handle, "logs", 2))


def test_tail_follows_a_running_replica(runner: Runner) -> None:
    handle = runner.run(sh_app("tail", "for i in 1 2 3; do echo line $i; sleep 0.3; done"), "local")
    lines = list(runner.log_lines(handle, "tail", should_tail=True))
    assert lines == ["line 1\n", "line 2\n", "line 3\n"]
    assert runner.status(handle).state == AppState.SUCCEEDED


def test_list_shows_apps_with_live_state(runner: Runner) -> None:
    marker = sleep_marker()
    done = runner.run(sh_app("quick", "true"), "local")
    running = runner.run(sh_app("slow", f"echo started; sleep {marker}"), "local", {"grace_period": 5.0})
    assert runner.wait(done).state == AppState.SUCCEEDED
    next(iter(runner.log_lines(running, "slow", should_tail=True)))

    with get_runner("other") as other:  # a different session, a different runner: the same history
        rows = {a.app_handle: a for a in other.list()}
        assert rows[running].state == AppState.RUNNING  # live, not the SUBMITTED recorded at launch
        assert rows[done].state == AppState.SUCCEEDED
        assert rows[running].name == "slow" and rows[running].app_id == running.rsplit("/", 1)[1]
        assert [a.app_handle for a in other.list()][:2] == [running, done]  # newest first
        assert {a.app_handle for a in other.list("local")} >= {running, done}

    runner.cancel(running)
    assert {a.app_handle: a.state for a in runner.list()}[running] == AppState.CANCELLED


def test_list_across_schedulers_includes_the_local_alias(runner: Runner) -> None:
    a = runner.run(sh_app("viaalias", "true"), "local_cwd")
    b = runner.run(sh_app("vialocal", "true"), "local")
    for h in (a, b):
        assert runner.wait(h).state == AppState.SUCCEEDED
    handles = [x.app_handle for x in runner.list()]
    assert a in handles and b in handles


def test_concurrent_runners_in_threads() -> None:
    """Several threads, each with its own runner, launch and wait at once."""
    results: list[AppState] = []

    def one(i: int) -> None:
        with get_runner(f"t{i}") as r:
            results.append(r.wait(r.run(sh_app("par", f"echo {i}"), "local")).state)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(HANG)
    assert results == [AppState.SUCCEEDED] * 4


# -- across processes --------------------------------------------------------------------------------------
def test_app_launched_by_one_process_is_watched_and_stopped_by_others(workdir: Path) -> None:
    marker = sleep_marker()
    launched = python_subprocess(
        "import tsm\n"
        "app = tsm.AppDef('xproc', roles=[tsm.Role('w', entrypoint='sh', num_replicas=2,\n"
        f"    args=['-c', 'echo \"hello $TSM_REPLICA_ID\"; sleep {marker}'])])\n"
        "with tsm.get_runner('launcher') as r:\n"
        "    print(r.run(app, 'local', {'grace_period': 5.0}))\n"
    )
    assert launched.returncode == 0, launched.stderr
    handle = launched.stdout.strip()
    assert handle.startswith("local://launcher/xproc-")

    with get_runner() as runner:  # this process: query and tail
        for k in range(2):
            assert next(iter(runner.log_lines(handle, "w", k, should_tail=True))) == f"hello {k}\n"
        assert runner.status(handle).state == AppState.RUNNING
        assert runner.describe(handle).name == "xproc"
        assert handle in [a.app_handle for a in runner.list()]

        tail: list[str] = []
        tailer = threading.Thread(target=lambda: tail.extend(runner_tail(handle)), daemon=True)
        tailer.start()

        waiter = subprocess.Popen(  # a third process waits for the end
            [sys.executable, "-c", f"import tsm\nwith tsm.get_runner() as r:\n    print(r.wait({handle!r}).state.name)\n"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        cancelled = python_subprocess(f"import tsm\nwith tsm.get_runner() as r:\n    r.cancel({handle!r})\n")
        assert cancelled.returncode == 0, cancelled.stderr

        out, err = waiter.communicate(timeout=HANG)
        assert waiter.returncode == 0, err
        assert out.strip() == "CANCELLED"
        tailer.join(HANG)
        assert not tailer.is_alive()  # the tail ended with the app
        assert tail == ["hello 0\n"]
        assert runner.status(handle).state == AppState.CANCELLED
        assert_all_end(marker)


def runner_tail(handle: str) -> list[str]:
    """Follow replica w/0 of ``handle`` to its end, in a runner of this thread's own."""
    with get_runner() as r:
        return list(r.log_lines(handle, "w", 0, should_tail=True))


# -- a cancel must never be lost, even while the supervisor is busy notifying clients ---------------------
def test_cancel_is_never_lost_on_a_chatty_app(runner: Runner) -> None:
    chatter = "import time\nwhile True:\n    print('chatter', flush=True)\n    time.sleep(0.001)\n"
    app = AppDef("chatty", roles=[Role("chatty", entrypoint=sys.executable, args=["-c", chatter], num_replicas=4)])
    for i in range(16):
        handle = runner.run(app, "local", {"grace_period": 2.0})
        next(iter(runner.log_lines(handle, "chatty", should_tail=True)))
        done = threading.Event()

        def cancel(h: str = handle, done: threading.Event = done) -> None:
            with get_runner() as r:
                r.cancel(h)
            done.set()

        threading.Thread(target=cancel, daemon=True).start()
        if not done.wait(20):  # a hang guard: a working cancel of this app takes a moment
            _raw_cancel(handle)  # send it again so the stuck thread and the app end
            pytest.fail(f"cancel #{i} of {handle} never returned: the supervisor never acted on it")
        assert runner.status(handle).state == AppState.CANCELLED


def test_no_replica_process_is_left_when_cancel_returns(runner: Runner) -> None:
    for _ in range(10):
        marker = sleep_marker()
        handle = runner.run(sh_app("gone", f"echo started; sleep {marker}", replicas=2), "local", {"grace_period": 5.0})
        for k in range(2):
            next(iter(runner.log_lines(handle, "gone", k, should_tail=True)))
        runner.cancel(handle)
        left = procs_with(marker)
        assert_all_end(marker)  # they do end: only the order is wrong
        assert not left, f"processes of {handle} still alive when cancel() returned: {left}"


@pytest.mark.parametrize("unbuffered", ["", None])
def test_lines_of_processes_sharing_stdout_stay_whole(runner: Runner, unbuffered: str | None) -> None:
    """Two processes printing to one replica's stdout keep their lines whole when each line is one write.

    Replicas get ``PYTHONUNBUFFERED=1`` by default so output is live; with it ``print()`` makes two writes
    (the text, then the newline) and writers sharing a stdout can tear each other's lines. A role that sets
    ``PYTHONUNBUFFERED`` itself keeps its value (here ``""``: off), and ``print(..., flush=True)`` is then
    one write. (torchrun's workers get whole lines from ``dist.ddp`` itself: tests/components/test_dist.py.)
    The ``None`` case writes each line with one ``os.write`` under the default and must stay whole too.
    """
    if unbuffered is None:
        body = "    os.write(1, (tag * 40 + '\\n').encode())\n"
        env: dict[str, str] = {}
    else:
        body = "    print(tag * 40, flush=True)\n"
        env = {"PYTHONUNBUFFERED": unbuffered}
    two_writers = (
        "import os, sys\n"
        "tag = 'a' if os.fork() else 'b'\n"
        "for _ in range(20000):\n" + body + "if tag == 'a':\n"
        "    os.wait()\n"
    )
    role = Role("torn", entrypoint=sys.executable, args=["-c", two_writers], env=env)
    handle = runner.run(AppDef("torn", roles=[role]))
    assert runner.wait(handle).state == AppState.SUCCEEDED
    lines = list(runner.log_lines(handle, "torn", streams=Stream.STDOUT))
    assert len(lines) == 40000
    torn = [ln for ln in lines if ln not in ("a" * 40 + "\n", "b" * 40 + "\n")]
    assert not torn, f"{len(torn)} torn lines, e.g. {torn[:2]}"


def _raw_cancel(handle: str) -> None:
    """Ask the local supervisor of ``handle`` to cancel, keeping the connection open until it answers."""
    import socket

    from tsm.store import tsm_home

    path = str(tsm_home() / "local" / handle.rsplit("/", 1)[1] / "sock")
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(path)
        s.sendall(b"cancel\n")
        select.select([s], [], [], HANG)
