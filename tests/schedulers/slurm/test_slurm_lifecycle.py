"""Long runs on Slurm (issue 25): the script's directives, its restart bookkeeping and warning forwarding,
run with bash against stand-ins for srun, scontrol and scancel; and preemption read from Slurm's states."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from slurm_util import RecordingHost, directives, dryrun, two_role_app

from testutil import HANG, wait_until
from tsm.errors import InvalidRunOptionError, SchedulerError
from tsm.schedulers.api import DescribeAppResponse
from tsm.schedulers.common.stall import stall_message
from tsm.schedulers.slurm import SlurmScheduler, cli as slurm_cli
from tsm.schedulers.slurm.describe import describe_records
from tsm.schedulers.slurm.host import Where
from tsm.schedulers.slurm.jobdir import CANCEL_MARK, JobDir
from tsm.schedulers.slurm.parse import PREEMPTION_STATES, SlurmJob, job_state, preemption_of, stranded
from tsm.schedulers.slurm.script import slurm_time, warning_of
from tsm.specs.api import AppDef, AppState, Role

# -- directives ----------------------------------------------------------------------------------------


def test_time_limit_warning_and_exclude_become_directives(sched: SlurmScheduler) -> None:
    cfg = {"time_limit": "2h", "warn_signal": "USR1", "warn_before": "120s", "exclude": "node9",
           "exclude_nodes": ["node3", "gpu[1-2]"]}
    lines = directives(dryrun(sched, two_role_app(), cfg).script)
    assert "#SBATCH --signal=B:USR1@120" in lines  # the batch shell gets it and forwards it to every task
    assert lines.count("#SBATCH --time=120") == 2  # every het component: minutes
    assert lines.count("#SBATCH --exclude='node9,node3,gpu[1-2]'") == 2
    assert "#SBATCH --requeue" in lines  # preemptions restart (max_preemptions defaults to 3)


def test_no_warning_without_a_signal_and_no_requeue_without_a_budget(sched: SlurmScheduler) -> None:
    lines = directives(dryrun(sched, two_role_app(), {"time_limit": "90s", "max_preemptions": 0}).script)
    assert "#SBATCH --time=2" in lines and not any("--signal" in x for x in lines)
    assert "#SBATCH --requeue" not in lines
    # requeue_on_time_limit alone still needs the batch shell told: USR1, never forwarded to tasks
    script = dryrun(sched, two_role_app(), {"time_limit": "1h", "requeue_on_time_limit": True,
                                            "warn_before": "60"}).script
    assert "#SBATCH --signal=B:USR1@60" in directives(script)
    assert "scancel --signal=USR1" not in script and "export TSM_WARN_SIGNAL" not in script


def test_a_warning_without_a_time_limit_is_still_asked_for(sched: SlurmScheduler) -> None:
    """A preemption (preempt_send_user_signal) or a cancel sends it: the batch shell needs --signal and the trap."""
    script = dryrun(sched, two_role_app(), {"warn_signal": "USR2", "warn_before": "30s"}).script
    assert "#SBATCH --signal=B:USR2@30" in directives(script)
    assert "_tsm_warn=USR2 " in script  # programs/longrun.sh traps it
    assert not any(x.startswith("#SBATCH --time") for x in directives(script))
    assert warning_of(script) == ("USR2", 30)
    # a requeue's bare USR1 is no warning of the app's: cancel sends nothing then
    bare = dryrun(sched, two_role_app(), {"time_limit": "1h", "requeue_on_time_limit": True}).script
    assert warning_of(bare) is None
    assert warning_of(dryrun(sched, two_role_app(), {}).script) is None


@pytest.mark.parametrize(("seconds", "minutes"), [(1, "1"), (60, "1"), (61, "2"), (7200, "120")])
def test_slurm_time_rounds_up_to_minutes(seconds: float, minutes: str) -> None:
    assert slurm_time(seconds) == minutes


@pytest.mark.parametrize(("cfg", "match"), [
    ({"time": "10", "time_limit": "10m"}, "give one of time"),
    ({"time_limit": "1d", "warn_signal": "USR1", "warn_before": "1d"}, "longer than Slurm's --signal"),
    ({"warn_signal": "KILL"}, "cannot be caught"),
])
def test_refused_combinations(sched: SlurmScheduler, cfg: dict[str, object], match: str) -> None:
    with pytest.raises(InvalidRunOptionError, match=match):
        dryrun(sched, two_role_app(), cfg)


# -- parsed states -------------------------------------------------------------------------------------


def job(*states: str, reason: str = "", restarts: int = 0) -> SlurmJob:
    return SlurmJob(job_id="7", app_id="7", offset=0, name="a", states=list(states), reason=reason, restarts=restarts)


@pytest.mark.parametrize("state", sorted(PREEMPTION_STATES))
def test_cluster_decisions_are_preemptions(state: str) -> None:
    rec = job(state, reason="Prolog")
    assert rec.preempted
    assert preemption_of(rec).startswith("preempted: ") and f"({state})" in preemption_of(rec)
    assert "reason: Prolog" in preemption_of(rec)


@pytest.mark.parametrize("states", [["TIMEOUT"], ["FAILED"], ["OUT_OF_MEMORY"], ["CANCELLED"], ["COMPLETED"],
                                    ["PENDING"]])
def test_the_programs_own_ends_are_not(states: list[str]) -> None:
    assert not job(*states, reason="NonZeroExitCode").preempted


def test_a_requeue_is_a_preemption_unless_the_script_asked_for_it(tmp_path: Path) -> None:
    requeued = job("PENDING", "REQUEUED", reason="BeginTime", restarts=1)
    assert JobDir(tmp_path).last_exit() == ""  # no file: not started yet
    (tmp_path / "last_exit").write_text("failed:3\n")
    assert JobDir(tmp_path).last_exit() == "failed:3"
    assert preemption_of(requeued, JobDir(tmp_path).last_exit()) == ""
    (tmp_path / "last_exit").write_text("preempted\n")
    assert preemption_of(requeued, JobDir(tmp_path).last_exit()) == "preempted: Slurm requeued the job (restart 1)"
    (tmp_path / "last_exit").write_text("$(rm -rf /)\n")
    assert JobDir(tmp_path).last_exit() == ""


# -- the script, run with bash against stand-ins ---------------------------------------------------------

FAKE_SRUN = """\
import os, subprocess, sys
args = sys.argv[1:]
opts = {}
while args and args[0].startswith("-"):
    key, _, value = args.pop(0).partition("=")
    opts[key] = value
