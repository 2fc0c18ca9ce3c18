"""The request: the sbatch script built at dry run, and that script run with bash against stand-ins for srun
and scontrol, which checks the wrapper's environment, macros and byte-exact arguments."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st
from slurm_util import HOSTILE, HOSTILE_ENV, directives, dryrun, two_role_app

import hostile
from testutil import GPU_LOST, GPUS_HEALTHY, MemoryCgroup, fake_nvidia_smi, memory_cgroup_unavailable
from tsm.errors import (
    InvalidAppError,
    InvalidRunOptionError,
)
from tsm.schedulers.common.quoting import shell_quote
from tsm.schedulers.slurm import (
    SlurmScheduler,
    cli as slurm_cli,
    parse_version,
    read_status,
)
from tsm.schedulers.slurm.describe import replica_status
from tsm.schedulers.slurm.jobdir import JobDir
from tsm.schedulers.slurm.parse import SlurmJob
from tsm.schedulers.slurm.script import REPLICA_WRAPPER
from tsm.specs.api import AppDef, Resource, Role

# -- the request ---------------------------------------------------------------------------------------


def test_one_het_component_per_role_and_one_srun_per_role(sched: SlurmScheduler) -> None:
    req = dryrun(sched, two_role_app())
    script = req.script
    assert script.startswith("#!/bin/bash\n")
    lines = directives(script)
    assert lines.count("#SBATCH hetjob") == 1
    comp0, comp1 = "\n".join(lines).split("#SBATCH hetjob")
    assert (
        "#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n#SBATCH --cpus-per-task=2\n#SBATCH --mem=1000M"
        in comp0
    )
    assert (
        "#SBATCH --nodes=1\n#SBATCH --ntasks-per-node=1\n#SBATCH --cpus-per-task=1\n#SBATCH --mem=500M"
        in comp1
    )
    assert "--job-name=hello.trainer" in comp0 and "--job-name=hello.ps" in comp1
    assert f"#SBATCH --chdir={req.job_dir}" in comp0 and "--chdir" not in comp1
    sruns = [line for line in script.splitlines() if line.startswith("srun ")]
    assert len(sruns) == 2
    assert sruns[0].startswith(
        "srun --het-group=0 --ntasks=2 --nodes=2 --ntasks-per-node=1 --cpus-per-task=2"
    )
    assert sruns[1].startswith("srun --het-group=1 --ntasks=1 ")
    assert all(line.endswith(" &") for line in sruns)
    assert "wait -n" in script
    assert req.roles == ["trainer", "ps"]
    assert json.loads(req.app_json)["app"]["name"] == "hello"


def test_dryrun_prints_the_script_exactly(sched: SlurmScheduler) -> None:
    info = sched.submit_dryrun(two_role_app(), {"slurm_version": "22.05"})
    assert str(info) == info.request.script
    assert info.scheduler == "slurm"


def test_script_is_valid_bash(sched: SlurmScheduler, tmp_path: Path) -> None:
    app = AppDef("h", [Role("r", entrypoint="echo", args=HOSTILE, env=HOSTILE_ENV)])
    req = dryrun(sched, app, {"comment": 'it\'s "x" #1 $(y)'})
    path = tmp_path / "job.sbatch"
    path.write_text(req.script, errors="surrogateescape")
    subprocess.run(["bash", "-n", str(path)], check=True)
    # sbatch reads directives up to the first command: no value of the app can add one
    head = req.script.split("\numask 077\n")[0]
    assert all(
        line.startswith(("#!", "#SBATCH --", "#SBATCH hetjob", "# ")) or not line
        for line in head.splitlines()
    )


def test_single_role_is_a_plain_job(sched: SlurmScheduler) -> None:
    req = dryrun(sched, AppDef("one", [Role("w", entrypoint="true", num_replicas=3)]))
    assert "hetjob" not in req.script
    assert "--het-group" not in req.script
    assert "srun --ntasks=3 --nodes=3 --ntasks-per-node=1 " in req.script


def test_pack_replicas_asks_for_tasks(sched: SlurmScheduler) -> None:
    app = AppDef(
        "p", [Role("w", entrypoint="true", num_replicas=4, resource=Resource(cpu=2, gpu=1, memMB=3000))]
    )
    req = dryrun(sched, app, {"pack_replicas": True})
    lines = directives(req.script)
    assert "#SBATCH --ntasks=4" in lines
    assert not any(x.startswith("#SBATCH --nodes") for x in lines)
    assert "#SBATCH --mem-per-cpu=1500M" in lines  # 3000 MB per replica over its 2 CPUs
    assert "#SBATCH --gpus-per-task=1" in lines  # per-node makes no sense when packed
    assert "srun --ntasks=4 --cpus-per-task=2 " in req.script


@pytest.mark.parametrize(
    ("version", "flag"),
    [("22.05", "--gpus-per-node"), ("23.02", "--gpus-per-task"), ("24.11", "--gpus-per-task")],
)
def test_gpu_option_follows_the_slurm_version(sched: SlurmScheduler, version: str, flag: str) -> None:
    app = AppDef(
        "g", [Role("w", entrypoint="true", num_replicas=2, resource=Resource(cpu=8, gpu=4, memMB=1000))]
    )
    assert f"#SBATCH {flag}=4" in directives(dryrun(sched, app, {"slurm_version": version}).script)


def test_version_is_asked_lazily_and_once(monkeypatch: pytest.MonkeyPatch, sched: SlurmScheduler) -> None:
    calls: list[list[str]] = []

    def fake_run(args: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        calls.append(args)
        return subprocess.CompletedProcess(args, 0, "slurm 23.11.4\n", "")

    monkeypatch.setattr(slurm_cli, "run", fake_run)
    monkeypatch.setattr(slurm_cli, "_version", None)
    sched.submit_dryrun(AppDef("c", [Role("w", entrypoint="true")]))
    assert calls == []  # no GPU: no need to know the version
    gpu_app = AppDef("g", [Role("w", entrypoint="true", resource=Resource(gpu=1))])
    for _ in range(3):
        script = sched.submit_dryrun(gpu_app).request.script
    assert calls == [["sbatch", "--version"]]
    assert "#SBATCH --gpus-per-task=1" in script


def test_parse_version() -> None:
    assert parse_version("slurm-wlm 22.05.8\n") == (22, 5)
    assert parse_version("slurm 24.11.0-0rc1") == (24, 11)
    with pytest.raises(Exception, match="version"):
        parse_version("what")


def test_run_options_become_quoted_directives(sched: SlurmScheduler) -> None:
    cfg = {
        "partition": "gpu",
        "time": "1:00:00",
        "account": "proj-1",
        "qos": "high",
        "constraint": "a100&ib",
        "reservation": "maint",
        "nodelist": "node[1-2]",
        "exclude": "node3",
        "exclusive": True,
        "comment": 'it\'s a "test" #1 $(whoami) `id`',
        "mail_user": "me@example.org",
        "mail_type": "END,FAIL",
        "requeue": False,
        "sbatch_args": ["--signal=USR1@60", "--nice=10"],
        "srun_args": ["--cpu-bind=cores"],
    }
    script = dryrun(sched, two_role_app(), cfg).script
    lines = directives(script)
    for comp in "\n".join(lines).split("#SBATCH hetjob"):  # every role gets the placement options
        for expected in ("--partition=gpu", "--time=1:00:00", "--account=proj-1", "--qos=high",
                         "--constraint='a100&ib'", "--reservation=maint", "--nodelist='node[1-2]'",
                         "--exclude=node3", "#SBATCH --exclusive"):  # fmt: skip
            assert expected in comp
    comment = next(x for x in lines if x.startswith("#SBATCH --comment="))
    assert shlex.split(comment.split("=", 1)[1]) == [cfg["comment"]]
    assert "#SBATCH --mail-user=me@example.org" in lines
    assert "#SBATCH --mail-type=END,FAIL" in lines
    assert "#SBATCH --no-requeue" in lines
    assert "#SBATCH --signal=USR1@60" in lines and "#SBATCH --nice=10" in lines
    assert all(line.count("--cpu-bind=cores") == 1 for line in script.splitlines() if line.startswith("srun"))


def test_every_option_has_help(sched: SlurmScheduler) -> None:
    opts = dict(sched.run_opts())
    for name in ("partition", "time", "account", "qos", "constraint", "comment", "mail_user", "mail_type",
                 "exclusive", "job_dir", "pack_replicas", "requeue", "nodelist", "exclude"):  # fmt: skip
        assert opts[name].help


def test_options_are_typed_once_at_dry_run(sched: SlurmScheduler) -> None:
    """The command line's strings become SlurmOptions' types in one place (runopts.resolve)."""
    from tsm.schedulers.slurm import SlurmOptions
    from tsm.schedulers.slurm.ssh_host import SshOptions

    assert [name for name, _ in sched.run_opts()] == [
        name for name, _ in [*SlurmOptions.runopts(), *SshOptions.runopts()]
    ]
    cfg = {
        "kill_grace": "7",
        "exclusive": "yes",
        "srun_args": "--cpu-bind=cores,--mpi=none",
        "requeue": "false",
    }
    info = sched.submit_dryrun(two_role_app(), {"slurm_version": "22.05", **cfg})
    opts = SlurmOptions.from_cfg(info.cfg)
    assert (opts.kill_grace, opts.exclusive, opts.srun_args, opts.requeue) == (
        7,
        True,
        ["--cpu-bind=cores", "--mpi=none"],
        False,
    )
    assert opts.version == (22, 5)
    assert "export TSM_KILL_GRACE=7" in info.request.script and "#SBATCH --no-requeue" in info.request.script
    for bad, match in (({"kill_grace": "-1"}, "kill_grace must be >= 0"), ({"kill_grace": "soon"}, "expects int"),
                       ({"slurm_version": "latest"}, "not a Slurm version such as"),
                       ({"sbatch_args": ["nice=10"]}, "must be an option")):  # fmt: skip
        with pytest.raises(InvalidRunOptionError, match=match):
            sched.submit_dryrun(two_role_app(), bad)


def test_retries_make_the_job_requeueable(sched: SlurmScheduler) -> None:
    script = dryrun(sched, two_role_app(max_retries=2)).script
    assert "#SBATCH --requeue" in directives(script)
    assert "_tsm_retries[0]=2" in script and "_tsm_retries[1]=0" in script
    assert 'scontrol requeue "$SLURM_JOB_ID"' in script


def test_capabilities_choose_a_role_partition(sched: SlurmScheduler) -> None:
    app = two_role_app()
    app.roles[1].resource.capabilities["partition"] = "cpu"
    comps = "\n".join(directives(dryrun(sched, app, {"partition": "gpu"}).script)).split("#SBATCH hetjob")
    assert "--partition=gpu" in comps[0] and "--partition=cpu" in comps[1]


@pytest.mark.parametrize("bad", ["a\\b", "line\nbreak", "cr\r"])
def test_values_sbatch_cannot_read_are_refused(sched: SlurmScheduler, bad: str) -> None:
    with pytest.raises(InvalidRunOptionError):
        dryrun(sched, two_role_app(), {"comment": bad})


def test_bad_job_dir_and_mounts_are_refused(sched: SlurmScheduler, caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(InvalidRunOptionError, match="job_dir"):
        dryrun(sched, two_role_app(), {"job_dir": "/tmp/a%jb"})
    app = two_role_app()
    app.roles[0].mounts = ["type=bind,src=/a,dst=/b"]
    with pytest.raises(InvalidAppError, match="mounts"):
        dryrun(sched, app)
    # an unknown option is reported and ignored (TorchX's behaviour; tsm.specs.runopts), never passed on
    req = dryrun(sched, two_role_app(), {"no_such_option": 1})
    assert "no_such_option" in caplog.text and "no_such_option" not in req.script


def test_default_job_dir_is_under_tsm_home(sched: SlurmScheduler, tsm_home: Path) -> None:
    req = dryrun(sched, two_role_app())
    assert Path(req.job_dir).parent == tsm_home / "slurm" / "jobs"
    assert Path(req.job_dir).name.startswith("hello-")
    assert not Path(req.job_dir).exists()  # a dry run makes nothing


def test_image_directory_is_the_working_directory(sched: SlurmScheduler, tmp_path: Path) -> None:
    app = AppDef("i", [Role("w", entrypoint="${img_root}/run.sh", image=str(tmp_path))])
    script = dryrun(sched, app).script
    assert f"--chdir={tmp_path} " in script
    assert shlex.quote(f"{tmp_path}/run.sh") in script


def test_hostile_values_are_single_words_in_the_script(sched: SlurmScheduler) -> None:
    app = AppDef("h", [Role("r", entrypoint="printf", args=["%s\\n", *HOSTILE], env=HOSTILE_ENV)])
    script = dryrun(sched, app).script
    m = re.search(r"^srun (.*?) &\n_tsm_pid", script, re.S | re.M)
    assert m is not None
    assert "\r\n" not in script  # sbatch refuses scripts with DOS line breaks
    words = bash_words(m.group(1))
    assert words[-len(HOSTILE) :] == HOSTILE
    pairs = [f"{k}={v}" for k, v in HOSTILE_ENV.items()]
    start = words.index(pairs[0])
    assert words[start : start + len(pairs)] == pairs


def bash_words(words: str) -> list[str]:
    """The words bash makes of ``words`` (as they would reach a command), without running any of them."""
    script = f"set -- {words}\nprintf '%s\\0' \"$@\"\n".encode("utf-8", "surrogateescape")
    proc = subprocess.run(
        ["bash"], input=script, capture_output=True, check=True
    )  # on stdin: may exceed 128 KiB
    return [w.decode("utf-8", "surrogateescape") for w in proc.stdout.split(b"\0")[:-1]]


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00")))
def test_shell_quote_round_trips_through_bash(value: str) -> None:
    assert bash_words(shell_quote(value)) == [value]


def test_shell_quote_avoids_carriage_returns() -> None:
    for value in ("\r", "a\r\nb", "it's\r", "\\\r'\x01é"):
        quoted = shell_quote(value)
        assert "\r" not in quoted
        assert bash_words(quoted) == [value]


# -- running the script against stand-ins for srun and scontrol --------------------------------------------

FAKE_SRUN = """\
import os, subprocess, sys
args = sys.argv[1:]
opts = {}
while args and args[0].startswith("-"):
    key, _, value = args.pop(0).partition("=")
    opts[key] = value
