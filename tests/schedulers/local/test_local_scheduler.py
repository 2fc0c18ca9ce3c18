"""The local scheduler against real processes: lifecycle, env, retries, cancel, ownership, logs."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from testutil import py, wait_until
from tsm.errors import (
    InvalidAppError,
    InvalidRunOptionError,
    SchedulerError,
    SubmissionError,
    UnknownAppError,
)
from tsm.schedulers.api import Stream
from tsm.schedulers.local import _os
from tsm.schedulers.local.scheduler import LocalScheduler, assign_gpus
from tsm.specs import AppDef, AppState, Resource, RetryPolicy, Role

PY = sys.executable
HANG_GUARD = 60.0




def run(sched: LocalScheduler, app: AppDef, **cfg: object) -> str:
    return sched.submit(app, cfg)  # type: ignore[arg-type]


def wait(sched: LocalScheduler, app_id: str):  # type: ignore[no-untyped-def]
    desc = sched.wait(app_id, timeout=HANG_GUARD)
    assert desc is not None
    assert desc.state.is_terminal, f"app did not end: {desc}"
    return desc


def replica(desc, role: str, k: int):  # type: ignore[no-untyped-def]
    return next(r for rs in desc.roles_statuses if rs.role == role for r in rs.replicas if r.id == k)


def pid_gone(pid: int) -> bool:
    return _os.start_time(pid) is None


# -- lifecycle and env ---------------------------------------------------------------------------
def test_multi_role_app_succeeds_with_env_and_macros(sched: LocalScheduler, tmp_path: Path) -> None:
    code = """
        import json, os, sys
        keys = ["TSM_APP_ID", "TSM_ROLE_NAME", "TSM_REPLICA_ID", "TSM_NUM_REPLICAS", "TSM_RANK0_HOST",
                "PYTHONUNBUFFERED", "MY_VAR", "TSM_PORT_HTTP"]
        print(json.dumps({"env": {k: os.environ.get(k) for k in keys}, "argv": sys.argv[1:], "cwd": os.getcwd()}))
    """
    trainer = py(code, "trainer", num_replicas=2, env={"MY_VAR": "${app_id}/${replica_id}"}, port_map={"http": 0})
    trainer.args += ["${replica_id}", "${img_root}", "$${rank0_env}"]
    trainer.image = str(tmp_path)
    ps = py(code, "ps")
    app_id = run(sched, AppDef("multi", [trainer, ps]))
    desc = wait(sched, app_id)
    assert desc.state == AppState.SUCCEEDED, desc
    assert desc.app is not None and [r.name for r in desc.app.roles] == ["trainer", "ps"]
    for k in (0, 1):
        out = json.loads("".join(sched.log_iter(app_id, "trainer", k, streams=Stream.STDOUT)))
        env = out["env"]
        assert env["TSM_APP_ID"] == app_id
        assert env["TSM_ROLE_NAME"] == "trainer"
        assert env["TSM_REPLICA_ID"] == str(k)
        assert env["TSM_NUM_REPLICAS"] == "2"
        assert env["TSM_RANK0_HOST"] == "localhost"
        assert env["PYTHONUNBUFFERED"] == "1"
        assert env["MY_VAR"] == f"{app_id}/{k}"
        assert int(env["TSM_PORT_HTTP"]) > 0
        assert out["argv"] == [str(k), str(tmp_path), "$TSM_RANK0_HOST"]
        assert out["cwd"] == str(tmp_path)
    assert json.loads("".join(sched.log_iter(app_id, "ps", 0)))["env"]["TSM_NUM_REPLICAS"] == "1"


def test_failing_replica_fails_the_app_and_stops_the_others(sched: LocalScheduler) -> None:
    app_id = run(sched, AppDef("fail", [py("import sys; sys.exit(3)", "bad"), Role("slow", entrypoint="sleep", args=["300"])]))
    desc = wait(sched, app_id)
    assert desc.state == AppState.FAILED
    assert "bad/0" in desc.msg and "code 3" in desc.msg
    bad = replica(desc, "bad", 0)
    assert bad.exit_code == 3 and bad.state == AppState.FAILED
    slow = replica(desc, "slow", 0)
    assert slow.state.is_terminal
    assert slow.pid is not None and pid_gone(slow.pid)


def test_entrypoint_that_cannot_start_is_refused_at_dryrun(sched: LocalScheduler) -> None:
    with pytest.raises(InvalidAppError, match="no-such-program-xyz"):
        sched.submit_dryrun(AppDef("x", [Role("r", entrypoint="no-such-program-xyz")]))


def test_image_must_be_a_directory(sched: LocalScheduler) -> None:
    with pytest.raises(InvalidAppError, match="not a directory"):
        sched.submit_dryrun(AppDef("x", [Role("r", image="/no/such/dir", entrypoint="true")]))


def test_dryrun_is_printable_and_schedules_unchanged(sched: LocalScheduler) -> None:
    info = sched.submit_dryrun(AppDef("dr", [Role("r", entrypoint="echo", args=["a b", "$(x)"])]))
    text = str(info)
    assert "r/0:" in text and "'a b'" in text and "'$(x)'" in text
    assert info.scheduler == "local" and info.app is not None and info.cfg["grace_period"] == 10.0
    app_id = sched.schedule(info)
    assert app_id == info.request.app_id
    wait(sched, app_id)
    assert list(sched.log_iter(app_id, "r", 0)) == ["a b $(x)\n"]


# -- retries -------------------------------------------------------------------------------------
FLAKY = """
    import os, sys
    marker = os.path.join(sys.argv[1], os.environ["TSM_ROLE_NAME"] + os.environ["TSM_REPLICA_ID"])
    should_fail = os.environ["TSM_ROLE_NAME"] == "flaky" and os.environ["TSM_REPLICA_ID"] == "1"
    first = not os.path.exists(marker)
    open(marker, "a").write("x")
    print("run", os.environ["TSM_REPLICA_ID"])
    sys.exit(7 if should_fail and first else 0)