procs = []
for t in range(int(opts.get("--ntasks", "1"))):
    env = dict(os.environ, SLURM_PROCID=str(t), SLURMD_NODENAME="fake%d" % t, TSM_FAKE_TASK="1")
    out = open(opts["--output"].replace("%t", str(t)), "ab")
    err = open(opts["--error"].replace("%t", str(t)), "ab")
    procs.append(subprocess.Popen(args, cwd=opts.get("--chdir"), stdout=out, stderr=err, env=env))
sys.exit(max(p.wait() for p in procs))
"""

#: records its arguments; ``requeue`` fails (so the script goes on: the real one would end this run);
#: ``update`` fails as Slurm refuses it when FAKE_REFUSE is set
FAKE_SCONTROL = """\
import os, sys
with open(os.environ["FAKE_LOG"], "a") as f:
    f.write("scontrol " + " ".join(sys.argv[1:]) + "\\n")
if sys.argv[1:3] == ["show", "hostnames"]:
    print("\\n".join(sys.argv[3].split(",")))
if sys.argv[1:3] == ["show", "job"]:  # FAKE_SHOW_JOB, or what the file FAKE_SHOW_JOB_FILE holds now
    shown = os.environ.get("FAKE_SHOW_JOB_FILE")
    print(open(shown).read() if shown else os.environ.get("FAKE_SHOW_JOB", ""))
if sys.argv[1:2] == ["update"] and os.environ.get("FAKE_REFUSE"):
    print("Job is no longer pending execution for job 4242", file=sys.stderr)
    sys.exit(1)
sys.exit(1 if sys.argv[1:2] == ["requeue"] else 0)
"""

#: records its arguments, waits for the file FAKE_SACCT_WAIT names (when set), prints FAKE_SACCT
FAKE_SACCT = """\
import os, sys, time
with open(os.environ["FAKE_LOG"], "a") as f:
    f.write("sacct " + " ".join(sys.argv[1:]) + "\\n")
go, end = os.environ.get("FAKE_SACCT_WAIT"), time.monotonic() + 60
while go and not os.path.exists(go) and time.monotonic() < end:
    time.sleep(0.02)
print(os.environ.get("FAKE_SACCT", ""))
"""

#: every node is down, for the reason "tsm-test"
FAKE_SINFO = """\
import sys
print("tsm-test" if "%E" in sys.argv else "down")
"""

#: records its arguments; ``--signal=SIG`` signals every task of the job (what slurmstepd does), not srun
#: and not the batch shell
FAKE_SCANCEL = """\
import os, signal, sys
with open(os.environ["FAKE_LOG"], "a") as f:
    f.write("scancel " + " ".join(sys.argv[1:]) + "\\n")
