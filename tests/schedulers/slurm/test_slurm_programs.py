"""The programs of ``tsm/schedulers/slurm/programs/`` on their own: linted, and run directly.

Bash and sh programs pass ``bash -n``/``sh -n`` and, where Debian's ``shellcheck`` is installed, shellcheck at
warning level (so do whole generated batch scripts); the wait loop runs against stand-ins for the sruns and
Slurm's commands, the stall watcher and the workspace builder run in a plain ``python3 -c`` as on a node or a
login node without tsm. The batch script's end to end behaviour is in ``test_slurm_script.py`` and
``test_slurm_lifecycle.py``; the real cluster runs it in ``tests/integration/``.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from slurm_util import dryrun, no_slurm, two_role_app

from integration.slurm_cluster import in_ci
from tsm.schedulers.common.lastline import last_line
from tsm.schedulers.common.stall import QUOTE_MAX, stall_message
from tsm.schedulers.slurm import SlurmQueries, SlurmScheduler, programs
from tsm.schedulers.slurm.host import LocalHost
from tsm.schedulers.slurm.jobdir import JOB_FILES
from tsm.schedulers.slurm.script import _stall_texts
from tsm.specs.api import AppDef, Role

HERE = Path(programs.__file__).parent
SHELL = sorted(p.name for p in HERE.glob("*.sh"))
BASH = {"replica.sh", "wait.sh", "longrun.sh"}  # parts of the batch script; the others are POSIX sh

#: Run options that put every generated part into a script: a warning forwarded to the tasks, a requeue at the
#: time limit, a stall watcher, excluded nodes, two roles with retries.
EVERYTHING = {"time_limit": "1h", "warn_signal": "USR1", "warn_before": "60s", "requeue_on_time_limit": True,
              "stall_timeout": "15m", "on_stall": "fail", "exclude": "node9", "exclude_nodes": ["gpu[1-2]"]}


def test_every_program_file_is_package_data() -> None:
    text = (Path(__file__).parents[3] / "pyproject.toml").read_text()
    assert '"schedulers/slurm/programs/*.sh"' in text  # the .py programs are modules of the package
    assert set(SHELL) == {"replica.sh", "wait.sh", "longrun.sh", "submit.sh", "find.sh", "files.sh", "warn.sh",
                          "remove.sh", "ws_check.sh"}


@pytest.mark.parametrize("name", SHELL)
def test_shell_programs_parse(name: str) -> None:
    shell = "bash" if name in BASH else "sh"
    proc = subprocess.run([shell, "-n", str(HERE / name)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


# Under CI (`make test` installs it) a missing shellcheck is a failure, never a skip counted as coverage.
needs_shellcheck = pytest.mark.skipif(shutil.which("shellcheck") is None and not in_ci(),
                                      reason="shellcheck is not installed (Debian: apt-get install shellcheck)")


@needs_shellcheck
@pytest.mark.parametrize("name", SHELL)
def test_shell_programs_pass_shellcheck(name: str) -> None:
    proc = subprocess.run(["shellcheck", "-S", "warning", str(HERE / name)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


@needs_shellcheck
@pytest.mark.parametrize("cfg", [{}, EVERYTHING, {"pack_replicas": True, "stall_timeout": "1m"}])
def test_generated_batch_scripts_pass_shellcheck(sched: SlurmScheduler, cfg: dict[str, object]) -> None:
    script = dryrun(sched, two_role_app(max_retries=1), cfg).script
    proc = subprocess.run(["shellcheck", "-S", "warning", "-s", "bash", "-"], input=script, capture_output=True,
                          text=True)  # fmt: skip
    assert proc.returncode == 0, proc.stdout


def test_the_batch_script_carries_the_programs_it_runs(sched: SlurmScheduler) -> None:
    script = dryrun(sched, two_role_app(max_retries=1), EVERYTHING).script
    assert programs.text("wait.sh").rstrip("\n") in script and programs.text("longrun.sh").rstrip("\n") in script
    assert "from tsm" not in programs.bundle("stall_watch.py")  # the watcher needs no tsm on the node


# -- the wait loop, against stand-ins for the sruns ------------------------------------------------------------
def run_wait_loop(tmp_path: Path, codes: list[int], retries: list[int], failures: int = 0
                  ) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """Run ``wait.sh`` as the batch script does, each role's srun a background ``sh -c 'exit <code>'``; fake
    ``scancel``/``scontrol`` record their arguments."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    calls = tmp_path / "calls"
    for name, code in (("scancel", 0), ("scontrol", 1)):  # a requeue that "fails": the script goes on to its end
        (bindir / name).write_text(f'#!/bin/sh\necho "{name} $*" >>{calls}\nexit {code}\n')
        (bindir / name).chmod(0o755)
    roles = "".join(
        f"_tsm_role[{i}]=r{i}; _tsm_retries[{i}]={n}; sh -c 'sleep 0.{i}; exit {c}' & _tsm_pid[{i}]=$!\n"
        for i, (c, n) in enumerate(zip(codes, retries, strict=True))
    )
    harness = (
        "declare -a _tsm_pid _tsm_rc _tsm_role _tsm_retries\n"
        f"_tsm_failures={failures} _tsm_timer='' _tsm_watch='' _tsm_stalled='' _tsm_cause='' _tsm_no_requeue=''\n"
        "_tsm_preempted() { return 1; }\n_tsm_on_wake() { :; }\n"
        '_tsm_signal_run() { scancel --signal="$1" "$SLURM_JOB_ID"; }\n'
        f"{roles}{programs.text('wait.sh')}"
    )
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "TSM_JOB_DIR": str(tmp_path),
           "TSM_ATTEMPT": "0", "TSM_KILL_GRACE": "1", "SLURM_JOB_ID": "77"}  # fmt: skip
    proc = subprocess.run(["bash", "-c", harness], env=env, capture_output=True, text=True, timeout=60)
    return proc, calls.read_text().splitlines() if calls.exists() else []


