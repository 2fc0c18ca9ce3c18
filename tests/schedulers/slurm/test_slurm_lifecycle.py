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
from slurm_util import directives, dryrun, two_role_app

from testutil import HANG, wait_until
from tsm.errors import InvalidRunOptionError
from tsm.schedulers.slurm import SlurmScheduler
from tsm.schedulers.slurm.parse import PREEMPTION_STATES, SlurmJob, preemption_of, read_last_exit
from tsm.schedulers.slurm.script import slurm_time
from tsm.specs.api import AppDef, Role

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


@pytest.mark.parametrize(("seconds", "minutes"), [(1, "1"), (60, "1"), (61, "2"), (7200, "120")])
def test_slurm_time_rounds_up_to_minutes(seconds: float, minutes: str) -> None:
    assert slurm_time(seconds) == minutes


@pytest.mark.parametrize(("cfg", "match"), [
    ({"time": "10", "time_limit": "10m"}, "give one of time"),
    ({"stall_timeout": "15m"}, "not supported on slurm yet"),
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
    assert read_last_exit(tmp_path) == ""  # no file: not started yet
    (tmp_path / "last_exit").write_text("failed:3\n")
    assert read_last_exit(tmp_path) == "failed:3"
    assert preemption_of(requeued, read_last_exit(tmp_path)) == ""
    (tmp_path / "last_exit").write_text("preempted\n")
    assert preemption_of(requeued, read_last_exit(tmp_path)) == "preempted: Slurm requeued the job (restart 1)"
    (tmp_path / "last_exit").write_text("$(rm -rf /)\n")
    assert read_last_exit(tmp_path) == ""


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

#: records its arguments; ``requeue`` fails (so the script goes on: the real one would end this run)
FAKE_SCONTROL = """\
import os, sys
with open(os.environ["FAKE_LOG"], "a") as f:
    f.write("scontrol " + " ".join(sys.argv[1:]) + "\\n")
if sys.argv[1:3] == ["show", "hostnames"]:
    print("localhost")
sys.exit(1 if sys.argv[1:2] == ["requeue"] else 0)
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
    for name, body in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL), ("scancel", FAKE_SCANCEL)):
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
    assert read_last_exit(job_dir) == "preempted"
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
    assert lines(tmp_path / "fake.log").count("scancel --signal=USR1 4242") == 1
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
    assert json.dumps(read_last_exit(job_dir)) == '"time_limit"'


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
    desc = sched.describe_records("5", [rec], tmp_path, app)
    assert desc is not None
    for r in desc.roles_statuses[0].replicas:
        assert r.preempted == bool(preempted) and (r.error_msg == preempted or not preempted)