sig = next((a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--signal=")), None)
if sig:
    me = os.getsid(0)
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if os.getsid(int(name)) != me:
                continue
            with open(f"/proc/{name}/environ", "rb") as f:
                env = f.read().split(b"\\0")
        except OSError:
            continue
        if b"TSM_FAKE_TASK=1" in env:
            os.kill(int(name), getattr(signal, "SIG" + sig))
"""


@pytest.fixture
def fake_cluster(tmp_path: Path) -> dict[str, str]:
    bindir = tmp_path / "fakebin"
    bindir.mkdir()
    for name, body in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL), ("scancel", FAKE_SCANCEL),
                       ("sacct", FAKE_SACCT), ("sinfo", FAKE_SINFO)):
        path = bindir / name
        path.write_text(f"#!{sys.executable}\n{body}")
        path.chmod(0o755)
    env = dict(os.environ)
    env.update(PATH=f"{bindir}:{env['PATH']}", SLURM_JOB_ID="4242", SLURM_JOB_NODELIST="fake0",
               FAKE_LOG=str(tmp_path / "fake.log"))
    env.pop("SLURM_RESTART_COUNT", None)
    return env


#: what each task prints: the attempt's variables, and "warned" when the warning comes
REPORT = textwrap.dedent("""
    import os, sys, time
    import tsm.lifecycle as lc
    lc.on_warning(lambda: print("warned", flush=True))
    print("attempt %s restarts %s last %s" % (lc.attempt(), lc.restart_count(), lc.last_exit()), flush=True)
""")


def write_job(sched: SlurmScheduler, app: AppDef, cfg: dict[str, object], tmp_path: Path) -> Path:
    req = dryrun(sched, app, {"job_dir": str(tmp_path / "job"), **cfg})
    job_dir = Path(req.job_dir)
    job_dir.mkdir(exist_ok=True)
    (job_dir / "job.sbatch").write_text(req.script)
    return job_dir


def run_attempt(job_dir: Path, env: dict[str, str], restart: int) -> subprocess.CompletedProcess[str]:
    env = dict(env, SLURM_RESTART_COUNT=str(restart))
    return subprocess.run(["bash", str(job_dir / "job.sbatch")], env=env, capture_output=True, text=True,
                          timeout=HANG)


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_failure_requeues_are_counted_apart_from_preemptions(
    sched: SlurmScheduler, fake_cluster: dict[str, str], tmp_path: Path
) -> None:
    code = REPORT + "sys.exit(3 if lc.restart_count() == 0 else 0)\n"
    app = AppDef("rq", [Role("r", entrypoint=sys.executable, args=["-c", code], max_retries=1)])
    job_dir = write_job(sched, app, {"max_preemptions": 1}, tmp_path)
    first = run_attempt(job_dir, fake_cluster, 0)
    assert "tsm: requeueing (restart 1 of 1)" in first.stderr
    assert "scontrol requeue 4242" in lines(tmp_path / "fake.log")
    assert (job_dir / "failures").read_text().strip() == "1"
    # Slurm runs it again: the script's own requeue is a failure, and max_retries' budget is spent
    assert run_attempt(job_dir, fake_cluster, 1).returncode == 0
    # then the cluster requeues it (no cause recorded): a preemption, within max_preemptions=1
    assert run_attempt(job_dir, fake_cluster, 2).returncode == 0
    assert JobDir(job_dir).last_exit() == "preempted"
    assert lines(job_dir / "r" / "0.stdout") == [
        "attempt 0 restarts 0 last None", "attempt 1 restarts 1 last failed:3", "attempt 2 restarts 2 last preempted",
    ]
    # a second preemption is over the budget: the job fails before starting anything
    third = run_attempt(job_dir, fake_cluster, 3)
    assert third.returncode == 1 and "more than max_preemptions=1" in third.stderr
    assert len(lines(job_dir / "r" / "0.stdout")) == 3


def start_batch(job_dir: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(["bash", str(job_dir / "job.sbatch")], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def test_warning_reaches_every_task_once_and_the_wrapper_survives_it(
    sched: SlurmScheduler, fake_cluster: dict[str, str], tmp_path: Path
) -> None:
    code = REPORT + "print('ready', flush=True)\nwhile not lc.warned():\n    time.sleep(0.02)\nsys.exit(0)\n"
    app = AppDef("w", [Role("r", entrypoint=sys.executable, args=["-c", code], num_replicas=2)])
    job_dir = write_job(sched, app, {"time_limit": "10m", "warn_signal": "USR1", "warn_before": "60s"}, tmp_path)
    batch = start_batch(job_dir, fake_cluster)
    try:
        for k in (0, 1):
            wait_until(lambda k=k: "ready" in lines(job_dir / "r" / f"{k}.stdout"), "task ready", timeout=HANG)
        batch.send_signal(signal.SIGUSR1)  # what --signal=B:USR1@60 does before the limit
        _, err = batch.communicate(timeout=HANG)
    finally:
        if batch.poll() is None:
            batch.kill()
    assert batch.returncode == 0, err
    assert "tsm: the time limit is near: SIGUSR1 to every task" in err
    # every task's processes get URG (ignored by default); each wrapper passes it on as USR1 to python alone
    assert lines(tmp_path / "fake.log").count("scancel --signal=URG 4242") == 1
    for k in (0, 1):
        assert lines(job_dir / "r" / f"{k}.stdout").count("warned") == 1
        assert (job_dir / "r" / f"{k}.status").read_text().startswith("exited 0 ")  # its wrapper lived on


def test_requeue_on_time_limit_requeues_itself_as_a_preemption(
    sched: SlurmScheduler, fake_cluster: dict[str, str], tmp_path: Path
) -> None:
    code = REPORT + "print('ready', flush=True)\nwhile not lc.warned() and not lc.restart_count():\n    time.sleep(0.02)\n"
    app = AppDef("tl", [Role("r", entrypoint=sys.executable, args=["-c", code])])
    cfg = {"time_limit": "10m", "warn_signal": "USR1", "warn_before": "5s", "requeue_on_time_limit": True}
    job_dir = write_job(sched, app, cfg, tmp_path)
    batch = start_batch(job_dir, fake_cluster)
    try:
        wait_until(lambda: "ready" in lines(job_dir / "r" / "0.stdout"), "task ready", timeout=HANG)
        batch.send_signal(signal.SIGUSR1)
        _, err = batch.communicate(timeout=HANG)
    finally:
        if batch.poll() is None:
            batch.kill()
    assert "tsm: requeueing at the time limit (preemption 1 of 3)" in err
    deadline = time.monotonic() + HANG
    while "scontrol requeue 4242" not in lines(tmp_path / "fake.log") and time.monotonic() < deadline:
        time.sleep(0.05)  # a task that exits on the warning may end the loop before the timer: both are fine
    assert (job_dir / "requeue_cause").read_text().strip() == "time_limit"
    # the next attempt reads it, and it counts as a preemption (failures untouched)
    assert run_attempt(job_dir, fake_cluster, 1).returncode == 0
    assert "attempt 1 restarts 1 last time_limit" in lines(job_dir / "r" / "0.stdout")
    assert not (job_dir / "failures").exists()
    assert json.dumps(JobDir(job_dir).last_exit()) == '"time_limit"'


@pytest.mark.parametrize("preempting", [True, False])
def test_a_task_ended_by_a_preemptions_sigterm_leaves_the_requeue_to_slurm(
    sched: SlurmScheduler, fake_cluster: dict[str, str], tmp_path: Path, preempting: bool
) -> None:
    """Once Slurm sent the job's own --signal (a time limit's warning, which it may send up to 30 s early), a
    preemption sends SIGTERM to the tasks at once and requeues the job when the partition's GraceTime ends.
    A batch script that took the tasks' end for the app's failure ended the job first, as FAILED, never
    requeued. While Slurm preempts (``PreemptTime`` set), the script waits for Slurm; otherwise the same end
    is the app's failure."""
    code = REPORT + ("import os, signal\nprint('ready', flush=True)\n"
                     "while not os.path.exists(os.environ['GO']):\n    time.sleep(0.02)\n"
                     "os.kill(os.getpid(), signal.SIGTERM)\n")  # fmt: skip
    app = AppDef("pt", [Role("r", entrypoint=sys.executable, args=["-c", code], max_retries=1)])
    cfg = {"time_limit": "10m", "warn_signal": "USR1", "warn_before": "60s", "requeue_on_time_limit": True}
    job_dir = write_job(sched, app, cfg, tmp_path)
    shown = tmp_path / "show_job"
    shown.write_text("JobId=4242 PreemptTime=None\n")
    env = dict(fake_cluster, GO=str(tmp_path / "go"), FAKE_SHOW_JOB_FILE=str(shown))
    err_path = tmp_path / "batch.err"
    with err_path.open("w") as err:
        batch = subprocess.Popen(["bash", str(job_dir / "job.sbatch")], env=env, stdout=subprocess.DEVNULL,
                                 stderr=err, start_new_session=True)  # fmt: skip
    try:
        wait_until(lambda: "ready" in lines(job_dir / "r" / "0.stdout"), "task ready", timeout=HANG)
        batch.send_signal(signal.SIGUSR1)  # the time limit's warning first: the requeue timer starts
        wait_until(lambda: "warned" in lines(job_dir / "r" / "0.stdout"), "the warning", timeout=HANG)
        if preempting:
            shown.write_text("JobId=4242 PreemptTime=2026-11-28T19:24:40\n")
        (tmp_path / "go").touch()  # the preemption's SIGTERM (the task dies of it)
        if preempting:
            wait_until(lambda: "waiting for Slurm to requeue it" in err_path.read_text(), "the script to wait",
                       timeout=HANG)  # fmt: skip
            time.sleep(0.5)
            assert batch.poll() is None, err_path.read_text()  # still there for Slurm to end and requeue
            batch.send_signal(signal.SIGTERM)  # the grace time's end
        batch.wait(timeout=HANG)
    finally:
        if batch.poll() is None:
            batch.kill()
    calls = lines(tmp_path / "fake.log")
    if preempting:
        assert batch.returncode == -signal.SIGTERM
        assert "scontrol requeue 4242" not in calls and "scancel --signal=TERM 4242" not in calls, calls
        # nor the time limit's cause: the next attempt is Slurm's requeue, a preemption
        assert not (job_dir / "failures").exists() and not (job_dir / "requeue_cause").exists()
        assert "tsm: role r ended (srun exit code 143) as Slurm preempts the job" in err_path.read_text()
    else:  # the app's own failure: its retry is spent
        assert "scontrol requeue 4242" in calls
        assert (job_dir / "failures").read_text().strip() == "1"
        assert (job_dir / "requeue_cause").read_text().strip() == "failed:143"


def test_requeue_at_the_time_limit_aims_at_the_jobs_end_time(
    sched: SlurmScheduler, fake_cluster: dict[str, str], tmp_path: Path
) -> None:
    """Slurm may send the warning late: the requeue timer runs to 5 s before the job's EndTime, not for
    warn_before - 5 s after the warning."""
    bindir = tmp_path / "sleepbin"
    bindir.mkdir()
    (bindir / "sleep").write_text(f"#!{sys.executable}\nimport os, sys, time\n"
                                  "open(os.environ['FAKE_LOG'], 'a').write('sleep ' + sys.argv[1] + '\\n')\n"
                                  "time.sleep(float(sys.argv[1]))\n")  # fmt: skip
    (bindir / "sleep").chmod(0o755)
    # the task ends once the timer started (the fake sleep logged it)
    code = REPORT + ("print('ready', flush=True)\n"
                     "while 'sleep ' not in open(os.environ['FAKE_LOG']).read():\n    time.sleep(0.02)\n")
    app = AppDef("tl", [Role("r", entrypoint=sys.executable, args=["-c", code])])
    cfg = {"time_limit": "10m", "warn_signal": "USR1", "warn_before": "120s", "requeue_on_time_limit": True}
    job_dir = write_job(sched, app, cfg, tmp_path)
    end = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() + 65))
    env = dict(fake_cluster, PATH=f"{bindir}:{fake_cluster['PATH']}",
               FAKE_SHOW_JOB=f"   StartTime=2026-11-25T16:33:01 EndTime={end} Deadline=N/A")  # fmt: skip
    batch = start_batch(job_dir, env)
    try:
        wait_until(lambda: "ready" in lines(job_dir / "r" / "0.stdout"), "task ready", timeout=HANG)
        batch.send_signal(signal.SIGUSR1)
        _, err = batch.communicate(timeout=HANG)  # the task's end ends the job: the timer is not waited for
    finally:
        if batch.poll() is None:
            batch.kill()
    assert "tsm: requeueing at the time limit (preemption 1 of 3)" in err, err
    timers = [int(ln.split()[1]) for ln in lines(tmp_path / "fake.log") if ln.startswith("sleep ")]
    assert len(timers) == 1 and 50 <= timers[0] <= 60, timers  # not 115 (warn_before - 5)