procs = []
for t in range(int(opts.get("--ntasks", "1"))):
    env = dict(os.environ, SLURM_PROCID=str(t), SLURMD_NODENAME="fake%d" % t)
    out = open(opts["--output"].replace("%t", str(t)), "ab")
    err = open(opts["--error"].replace("%t", str(t)), "ab")
    procs.append(subprocess.Popen(args, cwd=opts.get("--chdir"), stdout=out, stderr=err, env=env))
sys.exit(max(p.wait() for p in procs))
"""

FAKE_SCONTROL = """\
import sys
if sys.argv[1:3] == ["show", "hostnames"]:
    print("localhost")
"""


@pytest.fixture
def fake_cluster(tmp_path: Path) -> dict[str, str]:
    """PATH and env under which a batch script runs on this machine, its sruns run as local processes."""
    bindir = tmp_path / "fakebin"
    bindir.mkdir()
    for name, body in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL), ("scancel", "")):
        path = bindir / name
        path.write_text(f"#!{sys.executable}\n{body}")
        path.chmod(0o755)
    env = dict(os.environ)
    env.update(PATH=f"{bindir}:{env['PATH']}", SLURM_JOB_ID="4242", SLURM_JOB_NODELIST="fake0")
    env.pop("SLURM_RESTART_COUNT", None)
    return env


def run_locally(
    sched: SlurmScheduler, app: AppDef, env: dict[str, str], tmp_path: Path
) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """Run the app's batch script with bash, as the batch step would; returns its job dir and the run."""
    req = dryrun(sched, app, {"job_dir": str(tmp_path / "job")})
    job_dir = Path(req.job_dir)
    job_dir.mkdir()
    (job_dir / "job.sbatch").write_text(req.script, errors="surrogateescape")
    proc = subprocess.run(
        ["bash", str(job_dir / "job.sbatch")], env=env, capture_output=True, text=True, timeout=60
    )
    assert (job_dir / "exit").read_text().strip() == str(proc.returncode), proc.stderr
    return job_dir, proc