def test_the_wait_loop_ends_with_success_when_every_role_does(tmp_path: Path) -> None:
    proc, calls = run_wait_loop(tmp_path, [0, 0], [0, 0])
    assert proc.returncode == 0 and (tmp_path / "exit").read_text() == "0\n", proc.stderr
    assert calls == []


def test_the_wait_loop_stops_the_others_and_fails_with_the_first_failure(tmp_path: Path) -> None:
    proc, calls = run_wait_loop(tmp_path, [0, 5], [0, 0])
    assert proc.returncode == 5 and (tmp_path / "exit").read_text() == "5\n"
    assert "tsm: role r1 failed (srun exit code 5); stopping the other roles" in proc.stderr
    assert calls == ["scancel --signal=TERM 77"]
    assert (tmp_path / "stopping").read_text() == "0\n"  # the stop's mark: a task dying of it was stopped


def test_the_wait_loop_requeues_while_the_failed_role_has_retries(tmp_path: Path) -> None:
    # the stand-in's scontrol refuses the requeue, so the script goes on to record the code and exit with it,
    # after counting the requeue it asked for (a real requeue ends the script there)
    proc, calls = run_wait_loop(tmp_path, [3], [2], failures=1)
    assert "tsm: requeueing (restart 2 of 2)" in proc.stderr
    assert calls[-1] == "scontrol requeue 77" and (tmp_path / "failures").read_text() == "2\n"
    assert (tmp_path / "requeue_cause").read_text() == "failed:3\n"


def test_the_wait_loop_does_not_requeue_past_max_retries(tmp_path: Path) -> None:
    proc, calls = run_wait_loop(tmp_path, [3], [1], failures=1)
    assert proc.returncode == 3 and "tsm: requeueing" not in proc.stderr
    assert calls == ["scancel --signal=TERM 77"]  # the others stopped; no requeue asked


# -- the replicas' wrapper, run as a file --------------------------------------------------------------------
def longrun_function(name: str) -> str:
    """The text of the function ``name`` of ``longrun.sh`` (from its ``name() {`` line to its closing ``}``)."""
    found = re.search(rf"^{name}\(\) {{.*?^}}$", programs.text("longrun.sh"), re.S | re.M)
    assert found is not None, name
    return found.group(0)