@pytest.mark.parametrize(("cause", "said"), [
    ("cancel", "tsm: cancelled: SIGUSR1 to every task"),
    ("preemption", "tsm: the job is preempted: SIGUSR1 to every task"),
])
def test_a_cancel_or_preemption_warning_never_requeues_at_the_time_limit(
    sched: SlurmScheduler, fake_cluster: dict[str, str], tmp_path: Path, cause: str, said: str
) -> None:
    """The same USR1 comes before the limit, at a preemption and from tsm cancel: only the limit's requeues."""
    code = REPORT + "print('ready', flush=True)\nwhile not lc.warned():\n    time.sleep(0.02)\n"
    app = AppDef("tl", [Role("r", entrypoint=sys.executable, args=["-c", code])])
    cfg = {"time_limit": "10m", "warn_signal": "USR1", "warn_before": "5s", "requeue_on_time_limit": True}
    job_dir = write_job(sched, app, cfg, tmp_path)
    env = dict(fake_cluster)
    if cause == "preemption":  # what scontrol show job says of a job Slurm preempted
        env["FAKE_SHOW_JOB"] = "   PreemptEligibleTime=2026-11-25T16:33:01 PreemptTime=2026-11-25T16:34:00"
    batch = start_batch(job_dir, env)
    try:
        wait_until(lambda: "ready" in lines(job_dir / "r" / "0.stdout"), "task ready", timeout=HANG)
        if cause == "cancel":  # tsm cancel writes it to a running job, then warns
            (job_dir / CANCEL_MARK).write_text("cancel\n")
        batch.send_signal(signal.SIGUSR1)
        _, err = batch.communicate(timeout=HANG)
    finally:
        if batch.poll() is None:
            batch.kill()
    assert batch.returncode == 0, err
    assert said in err and "requeueing" not in err
    assert lines(job_dir / "r" / "0.stdout").count("warned") == 1
    assert not (job_dir / "requeue_cause").exists()
    assert "scontrol requeue 4242" not in lines(tmp_path / "fake.log")