def test_hostile_arguments_and_env_reach_the_replica_byte_exact(
    sched: SlurmScheduler, fake_cluster: dict[str, str], tmp_path: Path
) -> None:
    marker = tmp_path / "pwned"
    args, env = hostile.args(str(marker)), hostile.env(str(marker))
    app = AppDef("h", [Role("r", entrypoint=sys.executable, args=["-c", hostile.DUMP, *args], env=env)])
    job_dir, _ = run_locally(sched, app, fake_cluster, tmp_path)
    got_args, got_env = hostile.read_dump((job_dir / "r" / "0.stdout").read_text(errors="surrogateescape"))
    assert not hostile.mismatches(got_args, got_env, args, env)
    # env(1) read "--unset=PATH" as a variable; the interpreter's directory comes first (see test_python_*)
    assert got_env.get(b"PATH") == os.fsencode(f"{os.path.dirname(sys.executable)}:{fake_cluster['PATH']}")
    assert (job_dir / "r" / "0.stderr").read_text() == ""
    assert not marker.exists()


def test_replica_env_and_runtime_macros(
    sched: SlurmScheduler, fake_cluster: dict[str, str], tmp_path: Path
) -> None:
    dump = "import json, os, sys; sys.stdout.write(json.dumps([sys.argv[1:], {k: v for k, v in os.environ.items() if k.startswith(('TSM_', 'E_', 'odd'))}]))"
    env = {
        "E_PLAIN": "v",
        "E_MACRO": "r${replica_id}-a${app_id}",
        "E_HOSTILE": "$(id) `id` ' \" \n;",
        "odd.name": "x=y",
    }
    app = AppDef("m", [
        Role("w", entrypoint=sys.executable, args=["-c", dump, "${replica_id}", "${app_id}", "$${rank0_env}", "${HOME}"],
             env=env, num_replicas=2),
        Role("v", entrypoint="true"),
    ])  # fmt: skip
    job_dir, _ = run_locally(sched, app, fake_cluster, tmp_path)
    for k in range(2):
        args, got = json.loads((job_dir / "w" / f"{k}.stdout").read_text())
        assert args == [str(k), "4242", "$TSM_RANK0_HOST", "${HOME}"]
        assert got == {
            "TSM_REPLICA_ID": str(k),
            "TSM_ROLE_NAME": "w",
            "TSM_NUM_REPLICAS": "2",
            "TSM_APP_ID": "4242",
            "TSM_RANK0_HOST": "localhost",
            "TSM_JOB_DIR": str(job_dir),
            "TSM_KILL_GRACE": "30",
            "TSM_ATTEMPT": "0",  # long runs: the first attempt, no restart before it
            "TSM_RESTART_COUNT": "0",
            "TSM_LAST_EXIT": "",
            "E_PLAIN": "v",
            "E_MACRO": f"r{k}-a4242",
            "E_HOSTILE": env["E_HOSTILE"],
            "odd.name": "x=y",
            "TSM_HOME": os.environ["TSM_HOME"],  # the submitter's environment travels with the job
            "TSM_PYTHON_BIN": os.path.dirname(sys.executable),  # the interpreter rule (test_python_*)
            # and whatever else of tsm's own the submitter had set (the test home's launcher setting)
            **{k: v for k, v in os.environ.items() if k.startswith(("TSM_LAUNCHER", "TSM_KEEPER", "TSM_CLI_SERVER"))},
        }
        f = read_status(job_dir / "w" / f"{k}.status")
        assert (
            f is not None and not f.running and f.exit_code == 0 and f.host == f"fake{k}" and f.attempt == 0
        )
    assert (job_dir / "exit").read_text() == "0\n"