"""


def _runs(tmp_path: Path, name: str) -> int:
    p = tmp_path / name
    return len(p.read_text()) if p.exists() else 0


@pytest.mark.parametrize(
    "policy, expected",
    [
        (RetryPolicy.REPLICA, {("flaky", 0): 0, ("flaky", 1): 1, ("other", 0): 0}),
        (RetryPolicy.ROLE, {("flaky", 0): 1, ("flaky", 1): 1, ("other", 0): 0}),
        (RetryPolicy.APPLICATION, {("flaky", 0): 1, ("flaky", 1): 1, ("other", 0): 1}),
    ],
)
def test_retry_policies(
    sched: LocalScheduler, tmp_path: Path, policy: RetryPolicy, expected: dict[tuple[str, int], int]
) -> None:
    flaky = py(FLAKY, "flaky", num_replicas=2, max_retries=1, retry_policy=policy)
    flaky.args.append(str(tmp_path))
    # "other" waits for flaky/1's first run so a restart of everything happens while it is alive
    other = py(textwrap.dedent(FLAKY).replace("sys.exit(", "__import__('time').sleep(0.5); sys.exit("), "other")
    other.args.append(str(tmp_path))
    app_id = run(sched, AppDef("retry", [flaky, other]), grace_period=5.0)
    desc = wait(sched, app_id)
    assert desc.state == AppState.SUCCEEDED, desc
    assert desc.num_restarts == 1
    assert {key: replica(desc, *key).restarts for key in expected} == expected
    assert _runs(tmp_path, "flaky1") == 2
    if policy == RetryPolicy.REPLICA:
        assert _runs(tmp_path, "flaky0") == 1 and _runs(tmp_path, "other0") == 1
    # the log of a restarted replica keeps both runs
    assert list(sched.log_iter(app_id, "flaky", 1, streams=Stream.STDOUT)) == ["run 1\n", "run 1\n"]


def test_retries_run_out(sched: LocalScheduler) -> None:
    app_id = run(sched, AppDef("out", [py("import sys; print('try'); sys.exit(2)", max_retries=2, retry_policy=RetryPolicy.REPLICA)]))
    desc = wait(sched, app_id)
    assert desc.state == AppState.FAILED
    assert desc.num_restarts == 2
    assert replica(desc, "r", 0).restarts == 2
    assert "after 2 restart(s)" in desc.msg
    assert list(sched.log_iter(app_id, "r", 0)) == ["try\n"] * 3


# -- cancel and ownership ------------------------------------------------------------------------
def test_wait_with_timeout_returns_current_status(sched: LocalScheduler) -> None:
    app_id = run(sched, AppDef("slow", [Role("r", entrypoint="sleep", args=["300"])]), grace_period=0.0)
    desc = sched.wait(app_id, timeout=0.1)
    assert desc is not None and desc.state == AppState.RUNNING
    sched.cancel(app_id)


def test_unknown_app(sched: LocalScheduler) -> None:
    assert sched.describe("nope-123") is None
    assert sched.wait("nope-123") is None
    assert not sched.exists("nope-123")
    sched.cancel("nope-123")  # nothing to stop: a no-op, as TorchX's cancel (the runner reports "unknown")
    assert sched.describe("nope-123") is None
    with pytest.raises(UnknownAppError):
        list(sched.log_iter("nope-123", "r"))


def test_list_and_remove(sched: LocalScheduler) -> None:
    done = run(sched, AppDef("done", [Role("r", entrypoint="true")]))
    live = run(sched, AppDef("live", [Role("r", entrypoint="sleep", args=["300"])]), grace_period=0.0)
    wait(sched, done)
    apps = {a.app_id: a for a in sched.list()}
    assert apps[done].state == AppState.SUCCEEDED
    assert apps[live].state == AppState.RUNNING
    assert apps[live].app_handle == f"local://test/{live}"
    with pytest.raises(SchedulerError, match="cancel it first"):
        sched.remove(live)
    log_dir = sched.store.query("SELECT log_dir FROM local_apps WHERE app_id=?", (done,))[0]["log_dir"]
    assert os.path.isdir(log_dir)
    assert sched.remove(done)
    assert not os.path.exists(log_dir)
    assert sched.describe(done) is None
    sched.cancel(live)


def test_log_dir_run_option(sched: LocalScheduler, tmp_path: Path) -> None:
    app_id = run(sched, AppDef("ld", [Role("r", entrypoint="echo", args=["here"])]), log_dir=str(tmp_path))
    wait(sched, app_id)
    assert (tmp_path / app_id / "r" / "0" / "stdout").read_text() == "here\n"


def test_unwritable_log_dir_is_a_clear_error_that_leaves_nothing(sched: LocalScheduler, tsm_home: Path) -> None:
    app = AppDef("nolog", [Role("r", entrypoint="echo", args=["x"])])
    with pytest.raises(SubmissionError, match=r"cannot write the files of app nolog-\w+ at /proc/tsm-nope.*log_dir="):
        run(sched, app, log_dir="/proc/tsm-nope")
    assert list((tsm_home / "local").iterdir()) == []  # the app's folder was removed again
    assert sched.store.query("SELECT app_id FROM local_apps") == []


def test_cwd_run_option_must_be_a_directory(sched: LocalScheduler, tmp_path: Path) -> None:
    with pytest.raises(InvalidRunOptionError, match="cwd=.* is not a directory"):
        run(sched, AppDef("c", [Role("r", entrypoint="true")]), cwd=str(tmp_path / "missing"))


# -- logs ----------------------------------------------------------------------------------------
def test_logs_streams_regex_and_final_line_without_newline(sched: LocalScheduler) -> None:
    code = """
        import sys, time
        print("out 1"); sys.stderr.write("err 1\\n"); sys.stderr.flush(); time.sleep(0.2)
        print("out 2"); sys.stderr.write("err 2\\n"); sys.stderr.flush(); time.sleep(0.2)
        sys.stdout.write("no newline at the end")
    """
    app_id = run(sched, AppDef("logs", [py(code)]))
    wait(sched, app_id)
    assert list(sched.log_iter(app_id, "r", 0, streams=Stream.STDOUT)) == ["out 1\n", "out 2\n", "no newline at the end"]
    assert list(sched.log_iter(app_id, "r", 0, streams=Stream.STDERR)) == ["err 1\n", "err 2\n"]
    assert list(sched.log_iter(app_id, "r", 0)) == ["out 1\n", "err 1\n", "out 2\n", "err 2\n", "no newline at the end"]
    assert list(sched.log_iter(app_id, "r", 0, regex=r"^err")) == ["err 1\n", "err 2\n"]
    assert list(sched.log_iter(app_id, "r", 0, streams=Stream.STDOUT, regex="2")) == ["out 2\n"]


def test_logs_since_until(sched: LocalScheduler) -> None:
    code = """
        import time
        print("early", flush=True); time.sleep(1.0); print("late", flush=True)
    """
    app_id = run(sched, AppDef("times", [py(code)]))
    wait(sched, app_id)
    lines = list(sched.log_iter(app_id, "r", 0))
    assert lines == ["early\n", "late\n"]
    stdout = sched.store.query("SELECT started, ended FROM local_replicas WHERE app_id=?", (app_id,))[0]
    middle = datetime.fromtimestamp((stdout["started"] + stdout["ended"]) / 2)
    assert list(sched.log_iter(app_id, "r", 0, since=middle)) == ["late\n"]
    assert list(sched.log_iter(app_id, "r", 0, until=middle)) == ["early\n"]
    future = datetime.now() + timedelta(hours=1)
    assert list(sched.log_iter(app_id, "r", 0, since=future)) == []


def test_tail_follows_until_the_replica_ends(sched: LocalScheduler) -> None:
    code = """
        import time
        for i in range(5):
            print("tick", i, flush=True); time.sleep(0.1)
        import sys; sys.stdout.write("bye")
    """
    app_id = run(sched, AppDef("tail", [py(code)]))
    lines = list(sched.log_iter(app_id, "r", 0, should_tail=True))
    assert lines == [f"tick {i}\n" for i in range(5)] + ["bye"]
    desc = sched.describe(app_id)
    assert desc is not None and replica(desc, "r", 0).state.is_terminal


def test_tail_of_a_cancelled_app_stops(sched: LocalScheduler) -> None:
    app_id = run(sched, AppDef("tailc", [py("import time; print('up', flush=True); time.sleep(300)")]), grace_period=0.0)
    it = sched.log_iter(app_id, "r", 0, should_tail=True)
    assert next(it) == "up\n"
    sched.cancel(app_id)
    assert list(it) == []


def test_log_iter_bad_role_or_replica(sched: LocalScheduler) -> None:
    app_id = run(sched, AppDef("bad", [Role("r", entrypoint="true")]))
    with pytest.raises(UnknownAppError, match="no role 'x'"):
        list(sched.log_iter(app_id, "x", 0))
    with pytest.raises(UnknownAppError, match="replicas 0..0"):
        list(sched.log_iter(app_id, "r", 3))


# -- GPUs ------------------------------------------------------------------------------------------
def test_assign_gpus_slices_per_replica() -> None:
    roles = [
        Role("cpu", entrypoint="x"),
        Role("a", entrypoint="x", num_replicas=2, resource=Resource(gpu=2)),
        Role("b", entrypoint="x", resource=Resource(gpu=1)),
    ]
    devices = ["0", "1", "2", "3", "4", "5"]
    assert assign_gpus(roles, devices) == {("a", 0): ["0", "1"], ("a", 1): ["2", "3"], ("b", 0): ["4"]}
    assert assign_gpus(roles, []) == {}
    with pytest.raises(InvalidAppError, match="asks for 5 GPU"):
        assign_gpus(roles, ["0", "1", "2"])


def test_gpu_replicas_get_cuda_visible_devices(sched: LocalScheduler, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    role = Role("g", entrypoint="true", num_replicas=2, resource=Resource(gpu=2))
    info = sched.submit_dryrun(AppDef("gpu", [role]))
    envs = [r.env.get("CUDA_VISIBLE_DEVICES") for r in info.request.roles[0].replicas]
    assert envs == ["4,5", "6,7"]
    info = sched.submit_dryrun(AppDef("gpu", [role]), {"auto_set_cuda_visible_devices": False})
    assert all("CUDA_VISIBLE_DEVICES" not in r.env for r in info.request.roles[0].replicas)
    with pytest.raises(InvalidAppError, match="GPU"):
        sched.submit_dryrun(AppDef("gpu", [Role("g", entrypoint="true", num_replicas=3, resource=Resource(gpu=2))]))


# -- expiration timers -----------------------------------------------------------------------------
HANGS_ONCE = """
    import os, sys, time
    import tsm.timer
    marker = sys.argv[1]
    first = not os.path.exists(marker)
    open(marker, "a").write("x")
    with tsm.timer.expires(after=0.5, scope="allreduce"):
        if first:
            time.sleep(300)  # a hung collective
    print("done", flush=True)