SILENT = REPORT + "print('ready', flush=True)\nwhile True:\n    time.sleep(0.05)\n"


@pytest.mark.parametrize("on_stall", ["fail", "restart"])
def test_a_silent_replica_is_stalled_warned_then_stopped(
    sched: SlurmScheduler, fake_cluster: dict[str, str], tmp_path: Path, on_stall: str
) -> None:
    """No log byte and no CPU for stall_timeout: warned, stopped; then the app fails or requeues as a failure."""
    busy = REPORT + "print('ready', flush=True)\nwhile True:\n    print('tick', flush=True)\n    time.sleep(0.1)\n"
    app = AppDef("st", [Role("r", entrypoint=sys.executable, args=["-c", SILENT], max_retries=1),
                        Role("busy", entrypoint=sys.executable, args=["-c", busy])])
    cfg = {"stall_timeout": "1s", "on_stall": on_stall, "warn_signal": "USR1", "warn_before": "1s", "kill_grace": 2}
    job_dir = write_job(sched, app, cfg, tmp_path)
    batch = start_batch(job_dir, fake_cluster)
    try:
        _, err = batch.communicate(timeout=HANG)
    finally:
        if batch.poll() is None:
            batch.kill()
    stalled = (job_dir / "stalled").read_text()
    assert stalled == f"r/0 {stall_message(1, 'ready')}\n", (stalled, err)  # the busy role never stalls
    assert f"tsm: replica r/0 {stall_message(1, 'ready')}" in err
    assert "tsm: stalled: SIGUSR1 to every task" in err and "tsm: stalled: stopping every task" in err
    assert lines(job_dir / "r" / "0.stdout").count("warned") == 1
    if on_stall == "fail":
        assert batch.returncode != 0 and "requeueing" not in err, err
        assert not (job_dir / "requeue_cause").exists()
    else:  # its own failure: max_retries pays for the restart, which knows why
        assert "tsm: requeueing (restart 1 of 1)" in err, err
        assert (job_dir / "requeue_cause").read_text().strip() == "stalled"
        assert (job_dir / "failures").read_text().strip() == "1"


@pytest.mark.parametrize("stalled_status", ["exited 143 1 0 TERM node1", "exited 0 1 0 - node1"])
def test_describe_names_the_stalled_replica(sched: SlurmScheduler, tmp_path: Path, stalled_status: str) -> None:
    """The stalled replica failed, also when its task exited 0 on the warning (checkpointed, then exited)."""
    (tmp_path / "stalled").write_text("r/1 stalled for 15m, last line: 'step 7'\n")
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "0.status").write_text("exited 143 1 0 TERM node0\n")
    (tmp_path / "r" / "1.status").write_text(stalled_status + "\n")
    app = AppDef("a", [Role("r", entrypoint="x", num_replicas=2)])
    rec = SlurmJob(job_id="5", app_id="5", offset=0, name="a.r", states=["FAILED"], restarts=0, exit_code=143)
    desc = describe_records("5", [rec], JobDir(tmp_path), app)
    assert desc is not None
    reps = desc.roles_statuses[0].replicas
    assert reps[1].error_msg == "stalled for 15m, last line: 'step 7'" and reps[1].state.name == "FAILED"
    assert reps[0].error_msg.startswith("stopped by SIGTERM")
    assert "stalled for 15m" in desc.msg