def fake_tools(tmp_path: Path, **scripts: str) -> dict[str, str]:
    """An environment whose PATH finds the given stand-in programs (name -> sh body) first."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    for name, body in scripts.items():
        (bindir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bindir / name).chmod(0o755)
    return {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "SLURM_JOB_ID": "77"}


@pytest.mark.parametrize(("shown", "started_with", "preempted"), [
    ("JobState=RUNNING Restarts=0 PreemptTime=None", "0", False),
    ("JobState=RUNNING Restarts=0 PreemptTime=2026-12-02T17:43:34", "0", True),
    # Slurm has requeued this run already (PreemptTime cleared, one more restart): its tasks' ends are
    # the preemption's, not a failure of the run (which would stop the job, and that stop reach the next run)
    ("JobState=REQUEUED Restarts=1 PreemptTime=None", "0", True),
    ("JobState=RUNNING Restarts=1 PreemptTime=None", "1", False),
    ("", "0", False),  # scontrol could not say
])
def test_a_run_requeued_by_slurm_counts_as_preempted(tmp_path: Path, shown: str, started_with: str,
                                                     preempted: bool) -> None:
    env = fake_tools(tmp_path, scontrol=f"echo 'JobId=77 JobName=x Requeue=1 {shown} BatchFlag=1'" if shown
                     else "exit 1")
    env["TSM_RESTART_COUNT"] = started_with
    proc = subprocess.run(["bash", "-c", longrun_function("_tsm_preempted") + "\n_tsm_preempted"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert (proc.returncode == 0) == preempted, (proc.returncode, proc.stderr)


def test_a_signal_to_the_run_is_not_retried_into_the_next_run(tmp_path: Path) -> None:
    """scancel retries while the job is being requeued; once the next run starts, that retry would signal
    it (a run killed by the last run's stop). The batch script's scancel is cut short instead."""
    log = tmp_path / "calls"
    env = fake_tools(tmp_path, scancel=f'echo "tried $*" >>{log}\nsleep 30\necho "retried $*" >>{log}')
    proc = subprocess.run(["bash", "-c", longrun_function("_tsm_signal_run") + "\n_tsm_signal_run TERM"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0  # cut short
    assert log.read_text().splitlines() == ["tried --signal=TERM 77"]


def test_the_wrapper_file_runs_a_task_as_srun_would(tmp_path: Path) -> None:
    (tmp_path / "w").mkdir()
    env = {**os.environ, "TSM_JOB_DIR": str(tmp_path), "SLURM_PROCID": "1", "SLURMD_NODENAME": "n3",
           "TSM_APP_ID": "42"}  # fmt: skip
    proc = subprocess.run(
        ["bash", str(HERE / "replica.sh"), "w", "2", "1", "E=r${replica_id}", sys.executable, "-c",
         "import os, sys; print(os.environ['E'], os.environ['TSM_REPLICA_ID'], sys.argv[1])", "a${app_id}"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert (proc.returncode, proc.stdout) == (0, "r1 1 a42\n"), proc.stderr
    assert (tmp_path / "w" / "1.status").read_text().startswith("exited 0 ")


# -- the stall watcher, in a plain python ----------------------------------------------------------------------
def test_the_stall_watcher_finds_the_silent_replica_and_quotes_its_last_line(tmp_path: Path) -> None:
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "0.status").write_text("exited 0 1 0 - n1\n")  # ended: never stalled
    (tmp_path / "w" / "1.status").write_text("running n2 1 0\n")
    (tmp_path / "w" / "1.stdout").write_text("step 1\nstep 2 \x1b[31mred\n\n")
    (tmp_path / "w" / "1.stderr").write_text("")
    with_line, silent = _stall_texts(0.2)
    proc = subprocess.run(
        [sys.executable, "-I", "-c", programs.bundle("stall_watch.py"), str(tmp_path), "0", "0.2", "0.05",
         str(QUOTE_MAX), with_line, silent, "w:2"],
        capture_output=True, text=True, timeout=60, env={"PATH": os.environ["PATH"]},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    why = stall_message(0.2, "step 2 \x1b[31mred")
    assert (tmp_path / "stalled").read_text() == f"w/1 {why}\n"  # the message every backend gives
    assert proc.stderr == f"tsm: replica w/1 {why}\n"


def test_the_last_line_is_one_function_for_local_and_slurm(tmp_path: Path) -> None:
    (tmp_path / "out").write_text("a\nlast of out\n")
    (tmp_path / "err").write_text("b\n  last of err  \n\n")
    os.utime(tmp_path / "out", (1, 1))
    assert last_line([str(tmp_path / "out"), str(tmp_path / "err")]) == "last of err"  # the newest file's
    assert last_line([str(tmp_path / "out"), str(tmp_path / "missing")], limit=4) == "last"
    source = (Path(last_line.__code__.co_filename)).read_text().rstrip("\n")
    assert source in programs.bundle("stall_watch.py")


# -- the workspace builder, in a plain python ---------------------------------------------------------------------
def _object_tar(objects: dict[str, bytes], manifest: dict[str, object]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in [*objects.items(), ("manifest.json", json.dumps(manifest).encode())]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_the_workspace_builder_stores_checked_objects_and_a_read_only_snapshot(tmp_path: Path) -> None:
    data = b"print('hi')\n"
    digest = hashlib.sha256(data).hexdigest()
    entries = [{"path": "pkg", "kind": "dir"}, {"path": "pkg/main.py", "kind": "file", "digest": digest,
                                                 "executable": False, "size": len(data)}]  # fmt: skip
    store = tmp_path / "store"
    run = [sys.executable, "-I", "-c", programs.text("ws_build.py"), str(store), "snap1"]
    tar = _object_tar({f"objects/{digest[:2]}/{digest}": data}, {"digest": "snap1", "entries": entries})
    proc = subprocess.run(run, input=tar, capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    made = store / "snapshots" / "snap1" / "pkg" / "main.py"
    assert made.read_bytes() == data
    assert [oct(p.stat().st_mode & 0o777) for p in (made, made.parent)] == ["0o444", "0o555"]
    damaged = _object_tar({f"objects/{digest[:2]}/{digest}": b"not it"}, {"digest": "snap2", "entries": entries})
    proc = subprocess.run([*run[:-1], "snap2"], input=damaged, capture_output=True, timeout=60)
    assert proc.returncode != 0 and b"arrived damaged" in proc.stderr
    assert not (store / "snapshots" / "snap2").exists()


# -- the host programs, run by this machine's host ----------------------------------------------------------------
def test_remove_deletes_only_what_tsm_wrote(tmp_path: Path) -> None:
    job = tmp_path / "job"
    (job / "r").mkdir(parents=True)
    for name in ("app.json", "exit", "cancel", "stalled"):
        (job / name).write_text("x")
    for name in ("0.stdout", "0.status", "12.stderr", "notes.txt", "x.stdout"):
        (job / "r" / name).write_text("x")
    (job / "mine.txt").write_text("kept")
    host = LocalHost(SlurmQueries(runner=no_slurm))
    assert host.remove(str(job), ["r"]) is True
    assert sorted(p.relative_to(job).as_posix() for p in job.rglob("*")) == ["mine.txt", "r", "r/notes.txt",
                                                                              "r/x.stdout"]  # fmt: skip
    assert set(JOB_FILES) >= {"app.json", "exit", "cancel", "stalled"}
    (job / "mine.txt").unlink()
    for p in (job / "r").iterdir():
        p.unlink()
    assert host.remove(str(job), ["r"]) is False and not job.exists()  # nothing of tsm's: the empty dirs go


def test_a_role_named_like_an_option_is_removed_as_a_folder(tmp_path: Path) -> None:
    job = tmp_path / "job"
    (job / "-rf").mkdir(parents=True)
    (job / "-rf" / "0.stdout").write_text("x")
    (job / "app.json").write_text("{}")
    assert LocalHost(SlurmQueries(runner=no_slurm)).remove(str(job), ["-rf"]) is True
    assert not job.exists()


def test_sweeps_of_a_login_node_are_not_arrays(sched: SlurmScheduler) -> None:
    infos = [sched.submit_dryrun(AppDef("a", [Role("r", entrypoint="x")]), {"slurm_version": "22.05"})]
    assert sched.accepts_sweep(infos)
    infos[0].request.ssh = "login"
    assert not sched.accepts_sweep(infos)