def test_a_failed_replica_fails_the_job_with_its_code(
    sched: SlurmScheduler, fake_cluster: dict[str, str], tmp_path: Path
) -> None:
    app = AppDef(
        "f", [Role("w", entrypoint="bash", args=["-c", "exit $((TSM_REPLICA_ID * 7))"], num_replicas=2)]
    )
    job_dir, proc = run_locally(sched, app, fake_cluster, tmp_path)
    assert (job_dir / "exit").read_text() == "7\n"
    assert read_status(job_dir / "w" / "1.status").exit_code == 7  # type: ignore[union-attr]
    assert read_status(job_dir / "w" / "0.status").exit_code == 0  # type: ignore[union-attr]
    assert "tsm: role w failed (srun exit code 7)" in proc.stderr


# -- the replicas' wrapper tells the node's OOM killer from other ends (issue 25) ---------------------------
HOG = "b = [bytearray(16 << 20) for _ in range(128)]"  # 2 GiB, touched: far past the group's limit


def run_wrapper(tmp_path: Path, code: str, cgroup: MemoryCgroup | None = None,
                extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run one task as srun would (the wrapper, replica 0 of role r on node7), inside ``cgroup`` if given."""
    (tmp_path / "r").mkdir(exist_ok=True)
    env = {**os.environ, "TSM_JOB_DIR": str(tmp_path), "SLURMD_NODENAME": "node7", "SLURM_PROCID": "0",
           **(extra_env or {})}  # fmt: skip
    return subprocess.run(
        ["bash", "-c", REPLICA_WRAPPER, "tsm-replica", "r", "1", "0", sys.executable, "-c", code],
        env=env, capture_output=True, text=True, timeout=120,
        preexec_fn=(lambda: cgroup.add(os.getpid())) if cgroup is not None else None,  # noqa: PLW1509
    )  # fmt: skip


@pytest.mark.skipif(memory_cgroup_unavailable() is not None, reason=str(memory_cgroup_unavailable()))
def test_wrapper_records_a_replica_the_nodes_oom_killer_ended(tmp_path: Path) -> None:
    # a real OOM kill: the task runs in a memory cgroup standing for a node whose memory is shared
    node = MemoryCgroup(f"tsm-test-node-{os.getpid()}", 128 << 20)
    try:
        proc = run_wrapper(tmp_path, HOG, node)
    finally:
        node.close()
    assert proc.returncode == 137, proc.stderr
    line = "node7 OOM (the kernel's OOM killer ended r/0)"
    assert (tmp_path / "oom_nodes").read_text() == line + "\n"
    assert "tsm: r/0 was killed by the kernel's OOM killer on node7; later attempts avoid it" in proc.stderr
    (tmp_path / "excluded").write_text(line + "\n")  # as the batch script copies it at the restart
    assert JobDir(tmp_path).excluded() == [line]
    assert (tmp_path / "r" / "0.status").read_text().startswith("exited 137 ")


def test_wrapper_records_no_oom_for_other_sigkills_and_failures(tmp_path: Path) -> None:
    proc = run_wrapper(tmp_path, "import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    assert proc.returncode == 137
    proc = run_wrapper(tmp_path, "raise SystemExit(3)")
    assert proc.returncode == 3
    assert not (tmp_path / "oom_nodes").exists()
    assert "OOM" not in proc.stderr


@pytest.mark.parametrize(("mark", "recorded"), [("0", "TERM"), ("1", "-"), (None, "-")])
def test_a_task_that_died_of_the_stop_of_every_task_is_recorded_as_stopped(
    tmp_path: Path, mark: str | None, recorded: str
) -> None:
    """When a role fails, the batch shell marks the attempt as stopping, then sends SIGTERM to every task's
    processes one at a time: a program may die of it before its wrapper gets its own, and is recorded as
    stopped by it, not as failing with exit code 143. Without the mark of its own attempt (none, or an earlier
    attempt's), a signal exit is the program's own."""
    if mark is not None:
        (tmp_path / "stopping").write_text(mark + "\n")
    proc = run_wrapper(tmp_path, "import os, signal; os.kill(os.getpid(), signal.SIGTERM)")
    assert proc.returncode == 143, proc.stderr
    status = read_status(tmp_path / "r" / "0.status")
    assert status is not None and (status.exit_code, status.signal or "-") == (143, recorded)


# -- a task that failed with a GPU fault on its node keeps later attempts off the node (issue 25) -------------

def _gpu_task(tmp_path: Path, code: str, after: str, after_code: int, gpus: str = "0,1"
              ) -> subprocess.CompletedProcess[str]:
    fake = fake_nvidia_smi(tmp_path / "fakebin", after, after_code)
    env = {"PATH": f"{fake}{os.pathsep}{os.environ['PATH']}", "SLURM_STEP_GPUS": gpus}
    return run_wrapper(tmp_path, code, extra_env=env)


@pytest.mark.parametrize(("after", "after_code", "why"), [
    (GPU_LOST + "\n", 15, "nvidia-smi: " + GPU_LOST),
    ("00000000:3B:00.0, 2\n00000000:86:00.0, [N/A]\n", 0, "uncorrectable ECC errors rose from 0 to 2"),
])  # fmt: skip
def test_wrapper_records_a_failure_with_a_gpu_fault_on_the_node(
    tmp_path: Path, after: str, after_code: int, why: str
) -> None:
    proc = _gpu_task(tmp_path, "raise SystemExit(3)", after, after_code)
    assert proc.returncode == 3, proc.stderr
    line = f"node7 GPU (r/0: {why})"
    assert (tmp_path / "oom_nodes").read_text() == line + "\n"
    assert JobDir(tmp_path).excluded("oom_nodes") == [line]  # the restart keeps the app off node7
    assert f"tsm: r/0 failed with a GPU fault on node7 ({why}); later attempts avoid it" in proc.stderr
    rec = SlurmJob("5", "5", 0, "app", ["FAILED"], nodes="node7", num_tasks=1)
    rs = replica_status(Role("r", entrypoint="x"), 0, rec, ["node7"], JobDir(tmp_path), 0)
    assert rs.error_msg == f"exited with code 3: a GPU fault on node7: {why} (later attempts avoid it)"


@pytest.mark.parametrize(("code", "gpus", "after", "after_code"), [
    ("pass", "0", GPU_LOST + "\n", 15),  # it succeeded: whatever the GPUs say now, nothing is blamed
    ("raise SystemExit(3)", "0", GPUS_HEALTHY, 0),  # healthy GPUs
    ("raise SystemExit(3)", "", GPU_LOST + "\n", 15),  # no GPU of Slurm's for this task: nvidia-smi not asked
    ("raise SystemExit(3)", "0", "Failed to initialize NVML: Driver/library version mismatch\n", 18),  # no verdict
])  # fmt: skip
def test_wrapper_blames_no_gpu_otherwise(tmp_path: Path, code: str, gpus: str, after: str, after_code: int) -> None:
    proc = _gpu_task(tmp_path, code, after, after_code, gpus)
    assert proc.returncode == (0 if code == "pass" else 3), proc.stderr
    assert not (tmp_path / "oom_nodes").exists()
    assert "GPU" not in proc.stderr
    assert (tmp_path / "fakebin" / "asked").exists() == (gpus != "")


@pytest.mark.skipif(shutil.which("nvidia-smi") is None, reason="needs a GPU node: this machine has no nvidia-smi")
def test_wrapper_blames_no_healthy_real_gpu(tmp_path: Path) -> None:
    # on a machine with real GPUs: the real nvidia-smi's answers are read as healthy, a failure blames nothing
    proc = run_wrapper(tmp_path, "raise SystemExit(3)", extra_env={"SLURM_STEP_GPUS": "0"})
    assert proc.returncode == 3, proc.stderr
    assert not (tmp_path / "oom_nodes").exists(), (tmp_path / "oom_nodes").read_text()


# -- the warning reaches the processes of a task that handle it, never a launcher without a handler ----------
WARNED_UNDER_SH = (
    "import signal, sys, time\n"
    "warned = []\n"
    "signal.signal(signal.SIGUSR1, lambda *_: warned.append(1))\n"
    "print('ready', flush=True)\n"
    "while not warned:\n"
    "    time.sleep(0.05)\n"
    "time.sleep(0.5)  # a second warning would come meanwhile\n"
    "print('warned', len(warned), flush=True)\n"
)


def _processes_with(marker: str) -> list[int]:
    """Live processes whose environment holds ``marker`` (what a task of the test left behind)."""
    found = []
    for p in os.listdir("/proc"):
        if p.isdigit():
            with contextlib.suppress(OSError):
                if marker.encode() in Path(f"/proc/{p}/environ").read_bytes().split(b"\0"):
                    found.append(int(p))
    return found


@pytest.mark.parametrize("relay", ["URG", "WINCH"])
def test_the_warning_reaches_the_program_under_a_launcher_and_spares_the_launcher(tmp_path: Path, relay: str) -> None:
    # Slurm's `scancel --signal` reaches every process of the task: here the whole process group of a task
    # run as srun would (the wrapper, `sh -c` over python, the wrapper's helper) gets the relay signal
    (tmp_path / "r").mkdir()
    marker = f"TSM_JOB_DIR={tmp_path}"
    env = {**os.environ, "TSM_JOB_DIR": str(tmp_path), "SLURMD_NODENAME": "node7", "SLURM_PROCID": "0",
           "TSM_WARN_SIGNAL": "USR1", "TSM_WARN_RELAY": relay}  # fmt: skip
    launcher = f"{shlex.quote(sys.executable)} -c {shlex.quote(WARNED_UNDER_SH)}; echo launcher $?"
    proc = subprocess.Popen(["bash", "-c", REPLICA_WRAPPER, "tsm-replica", "r", "1", "0", "sh", "-c", launcher],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        os.killpg(proc.pid, getattr(__import__("signal"), f"SIG{relay}"))
        out, err = proc.communicate(timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 9)
    assert (out, proc.returncode) == ("warned 1\nlauncher 0\n", 0), err  # once; sh survived and went on
    assert (tmp_path / "r" / "0.status").read_text().startswith("exited 0 ")
    assert _processes_with(marker) == []  # the wrapper's helper and its sleep are gone with the task


CHILDREN_OF_PARENT = """\
import os
def parent_of(p):
    try:
        with open(f"/proc/{p}/stat") as f:
            return f.read().split(") ")[1].split()[1]
    except OSError:  # ended meanwhile: not a child of anything any more
        return None
print(sorted(int(p) for p in os.listdir("/proc") if p.isdigit() and parent_of(p) == str(os.getppid())))
"""


def test_the_wrapper_starts_no_helper_without_a_warning(tmp_path: Path) -> None:
    proc = run_wrapper(tmp_path, CHILDREN_OF_PARENT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() != "" and len(json.loads(proc.stdout)) == 1, proc.stdout  # only this python


def test_a_replica_the_nodes_oom_killer_ended_says_so(tmp_path: Path) -> None:
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "0.status").write_text("exited 137 1700000000 0 - node7\n")
    (tmp_path / "r" / "1.status").write_text("exited 137 1700000000 0 - node8\n")  # SIGKILLed, not by the OOM killer
    (tmp_path / "oom_nodes").write_text("node7 OOM (the kernel's OOM killer ended r/0)\n")
    rec = SlurmJob("5", "5", 0, "app", ["FAILED"], nodes="node[7-8]", num_tasks=2)
    role = Role("r", entrypoint="x", num_replicas=2)
    r0, r1 = (replica_status(role, k, rec, ["node7", "node8"], JobDir(tmp_path), 0) for k in (0, 1))
    assert r0.error_msg == "exited with code 137: killed by the kernel's OOM killer on node7 (later attempts avoid it)"
    assert r1.error_msg == "exited with code 137"


@pytest.mark.skipif(memory_cgroup_unavailable() is not None, reason=str(memory_cgroup_unavailable()))
def test_wrapper_blames_no_node_when_the_jobs_own_memory_limit_was_hit(tmp_path: Path) -> None:
    # Slurm's own cgroup of the job (a ``job_<id>`` path) holds the limit: the kernel's kill is the program
    # outgrowing its --mem, not the node's memory: no node is recorded
    parent = f"tsm-test-slurm-{os.getpid()}"
    job = MemoryCgroup(f"{parent}/job_7", 128 << 20)
    try:
        proc = run_wrapper(tmp_path, HOG, job)
    finally:
        job.close()
        with contextlib.suppress(OSError):
            os.rmdir(os.path.join(job.root, parent))
    assert proc.returncode == 137, proc.stderr
    assert not (tmp_path / "oom_nodes").exists()
    assert "OOM" not in proc.stderr


def test_after_conditions_become_one_dependency_that_kills_the_job_when_it_can_never_be_met() -> None:
    from tsm.schedulers.slurm.script import dependency_args

    assert dependency_args([("12", "ok"), ("13_2", "ok"), ("14", "fail"), ("15", "any")]) == [
        "--dependency=afterok:12:13_2,afternotok:14,afterany:15", "--kill-on-invalid-dep=yes"]