@pytest.mark.parametrize(("on_stall", "retries"), [("fail", 1), ("restart", 0)])
def test_a_stall_fails_even_when_its_tasks_exit_0_on_the_warning(
    sched: SlurmScheduler, fake_cluster: dict[str, str], tmp_path: Path, on_stall: str, retries: int
) -> None:
    """A task that checkpoints and exits 0 on the warning: the attempt still fails as stalled (exit 1), with
    on_stall=fail and with on_stall=restart once max_retries is spent; it never ends COMPLETED."""
    code = REPORT + ("print('ready', flush=True)\nwhile not lc.warned():\n    time.sleep(0.2)\n"
                     "print('checkpointed', flush=True)\nsys.exit(0)\n")
    app = AppDef("st0", [Role("r", entrypoint=sys.executable, args=["-c", code], max_retries=retries)])
    cfg = {"stall_timeout": "1s", "on_stall": on_stall, "warn_signal": "USR1", "warn_before": "5s", "kill_grace": 2}
    job_dir = write_job(sched, app, cfg, tmp_path)
    batch = start_batch(job_dir, fake_cluster)
    try:
        _, err = batch.communicate(timeout=HANG)
    finally:
        if batch.poll() is None:
            batch.kill()
    assert lines(job_dir / "r" / "0.stdout")[-2:] == ["warned", "checkpointed"], err
    assert (job_dir / "r" / "0.status").read_text().startswith("exited 0 ")  # the task itself ended well
    assert batch.returncode == 1, err
    assert (job_dir / "exit").read_text().strip() == "1"
    assert "requeueing" not in err and not (job_dir / "requeue_cause").exists()


def test_a_cancel_mark_of_an_earlier_attempt_is_stale(
    sched: SlurmScheduler, fake_cluster: dict[str, str], tmp_path: Path
) -> None:
    """A tsm cancel whose scancel never came left its mark: the next attempt's time limit still requeues."""
    code = REPORT + "print('ready', flush=True)\nwhile not lc.warned():\n    time.sleep(0.02)\n"
    app = AppDef("tl", [Role("r", entrypoint=sys.executable, args=["-c", code])])
    cfg = {"time_limit": "10m", "warn_signal": "USR1", "warn_before": "5s", "requeue_on_time_limit": True}
    job_dir = write_job(sched, app, cfg, tmp_path)
    (job_dir / CANCEL_MARK).write_text("cancel\n")
    batch = start_batch(job_dir, fake_cluster)
    try:
        wait_until(lambda: "ready" in lines(job_dir / "r" / "0.stdout"), "task ready", timeout=HANG)
        batch.send_signal(signal.SIGUSR1)
        _, err = batch.communicate(timeout=HANG)
    finally:
        if batch.poll() is None:
            batch.kill()
    assert "tsm: the time limit is near: SIGUSR1 to every task" in err, err
    assert "tsm: requeueing at the time limit (preemption 1 of 3)" in err
    assert (job_dir / "requeue_cause").read_text().strip() == "time_limit"
    assert not (job_dir / CANCEL_MARK).exists()


