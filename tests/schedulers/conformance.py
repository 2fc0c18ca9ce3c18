"""The contract every scheduler keeps, as tests: one suite, run against every backend that can run here.

A backend is described by a :class:`Backend` (how to make the scheduler, an id it cannot know, how to check
what it submitted) and listed in :data:`BACKENDS`; ``tests/schedulers/test_conformance.py`` runs every
``check_*`` function below against each. What the contract says:

* an unknown app id: ``describe`` and ``wait`` give None, ``exists`` False, ``list`` leaves it out,
  ``log_iter`` raises :class:`UnknownAppError`, the runner's ``status`` is None, ``cancel`` a no-op;
* ``cancel`` is idempotent: twice while running, and again after the end, leaves the app CANCELLED;
  and it ends the replica's whole process tree (a child it started too);
* ``describe`` shows every role and replica (ids ``0..n-1``) and names a failed replica by its exit code,
  and its ``structured_error_msg`` is the one specified JSON object (:mod:`tsm.schedulers.common.failure`)
  naming that replica;
* ``log_iter`` of a role or replica the app lacks raises :class:`UnknownAppError` naming the valid ones;
  ``should_tail`` follows a log until the replica ends, lines whole; ``regex`` and ``streams`` select;
* the dry run's request is exactly what is submitted (and its printed form does not change by submitting);
* ``list`` includes an app the moment ``submit`` returns;
* terminal states are sticky: a later ``cancel``, ``wait`` or ``describe`` never changes them;
* ``wait`` returns once the app has ended, and with a ``timeout`` returns while it still runs;
* a role's ``max_retries`` either works (a replica that fails once then succeeds makes the app SUCCEED) or
  is refused at dry run with :class:`InvalidAppError` naming ``max_retries`` (never silently ignored);
* ``run_opts`` are typed and documented, and a value of the wrong type is refused at dry run;
* args and env values with shell metacharacters (the corpus of ``tests/hostile.py``) reach the replica
  byte for byte, and none of them runs as shell;
* the lifecycle policy (:mod:`tsm.lifecycle.policy`) is enforced, in its words: a time limit ends the app
  "time limit 1s reached" (the stopped replica's exit is not retried as its own failure); a requeue at the
  limit spends ``max_preemptions``, never ``max_retries``, and past it the app fails "... (no preemptions
  left: max_preemptions=1)"; the warning signal reaches the replica's handler before the limit; a stall
  with ``on_stall=fail`` fails the app "... stalled for 1s, last line: 'working'" without a retry; a
  failure is retried until ``max_retries`` is spent. A backend without the long-run options does not offer
  them.

Time bounds are generous guards against a hang (:data:`HANG`), never performance claims.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import hostile
from tsm.errors import InvalidAppError, InvalidRunOptionError, UnknownAppError
from tsm.lifecycle import policy as lifecycle
from tsm.runner.api import Runner
from tsm.schedulers.api import Scheduler, Stream
from tsm.schedulers.common.failure import KEYS as FAILURE_KEYS, parse_structured_error
from tsm.specs.api import AppDef, AppDryRunInfo, AppState, Resource, RetryPolicy, Role
from tsm.specs.runopts import type_name

#: Seconds after which a backend is considered hung (a Slurm requeue alone waits ~10 s on the test cluster).
HANG = 240.0
PY = sys.executable
SMALL = Resource(cpu=1, memMB=200)


@dataclass
class Backend:
    """One scheduler under the contract, and what the suite needs to know of it."""

    name: str
    sched: Scheduler
    unknown_id: str
    #: asserts that what ``schedule`` submitted for ``app_id`` is exactly ``info.request``
    check_submitted: Callable[[str, AppDryRunInfo[Any]], None]
    retries: bool
    cfg: dict[str, Any] = field(default_factory=dict)
    #: False only for a test double that does not fill ``structured_error_msg`` (the in-memory fake)
    structured_errors: bool = True
    #: it takes the long-run options (time limits in seconds, requeues, the preemption budget) and enforces
    #: them as the lifecycle policy decides; False: it does not offer them at all
    long_runs: bool = True

    def role(self, name: str, *args: str, **kw: Any) -> Role:
        """A role running ``python ARGS`` with a small resource."""
        return Role(name, entrypoint=PY, args=list(args), resource=SMALL, **kw)

    def submit(self, app: AppDef) -> str:
        return self.sched.submit(app, self.cfg)


def _wait_until(pred: Callable[[], bool], what: str, timeout: float = HANG) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.1)


def _ended(backend: Backend, app_id: str) -> AppState:
    desc = backend.sched.wait(app_id, timeout=HANG)
    assert desc is not None and desc.state.is_terminal, f"{backend.name}: {app_id} did not end: {desc}"
    return desc.state


# -- the backends ------------------------------------------------------------------------------------------


def _local(tmp_path: Path) -> Iterator[Backend]:
    from tsm.schedulers.local.scheduler import LocalScheduler

    def check(app_id: str, info: AppDryRunInfo[Any]) -> None:
        sent = json.loads((Path(info.request.app_dir) / "request.json").read_text())
        assert sent == json.loads(json.dumps(dataclasses.asdict(info.request)))

    s = LocalScheduler("conformance")
    yield Backend("local", s, "nosuchapp-00000000", check, retries=True)
    s.close()


def _slurm(tmp_path: Path) -> Iterator[Backend]:
    from tsm.schedulers.slurm import create_scheduler

    def check(app_id: str, info: AppDryRunInfo[Any]) -> None:
        # what the controller holds for the job, not only what tsm wrote beside it
        held = subprocess.run(
            ["scontrol", "write", "batch_script", app_id, "-"], capture_output=True, text=True
        )
        assert held.returncode == 0, held.stderr
        assert held.stdout == info.request.script
        assert (Path(info.request.job_dir) / "app.json").read_text() == info.request.app_json

    s = create_scheduler("conformance")
    yield Backend("slurm", s, "999999999", check, retries=True)
    s.close()


def _fake(tmp_path: Path) -> Iterator[Backend]:
    from fake import FakeScheduler

    s = FakeScheduler("conformance")
    dry: dict[int, Any] = {}

    def check(app_id: str, info: AppDryRunInfo[Any]) -> None:
        assert s.submitted[app_id] is info.request
        assert s.submitted[app_id] == dry[id(info.request)]

    orig = s._submit_dryrun

    def remember(app: AppDef, cfg: Any) -> AppDryRunInfo[Any]:
        info = orig(app, cfg)
        dry[id(info.request)] = copy.deepcopy(info.request)
        return info

    s._submit_dryrun = remember  # type: ignore[method-assign]
    yield Backend("fake", s, "fake-0-0", check, retries=False, structured_errors=False, long_runs=False)
    s.close()


#: name -> a generator of the backend (setup, yield, teardown); marks say what each needs.
MAKERS: dict[str, Callable[[Path], Iterator[Backend]]] = {"local": _local, "slurm": _slurm, "fake": _fake}
BACKENDS = [
    pytest.param("local", id="local"),
    pytest.param("slurm", id="slurm", marks=[pytest.mark.integration, pytest.mark.slurm]),
    pytest.param("fake", id="fake"),
]


# -- the contract --------------------------------------------------------------------------------------------


def check_unknown_app_is_none_everywhere(backend: Backend) -> None:
    s = backend.sched
    assert s.describe(backend.unknown_id) is None
    assert s.exists(backend.unknown_id) is False
    s.cancel(backend.unknown_id)  # a no-op, not an error
    s.cancel(backend.unknown_id)
    assert s.wait(backend.unknown_id, timeout=HANG) is None
    assert backend.unknown_id not in [r.app_id for r in s.list()]
    with pytest.raises(UnknownAppError):
        list(s.log_iter(backend.unknown_id, "r", 0))
    runner = Runner("conformance", scheduler_factories={backend.name: lambda *a, **k: s})
    assert runner.status(f"{backend.name}://conformance/{backend.unknown_id}") is None


def check_cancel_is_idempotent(backend: Backend) -> None:
    s = backend.sched
    app_id = backend.submit(AppDef("cancelme", [backend.role("r", "-c", "import time; time.sleep(600)")]))
    s.cancel(app_id)
    s.cancel(app_id)
    assert _ended(backend, app_id) == AppState.CANCELLED
    s.cancel(app_id)
    desc = s.describe(app_id)
    assert desc is not None and desc.state == AppState.CANCELLED


def _alive(pid: int) -> bool:
    """True while ``pid`` is a live process here (a zombie counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def check_cancel_ends_the_whole_process_tree(backend: Backend, tmp_path: Path) -> None:
    s = backend.sched
    pids = tmp_path / "pids"
    code = (
        "import os, subprocess, sys; child = subprocess.Popen(['sleep', '600']); "
        "open(sys.argv[1] + '.tmp', 'w').write(f'{os.getpid()} {child.pid}'); "
        "os.rename(sys.argv[1] + '.tmp', sys.argv[1]); child.wait()"
    )
    app_id = backend.submit(AppDef("tree", [backend.role("r", "-c", code, str(pids))]))
    _wait_until(pids.exists, "the replica to start its child")
    replica, child = map(int, pids.read_text().split())
    assert _alive(replica) and _alive(child)
    s.cancel(app_id)
    assert _ended(backend, app_id) == AppState.CANCELLED
    _wait_until(lambda: not _alive(replica) and not _alive(child), "the replica and its child to end")


def check_log_iter_names_valid_roles_and_replicas(backend: Backend) -> None:
    s = backend.sched
    app = AppDef("logs", [backend.role("trainer", "-c", "print('hi')", num_replicas=2)])
    app_id = backend.submit(app)
    _ended(backend, app_id)
    with pytest.raises(UnknownAppError, match=r"no role 'nope'.*trainer"):
        list(s.log_iter(app_id, "nope", 0))
    with pytest.raises(UnknownAppError, match=r"replicas 0\.\.1, not 2"):
        list(s.log_iter(app_id, "trainer", 2))
    with pytest.raises(UnknownAppError):
        list(s.log_iter(app_id, "trainer", -1))
    assert "".join(s.log_iter(app_id, "trainer", 1, streams=Stream.STDOUT)) == "hi\n"


def check_describe_shows_every_role_and_replica(backend: Backend) -> None:
    s = backend.sched
    app = AppDef("shape", [backend.role("a", "-c", "pass", num_replicas=2), backend.role("b", "-c", "pass")])
    app_id = backend.submit(app)
    assert _ended(backend, app_id) == AppState.SUCCEEDED
    desc = s.describe(app_id)
    assert desc is not None and desc.app_id == app_id
    assert [rs.role for rs in desc.roles_statuses] == ["a", "b"]
    assert [[r.id for r in rs.replicas] for rs in desc.roles_statuses] == [[0, 1], [0]]
    assert all(r.state == AppState.SUCCEEDED for rs in desc.roles_statuses for r in rs.replicas)
    assert desc.app is not None and [r.name for r in desc.app.roles] == ["a", "b"]


def check_a_failed_replica_is_named(backend: Backend) -> None:
    s = backend.sched
    code = "import os, sys; sys.exit(3 if os.environ['TSM_REPLICA_ID'] == '1' else 0)"
    app_id = backend.submit(AppDef("fails", [backend.role("w", "-c", code, num_replicas=2)]))
    assert _ended(backend, app_id) == AppState.FAILED
    desc = s.describe(app_id)
    assert desc is not None
    (role,) = desc.roles_statuses
    failed = {r.id: r.exit_code for r in role.replicas if r.state == AppState.FAILED}
    assert failed.get(1) == 3, failed
    # replica 0 exits 0 at once, unless it was still starting when replica 1 failed the app: then it was
    # stopped (and may show as failed, by a signal), but never with replica 1's exit code
    assert all(code != 3 for rid, code in failed.items() if rid != 1), failed
    if backend.structured_errors:  # the one specified shape (tsm.schedulers.common.failure), naming the culprit
        error = parse_structured_error(desc.structured_error_msg)
        assert error is not None, desc.structured_error_msg
        assert json.loads(desc.structured_error_msg).keys() == set(FAILURE_KEYS)
        assert (error["replica"], error["exit_code"]) == ("w/1", 3) and error["message"], error


def check_logs_follow_filter_and_split_streams(backend: Backend) -> None:
    s = backend.sched
    code = (
        "import sys, time\n"
        "for i in range(5):\n"
        "    print(f'out {i}', flush=True); print(f'err {i}', file=sys.stderr, flush=True); time.sleep(0.2)\n"
        "sys.stdout.write('no newline')"
    )
    app_id = backend.submit(AppDef("tail", [backend.role("r", "-c", code)]))
    followed = list(s.log_iter(app_id, "r", 0, should_tail=True, streams=Stream.STDOUT))
    assert followed == [f"out {i}\n" for i in range(5)] + ["no newline"]  # whole, in order, ends with the app
    assert _ended(backend, app_id) == AppState.SUCCEEDED
    assert list(s.log_iter(app_id, "r", 0, streams=Stream.STDERR)) == [f"err {i}\n" for i in range(5)]
    assert list(s.log_iter(app_id, "r", 0, regex=r"[13]$", streams=Stream.STDOUT)) == ["out 1\n", "out 3\n"]
    combined = list(s.log_iter(app_id, "r", 0))
    assert sorted(combined) == sorted(followed + [f"err {i}\n" for i in range(5)])


def check_dry_run_is_what_is_submitted(backend: Backend) -> None:
    s = backend.sched
    app = AppDef("dry", [backend.role("r", "-c", "import time; time.sleep(600)", env={"E": "v"})])
    info = s.submit_dryrun(app, backend.cfg)
    printed = str(info)
    app_id = s.schedule(info)
    try:
        backend.check_submitted(app_id, info)
        assert str(info) == printed
    finally:
        s.cancel(app_id)


def check_list_includes_a_just_submitted_app(backend: Backend) -> None:
    s = backend.sched
    app_id = backend.submit(AppDef("listed", [backend.role("r", "-c", "import time; time.sleep(600)")]))
    try:
        rows = {r.app_id: r for r in s.list()}
        assert app_id in rows
        assert not rows[app_id].state.is_terminal
    finally:
        s.cancel(app_id)


def check_terminal_states_are_sticky(backend: Backend) -> None:
    s = backend.sched
    ok = backend.submit(AppDef("ok", [backend.role("r", "-c", "pass")]))
    bad = backend.submit(AppDef("bad", [backend.role("r", "-c", "raise SystemExit(3)")]))
    assert _ended(backend, ok) == AppState.SUCCEEDED
    assert _ended(backend, bad) == AppState.FAILED
    for app_id, want in ((ok, AppState.SUCCEEDED), (bad, AppState.FAILED)):
        s.cancel(app_id)
        for _ in range(3):
            desc = s.describe(app_id)
            assert desc is not None and desc.state == want
            w = s.wait(app_id, timeout=1)
            assert w is not None and w.state == want
        assert next(r for r in s.list() if r.app_id == app_id).state == want


def check_wait_returns_after_the_end(backend: Backend) -> None:
    s = backend.sched
    app_id = backend.submit(AppDef("waits", [backend.role("r", "-c", "import time; time.sleep(600)")]))
    try:
        start = time.monotonic()
        desc = s.wait(app_id, timeout=1.0)  # still running: wait gives up at its timeout
        assert desc is not None and not desc.state.is_terminal
        assert time.monotonic() - start < HANG
    finally:
        s.cancel(app_id)
    short = backend.submit(AppDef("short", [backend.role("r", "-c", "import time; time.sleep(1)")]))
    start = time.monotonic()
    desc = s.wait(short)
    assert desc is not None and desc.state == AppState.SUCCEEDED
    assert time.monotonic() - start < HANG


def check_retries_work_or_are_refused(backend: Backend, tmp_path: Path) -> None:
    s = backend.sched
    code = (
        "import sys; p = sys.argv[1]; open(p, 'a').write('x')\nsys.exit(1 if len(open(p).read()) == 1 else 0)"
    )
    for policy in (RetryPolicy.APPLICATION, RetryPolicy.REPLICA):
        marker = tmp_path / f"attempts-{policy.value}"
        app = AppDef(
            "retry", [backend.role("r", "-c", code, str(marker), max_retries=1, retry_policy=policy)]
        )
        if not backend.retries:
            with pytest.raises(InvalidAppError, match="max_retries"):
                s.submit_dryrun(app, backend.cfg)
            continue
        app_id = backend.submit(app)
        assert _ended(backend, app_id) == AppState.SUCCEEDED, policy
        assert marker.read_text() == "xx", policy  # failed once, ran again, succeeded


def check_run_opts_are_typed_and_documented(backend: Backend) -> None:
    opts = backend.sched.run_opts()
    for name, opt in opts:
        assert type_name(opt.type_) in ("str", "int", "float", "bool", "list[str]", "dict[str, str]"), name
        assert opt.help.strip() and opt.help == opt.help.strip(), f"{name} has no help"
    if len(opts):
        name, opt = next(iter(opts))
        wrong: Any = 12345 if opt.type_ is not int else "not a number"
        with pytest.raises(InvalidRunOptionError, match=name):
            backend.sched.submit_dryrun(AppDef("o", [backend.role("r")]), {**backend.cfg, name: wrong})


def check_args_and_env_arrive_byte_exact(backend: Backend, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    args, env = hostile.args(str(marker)), hostile.env(str(marker))
    app = AppDef("hostile", [backend.role("r", "-c", hostile.DUMP, *args, env=env)])
    app_id = backend.submit(app)
    assert _ended(backend, app_id) == AppState.SUCCEEDED
    out = "".join(backend.sched.log_iter(app_id, "r", 0, streams=Stream.STDOUT))
    got_args, got_env = hostile.read_dump(out)
    assert not hostile.mismatches(got_args, got_env, args, env)
    assert not marker.exists()


#: prints the replica's blocked signals and those it ignores, of the signals a program may use (glibc keeps 32
#: and 33 for itself: Go's dockerd leaves 32 ignored in every container, which no program can see), less the
#: two Python itself ignores when it starts
SIGNAL_STATE = (
    "import signal\n"
    "got = dict(line.split(':') for line in open('/proc/self/status') if line.startswith(('SigBlk', 'SigIgn')))\n"
    "usable = sum(1 << (s - 1) for s in signal.valid_signals())\n"
    "own = 1 << (signal.SIGPIPE - 1) | 1 << (signal.SIGXFSZ - 1)\n"
    "print(int(got['SigBlk'], 16) & usable, int(got['SigIgn'], 16) & usable & ~own)\n"
)


def check_a_replica_starts_with_no_signal_blocked_or_ignored(backend: Backend) -> None:
    # a signal blocked or ignored when the program starts never reaches it (a stop's SIGTERM, a warning):
    # whatever the launcher, its threads or the caller had, the program starts with none
    app_id = backend.submit(AppDef("signals", [backend.role("r", "-c", SIGNAL_STATE)]))
    assert _ended(backend, app_id) == AppState.SUCCEEDED
    out = [line.split() for line in backend.sched.log_iter(app_id, "r", 0) if line.strip()]  # one stream: Kubernetes
    assert ["0", "0"] in out, out


# -- the lifecycle policy (tsm.lifecycle.policy): every backend that takes the long-run options enforces it ---

#: a replica that reports its attempt and why the last one ended, then works (quietly) far past any limit here
LONG = ("import os, time\n"
        "print('attempt', os.environ.get('TSM_ATTEMPT'), 'last', repr(os.environ.get('TSM_LAST_EXIT')), flush=True)\n"
        "time.sleep(600)\n")


def _takes_long_runs(backend: Backend) -> bool:
    """Whether the backend takes the long-run options; one that does not must not offer them (never ignored)."""
    names = {name for name, _ in backend.sched.run_opts()}
    if not backend.long_runs:
        assert not names & {"time_limit", "requeue_on_time_limit", "max_preemptions"}, names
    return backend.long_runs


def check_time_limit_ends_the_app_with_the_policys_message(backend: Backend) -> None:
    if not _takes_long_runs(backend):
        return
    app_id = backend.sched.submit(AppDef("limit", [backend.role("r", "-c", LONG)]), {**backend.cfg, "time_limit": "1s"})
    desc = backend.sched.wait(app_id, timeout=HANG)
    assert desc is not None and desc.state == AppState.FAILED, desc
    assert desc.msg == lifecycle.time_limit_message(1.0), desc.msg
    assert desc.num_restarts == 0, desc  # the stopped replica's exit is the limit's, never retried as its own


def check_requeue_at_the_time_limit_spends_the_preemption_budget(backend: Backend) -> None:
    if not _takes_long_runs(backend):
        return
    cfg = {**backend.cfg, "time_limit": "1s", "requeue_on_time_limit": True, "max_preemptions": 1}
    app = AppDef("requeue", [backend.role("r", "-c", LONG, max_retries=0)])
    app_id = backend.sched.submit(app, cfg)
    desc = backend.sched.wait(app_id, timeout=HANG)
    assert desc is not None and desc.state == AppState.FAILED, desc
    assert desc.msg == lifecycle.budget_spent(lifecycle.time_limit_message(1.0), 1), desc.msg
    assert desc.num_restarts == 1, desc  # one requeue (a preemption), max_retries=0 untouched


#: a replica that says when it is warned (and keeps working), quiet otherwise
WARNED = ("import signal, sys, time\n"
          "signal.signal(signal.SIGUSR1, lambda s, f: print('warned', flush=True))\n"
          "print('up', flush=True)\n"
          "time.sleep(600)\n")


def check_the_warning_comes_before_the_time_limit(backend: Backend) -> None:
    if not _takes_long_runs(backend):
        return
    # the warning 10 s in: a replica that has not set its handler by then (a slow start: a Ray actor or a pod on a
    # loaded machine) is not warned, by design (only a process that handles the signal gets it)
    cfg = {**backend.cfg, "time_limit": "14s", "warn_signal": "USR1", "warn_before": "4s"}
    app_id = backend.sched.submit(AppDef("warn", [backend.role("r", "-c", WARNED)]), cfg)
    desc = backend.sched.wait(app_id, timeout=HANG)
    assert desc is not None and desc.state == AppState.FAILED and desc.msg == lifecycle.time_limit_message(14.0), desc
    out = [line.strip() for line in backend.sched.log_iter(app_id, "r", 0)]
    assert "warned" in out, out  # the replica's own handler ran: warned, not ended by the signal


def check_a_stall_fails_the_app_with_on_stall_fail(backend: Backend) -> None:
    if not _takes_long_runs(backend):
        return
    code = "import time; print('working', flush=True); time.sleep(600)"
    cfg = {**backend.cfg, "stall_timeout": "1s", "on_stall": "fail"}
    app_id = backend.sched.submit(AppDef("stall", [backend.role("r", "-c", code, max_retries=1)]), cfg)
    desc = backend.sched.wait(app_id, timeout=HANG)
    assert desc is not None and desc.state == AppState.FAILED, desc
    assert desc.msg.endswith("stalled for 1s, last line: 'working'"), desc.msg
    assert desc.num_restarts == 0, desc  # on_stall=fail: no retry, whatever max_retries says


def check_a_failure_is_retried_until_max_retries_then_fails(backend: Backend) -> None:
    app = AppDef("fails", [backend.role("r", "-c", "raise SystemExit(3)", max_retries=1)])
    if not backend.retries:
        with pytest.raises(InvalidAppError, match="max_retries"):
            backend.sched.submit_dryrun(app, backend.cfg)
        return
    app_id = backend.submit(app)
    desc = backend.sched.wait(app_id, timeout=HANG)
    assert desc is not None and desc.state == AppState.FAILED, desc
    assert "exited with code 3" in desc.msg and desc.num_restarts == 1, desc


#: Every check, by name; test_conformance.py runs each against each backend.
CHECKS: dict[str, Callable[..., None]] = {
    name.removeprefix("check_"): fn for name, fn in list(globals().items()) if name.startswith("check_")
}