"""


def test_replica_hung_inside_expires_is_reaped_and_retried(sched: LocalScheduler, tmp_path: Path) -> None:
    role = py(HANGS_ONCE, max_retries=1, retry_policy=RetryPolicy.REPLICA)
    role.args.append(str(tmp_path / "marker"))
    app_id = run(sched, AppDef("hung", [role]))
    desc = wait(sched, app_id)
    assert desc.state == AppState.SUCCEEDED, desc
    assert desc.num_restarts == 1
    assert replica(desc, "r", 0).restarts == 1
    assert list(sched.log_iter(app_id, "r", 0, streams=Stream.STDOUT)) == ["done\n"]


def test_reaped_replica_records_the_expired_timer(sched: LocalScheduler, tmp_path: Path) -> None:
    role = py(HANGS_ONCE)
    role.args.append(str(tmp_path / "marker"))
    app_id = run(sched, AppDef("hung", [role]))
    desc = wait(sched, app_id)
    assert desc.state == AppState.FAILED
    assert replica(desc, "r", 0).error_msg == "expired timer allreduce"
    assert "expired timer allreduce" in desc.msg


def test_timers_can_be_turned_off(sched: LocalScheduler) -> None:
    code = "import os; print(os.environ.get('TSM_TIMER_SOCKET', 'none'))"
    app_id = run(sched, AppDef("notimers", [py(code)]), timers=False)
    wait(sched, app_id)
    assert list(sched.log_iter(app_id, "r", 0)) == ["none\n"]


def test_partial_line_of_a_running_replica_is_held_back(sched: LocalScheduler) -> None:
    code = "import sys, time; sys.stdout.write('whole\\npart'); sys.stdout.flush(); time.sleep(300)"
    app_id = run(sched, AppDef("partial", [py(code)]), grace_period=0.0)
    wait_until(lambda: list(sched.log_iter(app_id, "r", 0)) == ["whole\n"], timeout=HANG_GUARD)
    assert list(sched.log_iter(app_id, "r", 0, streams=Stream.STDOUT)) == ["whole\n"]
    sched.cancel(app_id)
    assert list(sched.log_iter(app_id, "r", 0, streams=Stream.STDOUT)) == ["whole\n", "part"]