@pytest.mark.parametrize("batch_rc", [0, 1])
def test_cancel_removes_its_mark_when_no_scancel_follows(
    sched: SlurmScheduler, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, batch_rc: int
) -> None:
    """The warning could not be sent, or the scancel after it failed: the job runs on, without the mark."""
    req = dryrun(sched, AppDef("c", [Role("r", entrypoint="x")]), {"warn_signal": "USR1", "warn_before": "1s"})
    (tmp_path / "job.sbatch").write_text(req.script)
    monkeypatch.setattr(sched, "where", lambda app_id: Where(app_id, app_id, sched.local, str(tmp_path)))
    monkeypatch.setattr(sched, "describe", lambda app_id, max_age=1.0: DescribeAppResponse(app_id, AppState.RUNNING))
    # the warning goes through the host's warn.sh, whose scancel is this stand-in: it records what it was
    # asked and whether the mark was there while it ran
    bindir = tmp_path / "bin"
    bindir.mkdir()
    asked = tmp_path / "asked"
    scancel = bindir / "scancel"
    scancel.write_text(f'#!/bin/sh\necho "$* mark=$(test -e {tmp_path}/{CANCEL_MARK} && echo yes)" >>{asked}\n'
                       f"exit {batch_rc}\n")
    scancel.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    calls: list[list[str]] = []

    def run(args: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
        calls.append(args)
        return subprocess.CompletedProcess(args, 1, "", "scancel: error: Access/permission denied")

    monkeypatch.setattr(slurm_cli, "run", run)
    with pytest.raises(SchedulerError, match="permission denied"):
        sched.cancel("77")
    assert asked.read_text() == "--batch --signal=USR1 77 mark=yes\n"  # the mark was written before the warning
    assert calls == [["scancel", "77"]]
    assert not (tmp_path / CANCEL_MARK).exists()


def test_a_warning_before_the_handler_is_set_does_not_kill_the_batch_shell(
    sched: SlurmScheduler, fake_cluster: dict[str, str], tmp_path: Path
) -> None:
    """A tsm cancel or a limit's warning while the script still asks sacct: noted, acted on, the job runs on."""
    app = AppDef("early", [Role("r", entrypoint=sys.executable, args=["-c", REPORT])])
    job_dir = write_job(sched, app, {"time_limit": "10m", "warn_signal": "USR1", "warn_before": "60s"}, tmp_path)
    go = tmp_path / "go"
    env = dict(fake_cluster, SLURM_RESTART_COUNT="1", FAKE_SACCT_WAIT=str(go))
    batch = start_batch(job_dir, env)
    try:
        wait_until(lambda: any(ln.startswith("sacct ") for ln in lines(tmp_path / "fake.log")),
                   "the script to ask sacct", timeout=HANG)  # fmt: skip
        batch.send_signal(signal.SIGUSR1)
        go.write_text("")
        _, err = batch.communicate(timeout=HANG)
    finally:
        if batch.poll() is None:
            batch.kill()
    assert batch.returncode == 0, err
    assert "tsm: the time limit is near: SIGUSR1 to every task" in err
    assert lines(job_dir / "r" / "0.stdout") == ["attempt 1 restarts 1 last preempted"]


# -- moves off failed nodes ---------------------------------------------------------------------------------


@pytest.mark.parametrize("refused", [False, True])
def test_a_restart_given_a_failed_node_moves_off_it_and_a_refused_move_fails_the_app(
    sched: SlurmScheduler, fake_cluster: dict[str, str], tmp_path: Path, refused: bool
) -> None:
    app = AppDef("mv", [Role("r", entrypoint=sys.executable, args=["-c", REPORT])])
    job_dir = write_job(sched, app, {"exclude": "node9", "max_preemptions": 1}, tmp_path)
    env = dict(fake_cluster, FAKE_SACCT="NODE_FAIL|fake0", **({"FAKE_REFUSE": "1"} if refused else {}))
    first = run_attempt(job_dir, env, 1)  # attempt 0 died with fake0; Slurm gave this one fake0 again
    log = lines(tmp_path / "fake.log")
    assert first.returncode == 0, first.stderr
    assert "requeueing without them (ExcNodeList=node9,fake0)" in first.stderr
    moves = [ln for ln in log if ln.split()[1] in ("requeuehold", "update", "release")]
    assert moves == ["scontrol requeuehold 4242", "scontrol update JobId=4242 ExcNodeList=node9,fake0",
                     "scontrol release 4242"]
    assert (job_dir / "moves").read_text().strip() == "1"
    assert JobDir(job_dir).excluded() == ["fake0 NODE_FAIL (reason: tsm-test)"]
    assert not (job_dir / "r" / "0.stdout").exists()  # nothing ran on the failed node
    second = run_attempt(job_dir, dict(env, SLURM_JOB_NODELIST="fake1"), 2)
    if not refused:  # kept off fake0: it runs, its restart still the cluster's
        assert second.returncode == 0, second.stderr
        assert lines(job_dir / "r" / "0.stdout") == ["attempt 2 restarts 2 last preempted"]
        assert JobDir(job_dir).node_error() == ""
        return
    said = ("Slurm refused to keep the job off node(s) fake0 (scontrol update JobId=4242 ExcNodeList=node9,fake0: "
            "Job is no longer pending execution for job 4242); the app fails")
    assert f"tsm: {said}" in first.stderr
    assert JobDir(job_dir).node_error() == said
    # the released job fails as its next attempt starts, before running anything, and says why
    assert second.returncode == 1 and f"tsm: {said}" in second.stderr
    assert (job_dir / "exit").read_text().strip() == "1" and not (job_dir / "r" / "0.stdout").exists()
    rec = SlurmJob(job_id="4242", app_id="4242", offset=0, name="mv.r", states=["FAILED"], restarts=2, exit_code=1)
    desc = describe_records("4242", [rec], JobDir(job_dir), app)
    assert desc is not None and desc.state == AppState.FAILED and said in desc.msg, desc


def test_moves_off_failed_nodes_stop_at_max_preemptions(
    sched: SlurmScheduler, fake_cluster: dict[str, str], tmp_path: Path
) -> None:
    """Given a failed node again after max_preemptions moves: Slurm does not keep the exclusion; the app fails."""
    app = AppDef("mv", [Role("r", entrypoint=sys.executable, args=["-c", REPORT])])
    job_dir = write_job(sched, app, {"max_preemptions": 1}, tmp_path)
    (job_dir / "moves").write_text("1\n")
    result = run_attempt(job_dir, dict(fake_cluster, FAKE_SACCT="NODE_FAIL|fake0"), 2)
    assert result.returncode == 1, result.stderr
    assert "after 1 move(s) off failed nodes" in JobDir(job_dir).node_error()
    assert f"tsm: {JobDir(job_dir).node_error()}" in result.stderr
    assert not any(ln.split()[1] in ("requeuehold", "update") for ln in lines(tmp_path / "fake.log"))
    assert not (job_dir / "r" / "0.stdout").exists() and (job_dir / "moves").read_text().strip() == "1"


# -- describe (needs the scheduler.py diff) ------------------------------------------------------------


@pytest.mark.parametrize(("states", "last", "preempted"), [
    (["PREEMPTED"], "", "preempted: Slurm preempted the job (PREEMPTED)"),
    (["NODE_FAIL"], "", "preempted: a node of the job failed (NODE_FAIL)"),
    (["PENDING", "REQUEUED"], "preempted", "preempted: Slurm requeued the job (restart 1)"),
    (["RUNNING"], "failed:3", ""),
    (["TIMEOUT"], "", ""),
])
def test_describe_flags_preempted_replicas(
    sched: SlurmScheduler, tmp_path: Path, states: list[str], last: str, preempted: str
) -> None:
    (tmp_path / "last_exit").write_text(last)
    app = AppDef("a", [Role("r", entrypoint="x", num_replicas=2)])
    rec = SlurmJob(job_id="5", app_id="5", offset=0, name="a.r", states=states, restarts=1)
    desc = describe_records("5", [rec], JobDir(tmp_path), app)
    assert desc is not None
    for r in desc.roles_statuses[0].replicas:
        assert r.preempted == bool(preempted) and (r.error_msg == preempted or not preempted)


@pytest.mark.parametrize(("job_state", "expected"), [
    ("CANCELLED", ("CANCELLED", "stopped by SIGTERM (exit code 143)")),
    ("FAILED", ("FAILED", "exited with code 143")),
])  # fmt: skip
def test_a_task_the_cancel_ended_before_its_wrapper_was_signalled_is_cancelled(
    sched: SlurmScheduler, tmp_path: Path, job_state: str, expected: tuple[str, str]
) -> None:
    """Slurm signals a cancelled step's processes one at a time: a task may die of the SIGTERM (exit 143)
    before its wrapper gets its own, so the wrapper records no signal. In a cancelled job it was stopped, not
    failed; in a job that failed, exit 143 is the program's own."""
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "0.status").write_text("exited 143 1 0 TERM node0\n")
    (tmp_path / "w" / "1.status").write_text("exited 143 1 0 - node1\n")
    app = AppDef("a", [Role("w", entrypoint="x", num_replicas=2)])
    rec = SlurmJob(job_id="5", app_id="5", offset=0, name="a.w", states=[job_state], restarts=0, exit_code=0)
    desc = describe_records("5", [rec], JobDir(tmp_path), app)
    assert desc is not None
    reps = desc.roles_statuses[0].replicas
    assert (reps[0].state.name, reps[0].error_msg) == ("CANCELLED", "stopped by SIGTERM (exit code 143)")
    assert (reps[1].state.name, reps[1].error_msg) == expected


def test_a_task_the_preemption_ended_before_its_wrapper_was_signalled_is_preempted(
    sched: SlurmScheduler, tmp_path: Path
) -> None:
    """The same race at a preemption: the task that exited 143 with no signal recorded was preempted too; one
    that exited with another code in that attempt failed on its own."""
    (tmp_path / "w").mkdir()
    for k, status in enumerate(["exited 143 0 0 TERM node0", "exited 143 0 0 - node1", "exited 3 0 0 - node2"]):
        (tmp_path / "w" / f"{k}.status").write_text(status + "\n")
    app = AppDef("a", [Role("w", entrypoint="x", num_replicas=3)])
    rec = SlurmJob(job_id="5", app_id="5", offset=0, name="a.w", states=["PREEMPTED"], restarts=0)
    desc = describe_records("5", [rec], JobDir(tmp_path), app)
    assert desc is not None
    reps = desc.roles_statuses[0].replicas
    assert [r.preempted for r in reps] == [True, True, False], reps
    assert reps[2].error_msg == "exited with code 3"


def _component(offset: int, state: str, restarts: int) -> SlurmJob:
    return SlurmJob(job_id=str(9 + offset), app_id="9", offset=offset, name=f"a.r{offset}", states=[state],
                    restarts=restarts)  # fmt: skip


@pytest.mark.parametrize(("states", "expected"), [
    (["CANCELLED", "RUNNING"], AppState.RUNNING),  # the leader stopped, the other component's tasks not yet
    (["CANCELLED", "CANCELLED"], AppState.CANCELLED),
    (["FAILED", "RUNNING"], AppState.RUNNING),
    (["RUNNING", "CANCELLED"], AppState.RUNNING),
    (["FAILED", "PENDING"], AppState.FAILED),  # a component Slurm requeued alone runs nothing: the leader's end stands
    (["COMPLETED", "COMPLETED"], AppState.SUCCEEDED),
])  # fmt: skip
def test_a_heterogeneous_job_has_ended_once_its_last_running_component_has(
    sched: SlurmScheduler, tmp_path: Path, states: list[str], expected: AppState
) -> None:
    """Slurm ends a cancelled het job's components one by one: a look between the two saw the leader
    CANCELLED and another role still RUNNING, and a wait returned while that role's replica still ran."""
    app = AppDef("a", [Role("r0", entrypoint="x"), Role("r1", entrypoint="x")])
    recs = [_component(k, state, 0) for k, state in enumerate(states)]
    assert job_state(recs) == expected
    desc = describe_records("9", recs, JobDir(tmp_path), app)
    assert desc is not None and desc.state == expected


@pytest.mark.parametrize(("states", "expected"), [
    ([("PENDING", 1), ("FAILED", 0)], True),  # the leader requeued after a NODE_FAIL, the other left FAILED
    ([("PENDING", 1), ("PENDING", 1)], False),  # requeued whole
    ([("PENDING", 0), ("PENDING", 0)], False),
    ([("FAILED", 0), ("FAILED", 0)], False),  # ended whole
    ([("RUNNING", 1), ("RUNNING", 1)], False),
    ([("PENDING", 1)], False),  # not heterogeneous
])  # fmt: skip
def test_a_heterogeneous_job_requeued_in_part_is_found(states: list[tuple[str, int]], expected: bool) -> None:
    assert stranded([_component(k, state, n) for k, (state, n) in enumerate(states)]) is expected


def test_a_look_requeues_the_components_slurm_left_behind_once(
    sched: SlurmScheduler, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Slurm 22.05 requeues only the component on the failed node; the job would then wait for ever. A look
    asks ``scontrol requeue <leader>`` (which requeues the components that ended), once per restart."""
    calls: list[list[str]] = []
    monkeypatch.setattr(slurm_cli, "run", lambda args, **_: calls.append(args))
    recs = [_component(0, "PENDING", 1), _component(1, "FAILED", 0)]
    sched.local.requeue_stranded(sched.local.where("9"), recs)
    sched.local.requeue_stranded(sched.local.where("9"), recs)  # the next look, before Slurm's answer changed: not again
    assert calls == [["scontrol", "requeue", "9"]]
    sched.local.requeue_stranded(sched.local.where("9"), [_component(0, "PENDING", 2), _component(1, "FAILED", 1)])
    assert calls == [["scontrol", "requeue", "9"]] * 2  # a later restart
    sched.local.requeue_stranded(sched.local.where("10"), [_component(0, "PENDING", 1), _component(1, "PENDING", 1)])
    assert len(calls) == 2
    # an app submitted over SSH: the command runs on its login node, by the leader's job id there
    login = RecordingHost()
    login.requeue_stranded(Where("login-9", "9", login), recs)
    assert login.calls == [["scontrol", "requeue", "9"]] and len(calls) == 2
