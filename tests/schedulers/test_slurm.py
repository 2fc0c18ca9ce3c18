"""Unit tests of the Slurm scheduler: the sbatch script, the squeue/sacct parsing, the status batcher, logs.

No cluster is needed. The JSON under ``data/`` was captured from the real Slurm 22.05 cluster that
``scripts/slurm-up`` starts (``data/capture_slurm_data.py`` regenerates it, text columns included); the newer Slurm format
(``job_state`` as a list, numbers as ``{"set", "number"}``) is derived from that capture by
:func:`_to_newer_format`. The generated batch script is also *run*, with bash, against small stand-ins
for ``srun``/``scontrol``, which checks the wrapper's environment, macros and byte-exact arguments.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import textwrap
import threading
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st

import hostile
from tsm.errors import (
    InvalidAppError,
    InvalidRunOptionError,
    SchedulerUnavailableError,
    SubmissionError,
    UnknownAppError,
)
from tsm.schedulers.api import Stream
from tsm.schedulers.common.quoting import shell_quote
from tsm.schedulers.slurm import (
    SlurmBatchRequest,
    SlurmQueries,
    SlurmScheduler,
    cli as slurm_cli,
    expand_hostlist,
    parse_sacct_json,
    parse_sacct_text,
    parse_squeue_json,
    parse_squeue_text,
    parse_version,
    read_status,
    slurm_state,
)
from tsm.schedulers.slurm.scheduler import _index_dir
from tsm.specs.api import AppDef, AppState, Resource, Role

DATA = Path(__file__).parent / "data"
JOBS = json.loads((DATA / "jobs_22.05.json").read_text())["apps"]

#: Arguments and env values a replica must receive exactly as given: the shared corpus (tests/hostile.py).
HOSTILE = hostile.args()
HOSTILE_ENV = hostile.env()


def two_role_app(**trainer: Any) -> AppDef:
    return AppDef(
        "hello",
        roles=[
            Role("trainer", entrypoint="python", args=["train.py", "--lr", "0.1"], num_replicas=2,
                 resource=Resource(cpu=2, memMB=1000), **trainer),
            Role("ps", entrypoint="echo", args=["ps"], num_replicas=1, resource=Resource(cpu=1, memMB=500)),
        ],
    )  # fmt: skip


@pytest.fixture
def sched() -> SlurmScheduler:
    return SlurmScheduler("test", queries_=SlurmQueries(runner=_no_slurm))


def _no_slurm(args: list[str]) -> subprocess.CompletedProcess[str]:
    raise AssertionError(f"unexpected Slurm command {args}")


def dryrun(s: SlurmScheduler, app: AppDef, cfg: dict[str, Any] | None = None) -> SlurmBatchRequest:
    cfg = {"slurm_version": "22.05", **(cfg or {})}
    req = s.submit_dryrun(app, cfg).request
    assert isinstance(req, SlurmBatchRequest)
    return req


def directives(script: str) -> list[str]:
    return [line for line in script.splitlines() if line.startswith("#SBATCH")]


# -- the request ---------------------------------------------------------------------------------------


def test_one_het_component_per_role_and_one_srun_per_role(sched: SlurmScheduler) -> None:
    req = dryrun(sched, two_role_app())
    script = req.script
    assert script.startswith("#!/bin/bash\n")
    lines = directives(script)
    assert lines.count("#SBATCH hetjob") == 1
    comp0, comp1 = "\n".join(lines).split("#SBATCH hetjob")
    assert "#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n#SBATCH --cpus-per-task=2\n#SBATCH --mem=1000M" in comp0
    assert "#SBATCH --nodes=1\n#SBATCH --ntasks-per-node=1\n#SBATCH --cpus-per-task=1\n#SBATCH --mem=500M" in comp1
    assert "--job-name=hello.trainer" in comp0 and "--job-name=hello.ps" in comp1
    assert f"#SBATCH --chdir={req.job_dir}" in comp0 and "--chdir" not in comp1
    sruns = [line for line in script.splitlines() if line.startswith("srun ")]
    assert len(sruns) == 2
    assert sruns[0].startswith("srun --het-group=0 --ntasks=2 --nodes=2 --ntasks-per-node=1 --cpus-per-task=2")
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
    req = dryrun(sched, app, {"comment": "it's \"x\" #1 $(y)"})
    path = tmp_path / "job.sbatch"
    path.write_text(req.script, errors="surrogateescape")
    subprocess.run(["bash", "-n", str(path)], check=True)
    # sbatch reads directives up to the first command: no value of the app can add one
    head = req.script.split("\numask 077\n")[0]
    assert all(line.startswith(("#!", "#SBATCH --", "#SBATCH hetjob", "# ")) or not line for line in head.splitlines())


def test_single_role_is_a_plain_job(sched: SlurmScheduler) -> None:
    req = dryrun(sched, AppDef("one", [Role("w", entrypoint="true", num_replicas=3)]))
    assert "hetjob" not in req.script
    assert "--het-group" not in req.script
    assert "srun --ntasks=3 --nodes=3 --ntasks-per-node=1 " in req.script


def test_pack_replicas_asks_for_tasks(sched: SlurmScheduler) -> None:
    app = AppDef("p", [Role("w", entrypoint="true", num_replicas=4, resource=Resource(cpu=2, gpu=1, memMB=3000))])
    req = dryrun(sched, app, {"pack_replicas": True})
    lines = directives(req.script)
    assert "#SBATCH --ntasks=4" in lines
    assert not any(x.startswith("#SBATCH --nodes") for x in lines)
    assert "#SBATCH --mem-per-cpu=1500M" in lines  # 3000 MB per replica over its 2 CPUs
    assert "#SBATCH --gpus-per-task=1" in lines  # per-node makes no sense when packed
    assert "srun --ntasks=4 --cpus-per-task=2 " in req.script


@pytest.mark.parametrize(("version", "flag"), [("22.05", "--gpus-per-node"), ("23.02", "--gpus-per-task"), ("24.11", "--gpus-per-task")])
def test_gpu_option_follows_the_slurm_version(sched: SlurmScheduler, version: str, flag: str) -> None:
    app = AppDef("g", [Role("w", entrypoint="true", num_replicas=2, resource=Resource(cpu=8, gpu=4, memMB=1000))])
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
        "comment": "it's a \"test\" #1 $(whoami) `id`",
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
    proc = subprocess.run(["bash"], input=script, capture_output=True, check=True)  # on stdin: may exceed 128 KiB
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
    proc = subprocess.run(["bash", str(job_dir / "job.sbatch")], env=env, capture_output=True, text=True, timeout=60)
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
    assert got_env.get(b"PATH") == os.fsencode(fake_cluster["PATH"])  # env(1) read "--unset=PATH" as a variable
    assert (job_dir / "r" / "0.stderr").read_text() == ""
    assert not marker.exists()


def test_replica_env_and_runtime_macros(sched: SlurmScheduler, fake_cluster: dict[str, str], tmp_path: Path) -> None:
    dump = "import json, os, sys; sys.stdout.write(json.dumps([sys.argv[1:], {k: v for k, v in os.environ.items() if k.startswith(('TSM_', 'E_', 'odd'))}]))"
    env = {"E_PLAIN": "v", "E_MACRO": "r${replica_id}-a${app_id}", "E_HOSTILE": "$(id) `id` ' \" \n;", "odd.name": "x=y"}
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
            "E_PLAIN": "v",
            "E_MACRO": f"r{k}-a4242",
            "E_HOSTILE": env["E_HOSTILE"],
            "odd.name": "x=y",
            "TSM_HOME": os.environ["TSM_HOME"],  # the submitter's environment travels with the job
        }
        f = read_status(job_dir / "w" / f"{k}.status")
        assert f is not None and not f.running and f.exit_code == 0 and f.host == f"fake{k}" and f.attempt == 0
    assert (job_dir / "exit").read_text() == "0\n"


def test_a_failed_replica_fails_the_job_with_its_code(
    sched: SlurmScheduler, fake_cluster: dict[str, str], tmp_path: Path
) -> None:
    app = AppDef("f", [Role("w", entrypoint="bash", args=["-c", "exit $((TSM_REPLICA_ID * 7))"], num_replicas=2)])
    job_dir, proc = run_locally(sched, app, fake_cluster, tmp_path)
    assert (job_dir / "exit").read_text() == "7\n"
    assert read_status(job_dir / "w" / "1.status").exit_code == 7  # type: ignore[union-attr]
    assert read_status(job_dir / "w" / "0.status").exit_code == 0  # type: ignore[union-attr]
    assert "tsm: role w failed (srun exit code 7)" in proc.stderr


# -- parsing -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("names", "state"),
    [
        ("PENDING", AppState.PENDING),
        ("REQUEUED", AppState.PENDING),
        ("SUSPENDED", AppState.PENDING),
        ("CONFIGURING", AppState.PENDING),
        ("RUNNING", AppState.RUNNING),
        ("COMPLETING", AppState.RUNNING),
        ("COMPLETED", AppState.SUCCEEDED),
        ("FAILED", AppState.FAILED),
        ("CANCELLED", AppState.CANCELLED),
        ("CANCELLED by 0", AppState.CANCELLED),
        ("TIMEOUT", AppState.FAILED),
        ("PREEMPTED", AppState.FAILED),
        ("NODE_FAIL", AppState.FAILED),
        ("OUT_OF_MEMORY", AppState.FAILED),
        ("BOOT_FAIL", AppState.FAILED),
        ("DEADLINE", AppState.FAILED),
        ("WHATEVER", AppState.UNKNOWN),
        (["RUNNING"], AppState.RUNNING),
        (["COMPLETED", "COMPLETING"], AppState.RUNNING),
        (["PENDING", "REQUEUED"], AppState.PENDING),
        (["FAILED", "REQUEUED"], AppState.PENDING),
        (["CANCELLED"], AppState.CANCELLED),
        ([], AppState.UNKNOWN),
    ],
)
def test_state_mapping(names: Any, state: AppState) -> None:
    assert slurm_state(names) == state


def _to_newer_format(obj: Any, key: str = "") -> Any:
    """The 22.05 capture as Slurm 23.02+ writes it: state lists and ``{"set", "infinite", "number"}`` numbers."""
    if isinstance(obj, dict):
        return {k: _to_newer_format(v, k) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_to_newer_format(v) for v in obj]
    if key == "job_state" and isinstance(obj, str):
        return [obj]
    if key == "current" and isinstance(obj, str):
        return [obj]
    if isinstance(obj, int) and not isinstance(obj, bool) and key in {
        "job_id", "het_job_id", "het_job_offset", "restart_cnt", "submit_time", "start_time", "end_time", "tasks",
        "job_offset", "submission", "start", "end", "return_code",
    }:  # fmt: skip
        return {"set": True, "infinite": False, "number": obj}
    if key == "exit_code" and isinstance(obj, int):  # newer squeue: a structured exit code
        return {"status": ["SIGNALED"] if obj & 0x7F else ["SUCCESS" if obj == 0 else "FAILED"],
                "return_code": {"set": True, "number": (obj >> 8) & 0xFF},
                "signal": {"id": {"set": True, "number": obj & 0x7F}, "name": ""}}  # fmt: skip
    return obj


SQUEUE_EXPECTED = {
    "completed": (AppState.SUCCEEDED, ["ok.trainer", "ok.ps"], "node[1-2]"),
    "failed": (AppState.FAILED, ["bad.trainer", "bad.ps"], "node[1-2]"),
    "requeued": (AppState.PENDING, ["retry.w"], ""),
    "timeout": (AppState.RUNNING, ["slow.w"], "node4"),
    "cancelled": (AppState.CANCELLED, ["stop.w"], "node[1-2]"),
    "running": (AppState.RUNNING, ["busy.trainer", "busy.ps"], "node[1-2]"),
    "pending": (AppState.PENDING, ["big.w"], ""),
}


@pytest.mark.parametrize("newer", [False, True], ids=["22.05", "newer"])
def test_parse_squeue(newer: bool) -> None:
    text = (DATA / "squeue_22.05.json").read_text()
    if newer:
        text = json.dumps(_to_newer_format(json.loads(text)))
    jobs = parse_squeue_json(text)
    for case, (state, names, nodes) in SQUEUE_EXPECTED.items():
        recs = jobs[JOBS[case]]
        assert [r.name for r in recs] == names, case
        assert [r.offset for r in recs] == list(range(len(names)))
        assert recs[0].state == state, case
        assert recs[0].nodes == nodes
    failed = jobs[JOBS["failed"]][0]
    assert (failed.exit_code, failed.reason) == (143, "NonZeroExitCode")
    assert jobs[JOBS["cancelled"]][0].signal == 15
    assert jobs[JOBS["requeued"]][0].restarts == 1
    assert jobs[JOBS["requeued"]][0].reason == "BeginTime"
    assert jobs[JOBS["pending"]][0].reason == "Resources"
    assert jobs[JOBS["running"]][1].job_id == str(int(JOBS["running"]) + 1)  # component ids follow the leader's
    assert jobs[JOBS["running"]][0].work_dir.endswith("/slurm/jobs/" + jobs[JOBS["running"]][0].work_dir.rsplit("/", 1)[1])


@pytest.mark.parametrize("newer", [False, True], ids=["22.05", "newer"])
def test_parse_sacct(newer: bool) -> None:
    text = (DATA / "sacct_22.05.json").read_text()
    if newer:
        text = json.dumps(_to_newer_format(json.loads(text)))
    jobs = parse_sacct_json(text)
    expected = {
        "completed": AppState.SUCCEEDED,
        "failed": AppState.FAILED,
        "requeued": AppState.FAILED,
        "timeout": AppState.FAILED,
        "cancelled": AppState.CANCELLED,
        "running": AppState.SUCCEEDED,
        "pending": AppState.SUCCEEDED,
    }
    for case, state in expected.items():
        assert jobs[JOBS[case]][0].state == state, case
    assert jobs[JOBS["timeout"]][0].states == ["TIMEOUT"]
    assert [r.name for r in jobs[JOBS["completed"]]] == ["ok.trainer", "ok.ps"]
    assert jobs[JOBS["requeued"]][0].restarts == 1  # one REQUEUED record before the last run
    assert len(jobs[JOBS["requeued"]]) == 1
    assert jobs[JOBS["pending"]][0].nodes == "node[1-4]"


def _by_case(jobs: dict[str, list[Any]]) -> dict[str, list[tuple[Any, ...]]]:
    return {
        case: [(r.job_id, r.offset, r.name, r.state, r.nodes, r.restarts, r.work_dir) for r in jobs[JOBS[case]]]
        for case in JOBS
        if JOBS[case] in jobs
    }


def test_squeue_text_columns_say_what_the_json_says() -> None:
    from_json = parse_squeue_json((DATA / "squeue_22.05.json").read_text())
    from_text = parse_squeue_text((DATA / "squeue_22.05.txt").read_text())
    assert _by_case(from_text) == _by_case(from_json)
    assert set(from_text) == set(from_json)
    run = from_text[JOBS["running"]][0]
    assert run.num_tasks == 2 and run.submit_time == from_json[JOBS["running"]][0].submit_time


def test_sacct_text_columns_say_what_the_json_says() -> None:
    from_json = parse_sacct_json((DATA / "sacct_22.05.json").read_text())
    from_text = parse_sacct_text((DATA / "sacct_22.05.txt").read_text())
    assert _by_case(from_text) == _by_case(from_json)
    assert from_text[JOBS["requeued"]][0].exit_code == 5  # the text columns keep exit codes 22.05's JSON drops
    assert from_text[JOBS["requeued"]][0].restarts == 1


def test_slurm_without_json_is_read_from_text_columns() -> None:
    calls: list[list[str]] = []

    def runner(args: list[str]) -> subprocess.CompletedProcess[str]:
        calls.append(args)
        if "--json" in args:
            return subprocess.CompletedProcess(args, 1, "", f"{args[0]}: unrecognized option '--json'\n")
        name = "squeue_22.05.txt" if args[0] == "squeue" else "sacct_22.05.txt"
        return subprocess.CompletedProcess(args, 0, (DATA / name).read_text(), "")

    q = SlurmQueries(runner=runner)
    assert q.job(JOBS["running"])[0].state == AppState.RUNNING  # type: ignore[index]
    assert q.json is False
    q._snapshot = {}
    q._snapshot_at = time.monotonic()
    failed = q.job(JOBS["failed"], max_age=60)
    assert failed is not None and failed[0].state == AppState.FAILED
    assert [c[0] for c in calls] == ["squeue", "squeue", "sacct"]
    assert calls[-1][:3] == ["sacct", "-P", "-n"]


@pytest.mark.parametrize(
    ("expr", "hosts"),
    [
        ("node1", ["node1"]),
        ("node[1-3]", ["node1", "node2", "node3"]),
        ("node[1-2,5],gpu07", ["node1", "node2", "node5", "gpu07"]),
        ("gpu[08-10]", ["gpu08", "gpu09", "gpu10"]),
        ("r[1-2]-n[1-2]", ["r1-n1", "r1-n2", "r2-n1", "r2-n2"]),
        ("", []),
    ],
)
def test_expand_hostlist(expr: str, hosts: list[str]) -> None:
    assert expand_hostlist(expr) == hosts


# -- the status batcher ----------------------------------------------------------------------------------


class FakeSlurm:
    """Answers squeue/sacct from the captured JSON and counts the calls."""

    def __init__(self, squeue: str | None = None, sacct: str | None = None, delay: float = 0.0) -> None:
        self.squeue = squeue if squeue is not None else (DATA / "squeue_22.05.json").read_text()
        self.sacct = sacct if sacct is not None else (DATA / "sacct_22.05.json").read_text()
        self.calls: list[list[str]] = []
        self.delay = delay
        self.lock = threading.Lock()

    def __call__(self, args: list[str]) -> subprocess.CompletedProcess[str]:
        with self.lock:
            self.calls.append(args)
        time.sleep(self.delay)
        if args[0] == "squeue":
            return subprocess.CompletedProcess(args, 0, self.squeue, "")
        if args[0] == "sacct":
            return subprocess.CompletedProcess(args, 0, self.sacct, "")
        raise AssertionError(args)

    def count(self, name: str) -> int:
        return sum(1 for c in self.calls if c[0] == name)


def test_many_threads_share_one_squeue_call() -> None:
    fake = FakeSlurm(delay=0.05)
    q = SlurmQueries(runner=fake)
    ids = [JOBS[c] for c in ("running", "pending", "timeout")] * 34
    results: list[Any] = []
    threads = [threading.Thread(target=lambda i=i: results.append(q.job(i, max_age=5))) for i in ids]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 102 and all(results)
    assert fake.count("squeue") == 1
    assert fake.count("sacct") == 0


def test_a_job_just_submitted_is_never_looked_for_in_an_older_snapshot() -> None:
    fake = FakeSlurm(squeue=json.dumps({"jobs": []}), sacct=json.dumps({"jobs": []}))
    q = SlurmQueries(runner=fake)
    assert q.job(JOBS["running"], max_age=60) is None
    fake.squeue = (DATA / "squeue_22.05.json").read_text()  # sbatch has run since
    q.submitted(JOBS["running"])
    recs = q.job(JOBS["running"], max_age=60)
    assert recs is not None and recs[0].state == AppState.RUNNING
    assert fake.count("squeue") == 2


def test_forgotten_jobs_go_to_sacct_in_one_batch_and_ended_ones_are_cached() -> None:
    squeue = json.dumps({"jobs": []})
    fake = FakeSlurm(squeue=squeue)
    q = SlurmQueries(runner=fake)
    first = q.job(JOBS["failed"], max_age=10)
    assert first is not None and first[0].state == AppState.FAILED
    assert fake.count("sacct") == 1
    assert fake.calls[-1][:3] == ["sacct", "--json", "-D"]
    for _ in range(5):
        assert q.job(JOBS["failed"], max_age=0) == first  # ended: cached for good
    assert fake.count("sacct") == 1 and fake.count("squeue") == 1
    assert q.job("999999", max_age=10) is None  # unknown to both


def test_sacct_batches_every_recently_wanted_id() -> None:
    fake = FakeSlurm(squeue=json.dumps({"jobs": []}), sacct=json.dumps({"jobs": []}))
    q = SlurmQueries(runner=fake)
    q.job("1001", max_age=0)
    q.job("1002", max_age=0)
    time.sleep(0.01)
    q._lookup_at.clear()  # as if both were last asked long ago
    q.job("1003", max_age=0)
    assert fake.calls[-1][-1] == "1001,1002,1003"


def test_no_accounting_is_not_an_error() -> None:
    def runner(args: list[str]) -> subprocess.CompletedProcess[str]:
        if args[0] == "squeue":
            return subprocess.CompletedProcess(args, 0, '{"jobs": []}', "")
        return subprocess.CompletedProcess(args, 1, "", "sacct: error: Slurm accounting storage is disabled\n")

    q = SlurmQueries(runner=runner)
    assert q.job("5", max_age=0) is None
    assert q.sacct_available is False


def test_unreachable_controller_says_what_to_do() -> None:
    def runner(args: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(args, 1, "", "slurm_load_jobs error: Unable to contact slurm controller (connect failure)")

    with pytest.raises(SchedulerUnavailableError, match="slurmctld"):
        SlurmQueries(runner=runner).job("5")


def test_missing_sbatch_says_what_to_install(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    s = SlurmScheduler("t")
    info = s.submit_dryrun(AppDef("x", [Role("w", entrypoint="true")]), {"job_dir": str(tmp_path / "j")})
    with pytest.raises(SchedulerUnavailableError, match="apt-get install slurm-client"):
        s.schedule(info)
    assert not (tmp_path / "j").exists()  # nothing submitted, nothing left behind


# -- describe / wait / cancel / list against captured answers ---------------------------------------------


def write_job_dir(s: SlurmScheduler, app: AppDef, app_id: str, tmp_path: Path) -> Path:
    """A job directory as schedule() leaves it, indexed under the test's TSM_HOME."""
    req = dryrun(s, app, {"job_dir": str(tmp_path / f"job-{app_id}")})
    job_dir = Path(req.job_dir)
    job_dir.mkdir()
    (job_dir / "app.json").write_text(req.app_json)
    for role in req.roles:
        (job_dir / role).mkdir()
    index = _index_dir()
    index.mkdir(parents=True, exist_ok=True)
    (index / app_id).write_text(str(job_dir) + "\n")
    return job_dir


def test_describe_failed_app_per_replica(tmp_path: Path) -> None:
    fake = FakeSlurm()
    s = SlurmScheduler("t", queries_=SlurmQueries(runner=fake))
    app_id = JOBS["failed"]
    job_dir = write_job_dir(s, two_role_app(), app_id, tmp_path)
    (job_dir / "trainer" / "0.status").write_text("exited 143 1795275229 0 TERM\n")
    (job_dir / "trainer" / "1.status").write_text("exited 3 1795275229 0 -\n")
    (job_dir / "ps" / "0.status").write_text("running node4 1795275229 0\n")
    d = s.describe(app_id)
    assert d is not None
    assert d.state == AppState.FAILED
    assert "role 'trainer' replica 1 exited with code 3" in d.msg
    assert "NonZeroExitCode" in d.msg
    reps = {(r.role, r.id): r for rs in d.roles_statuses for r in rs.replicas}
    assert reps["trainer", 1].state == AppState.FAILED and reps["trainer", 1].exit_code == 3
    assert reps["trainer", 0].state == AppState.CANCELLED and "SIGTERM" in reps["trainer", 0].error_msg
    assert reps["ps", 0].state == AppState.CANCELLED and reps["ps", 0].hostname == "node4"
    assert reps["trainer", 1].hostname == "node2"  # from the node list: replica k is on the k-th node
    assert d.app is not None and d.app.roles[0].args == ["train.py", "--lr", "0.1"]


def test_describe_rebuilds_the_app_without_its_files(sched: SlurmScheduler) -> None:
    s = SlurmScheduler("t", queries_=SlurmQueries(runner=FakeSlurm()))
    d = s.describe(JOBS["running"])
    assert d is not None and d.state == AppState.RUNNING
    assert d.app is not None and d.app.name == "busy"
    assert [(r.name, r.num_replicas) for r in d.app.roles] == [("trainer", 2), ("ps", 1)]
    assert [len(rs.replicas) for rs in d.roles_statuses] == [2, 1]


def test_describe_pending_and_requeued(sched: SlurmScheduler) -> None:
    s = SlurmScheduler("t", queries_=SlurmQueries(runner=FakeSlurm()))
    pending = s.describe(JOBS["pending"])
    assert pending is not None and pending.state == AppState.PENDING and "Resources" in pending.msg
    requeued = s.describe(JOBS["requeued"])
    assert requeued is not None and requeued.state == AppState.PENDING and requeued.num_restarts == 1


def test_describe_unknown_and_malformed_ids() -> None:
    s = SlurmScheduler("t", queries_=SlurmQueries(runner=FakeSlurm(sacct=json.dumps({"jobs": []}))))
    assert s.describe("424242") is None
    assert s.describe("../etc") is None


def test_describe_from_the_sacct_record_after_squeue_forgot() -> None:
    s = SlurmScheduler("t", queries_=SlurmQueries(runner=FakeSlurm(squeue=json.dumps({"jobs": []}))))
    d = s.describe(JOBS["requeued"])
    assert d is not None and d.state == AppState.FAILED and d.num_restarts == 1
    assert "BeginTime" not in d.msg  # a stale pending reason is not shown for an ended job
    t = s.describe(JOBS["timeout"])
    assert t is not None and t.state == AppState.FAILED and t.msg.startswith("TIMEOUT")
    (rep,) = replicas_of(t)
    assert rep.state == AppState.FAILED and rep.error_msg.startswith("job ended by Slurm: TIMEOUT")


def replicas_of(desc: Any) -> list[Any]:
    return [r for rs in desc.roles_statuses for r in rs.replicas]


def test_wait_backs_off(monkeypatch: pytest.MonkeyPatch) -> None:
    s = SlurmScheduler("t", queries_=SlurmQueries(runner=FakeSlurm()))
    sleeps: list[float] = []
    monkeypatch.setattr(time, "sleep", sleeps.append)
    states = iter([AppState.PENDING] * 10 + [AppState.SUCCEEDED])

    def describe(app_id: str, max_age: float = 1.0) -> Any:
        from tsm.schedulers.api import DescribeAppResponse

        return DescribeAppResponse(app_id=app_id, state=next(states))

    monkeypatch.setattr(s, "describe", describe)
    d = s.wait("1")
    assert d is not None and d.state == AppState.SUCCEEDED
    assert sleeps[0] == 0.5
    assert all(b >= a for a, b in zip(sleeps, sleeps[1:], strict=False))
    assert max(sleeps) == 5.0


def test_cancel_is_idempotent(monkeypatch: pytest.MonkeyPatch) -> None:
    answers = iter([
        subprocess.CompletedProcess(["scancel"], 0, "", ""),
        subprocess.CompletedProcess(["scancel"], 1, "", "scancel: error: Kill job error on job id 5: Job/step already completing or completed\n"),
        subprocess.CompletedProcess(["scancel"], 1, "", "scancel: error: Kill job error on job id 5: Invalid job id specified\n"),
    ])  # fmt: skip
    calls: list[list[str]] = []

    def fake_run(args: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        calls.append(args)
        return next(answers)

    monkeypatch.setattr(slurm_cli, "run", fake_run)
    s = SlurmScheduler("t", queries_=SlurmQueries(runner=FakeSlurm()))
    for _ in range(3):
        s.cancel("5")
    assert calls == [["scancel", "5"]] * 3
    s.cancel("not-a-job")  # never reaches scancel
    assert len(calls) == 3


def test_list_merges_queue_and_accounting_newest_first() -> None:
    s = SlurmScheduler("sess", queries_=SlurmQueries(runner=FakeSlurm()))
    rows = s.list()
    ids = [r.app_id for r in rows]
    assert JOBS["running"] in ids and JOBS["completed"] in ids
    assert len(ids) == len(set(ids))
    created = [r.created or 0 for r in rows]
    assert created == sorted(created, reverse=True)
    row = next(r for r in rows if r.app_id == JOBS["running"])
    assert (row.name, row.state, row.app_handle) == ("busy", AppState.RUNNING, f"slurm://sess/{JOBS['running']}")


def test_schedule_writes_private_files_and_indexes_the_job(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    seen: dict[str, Any] = {}

    def fake_run(args: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        seen.update(args=args, **kw)
        return subprocess.CompletedProcess(args, 0, "777;cluster\n", "")

    monkeypatch.setattr(slurm_cli, "run", fake_run)
    s = SlurmScheduler("t", queries_=SlurmQueries(runner=FakeSlurm()))
    info = s.submit_dryrun(two_role_app(), {"slurm_version": "22.05"})
    assert s.schedule(info) == "777"
    job_dir = Path(info.request.job_dir)
    assert seen["args"] == ["sbatch", "--parsable", str(job_dir / "job.sbatch")]
    assert seen["umask"] == 0o077
    assert (job_dir / "job.sbatch").read_text() == info.request.script
    assert (job_dir.stat().st_mode & 0o777) == 0o700
    assert (job_dir.parent.stat().st_mode & 0o777) == 0o700
    assert ((job_dir / "app.json").stat().st_mode & 0o777) == 0o600
    assert (_index_dir() / "777").read_text().strip() == str(job_dir)
    with pytest.raises(SubmissionError, match="already holds an app"):
        s.schedule(info)


def test_sbatch_refusal_is_a_submission_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def fake_run(args: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(args, 1, "", "sbatch: error: Batch job submission failed: Requested node configuration is not available\n")

    monkeypatch.setattr(slurm_cli, "run", fake_run)
    s = SlurmScheduler("t")
    with pytest.raises(SubmissionError, match="Requested node configuration is not available"):
        s.submit(two_role_app(), {"slurm_version": "22.05", "job_dir": str(tmp_path / "j")})


def test_remove_deletes_only_what_tsm_wrote(tmp_path: Path) -> None:
    s = SlurmScheduler("t", queries_=SlurmQueries(runner=FakeSlurm()))
    job_dir = write_job_dir(s, two_role_app(), "9002", tmp_path)
    for name in ("job.sbatch", "batch.out", "exit", "restarts", "trainer/0.stdout", "trainer/1.status"):
        (job_dir / name).write_text("x")
    (job_dir / "ps" / "mine.txt").write_text("user file")
    assert s.remove("9002") is True
    assert sorted(p.relative_to(job_dir).as_posix() for p in job_dir.rglob("*")) == ["ps", "ps/mine.txt"]
    assert not (_index_dir() / "9002").exists()
    assert s.remove("9002") is False  # nothing of ours is left


# -- logs ------------------------------------------------------------------------------------------------


def squeue_with(app_id: str, **fields: Any) -> str:
    """The captured squeue answer plus a running job ``app_id`` (a copy of a real record)."""
    data = json.loads((DATA / "squeue_22.05.json").read_text())
    rec = dict(next(j for j in data["jobs"] if j["job_id"] == int(JOBS["timeout"])))
    rec.update(job_id=int(app_id), het_job_id=0, het_job_offset=0, **fields)
    data["jobs"].append(rec)
    return json.dumps(data)


def logs_app(tmp_path: Path) -> tuple[SlurmScheduler, Path]:
    s = SlurmScheduler("t", queries_=SlurmQueries(runner=FakeSlurm(squeue=squeue_with("9001"))))
    job_dir = write_job_dir(s, two_role_app(), "9001", tmp_path)
    (job_dir / "trainer" / "1.stdout").write_bytes(b"epoch 1\nloss 0.5\nepoch 2\nno newline at end")
    (job_dir / "trainer" / "1.stderr").write_bytes("warn é\n".encode())
    return s, job_dir


def test_log_iter_streams_and_regex(tmp_path: Path) -> None:
    s, _ = logs_app(tmp_path)
    out = list(s.log_iter("9001", "trainer", 1, streams=Stream.STDOUT))
    assert out == ["epoch 1\n", "loss 0.5\n", "epoch 2\n", "no newline at end"]
    assert list(s.log_iter("9001", "trainer", 1, streams=Stream.STDERR)) == ["warn é\n"]
    assert list(s.log_iter("9001", "trainer", 1, regex=r"^epoch")) == ["epoch 1\n", "epoch 2\n"]
    assert len(list(s.log_iter("9001", "trainer", 1))) == 5  # COMBINED: stdout then stderr
    assert list(s.log_iter("9001", "trainer", 0)) == []  # no output yet


def test_log_iter_found_from_another_directory_via_workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s, job_dir = logs_app(tmp_path)
    (_index_dir() / "9001").unlink()  # another TSM_HOME: only Slurm's WorkDir leads there
    squeue = squeue_with("9001", current_working_directory=str(job_dir))
    s2 = SlurmScheduler("t", queries_=SlurmQueries(runner=FakeSlurm(squeue=squeue)))
    monkeypatch.chdir(tmp_path)
    assert list(s2.log_iter("9001", "trainer", 1, streams=Stream.STDERR)) == ["warn é\n"]


def test_log_iter_since_until_select_whole_files(tmp_path: Path) -> None:
    s, job_dir = logs_app(tmp_path)
    later = datetime.now() + timedelta(hours=1)
    assert list(s.log_iter("9001", "trainer", 1, since=later)) == []
    (job_dir / "trainer" / "1.status").write_text(f"running node2 {time.time():.0f} 0\n")
    assert list(s.log_iter("9001", "trainer", 1, until=datetime.now() - timedelta(hours=1))) == []
    assert len(list(s.log_iter("9001", "trainer", 1, since=datetime.now() - timedelta(hours=1)))) == 5


def test_log_iter_unknowns(tmp_path: Path) -> None:
    s, _ = logs_app(tmp_path)
    with pytest.raises(UnknownAppError, match="no role 'nope'"):
        list(s.log_iter("9001", "nope", 0))
    with pytest.raises(UnknownAppError, match="replicas 0..1"):
        list(s.log_iter("9001", "trainer", 2))
    s2 = SlurmScheduler("t", queries_=SlurmQueries(runner=FakeSlurm(squeue='{"jobs": []}', sacct='{"jobs": []}')))
    with pytest.raises(UnknownAppError):
        list(s2.log_iter("31337", "trainer", 0))


def test_log_follow_stops_when_the_replica_exits(tmp_path: Path) -> None:
    s, job_dir = logs_app(tmp_path)
    out_path = job_dir / "ps" / "0.stdout"
    status = job_dir / "ps" / "0.status"
    status.write_text("running node3 1 0\n")

    def writer() -> None:
        with open(out_path, "ab") as f:
            for i in range(5):
                f.write(f"tick {i}\n".encode())
                f.flush()
                time.sleep(0.1)
            f.write(b"partial")
        status.write_text("exited 0 2 0 -\n")

    t = threading.Thread(target=writer)
    t.start()
    start = time.monotonic()
    lines = list(s.log_iter("9001", "ps", 0, should_tail=True, streams=Stream.STDOUT))
    t.join()
    assert lines == [f"tick {i}\n" for i in range(5)] + ["partial"]
    assert time.monotonic() - start < 10


def test_read_status_tolerates_garbage(tmp_path: Path) -> None:
    p = tmp_path / "s"
    assert read_status(p) is None
    p.write_text("running")
    assert read_status(p) is None
    p.write_text("exited x 1 0 -")
    assert read_status(p) is None


# -- import cost ---------------------------------------------------------------------------------------------


def test_import_tsm_does_not_load_the_slurm_module() -> None:
    code = textwrap.dedent(
        """
        import sys, tsm, tsm.schedulers
        tsm.schedulers.scheduler_names()
        assert "tsm.schedulers.slurm" not in sys.modules
        import tsm.schedulers.slurm
        heavy = {"requests", "yaml", "numpy", "torch", "asyncio"} & set(sys.modules)
        assert not heavy, heavy
        """
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_registry_creates_the_slurm_scheduler() -> None:
    from tsm.schedulers import get_scheduler

    s = get_scheduler("slurm", "sess")
    assert isinstance(s, SlurmScheduler) and s.session_name == "sess" and s.backend == "slurm"


def test_replica_command_must_fit_arg_max_with_the_submitters_environment(
    sched: SlurmScheduler, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job keeps the submitter's environment, so a command that fits alone may not fit with it."""
    from tsm.specs.validate import exec_limit

    args = ["x" * 100_000] * (exec_limit() // 100_000 - 2)  # fits on its own (validation passes)
    app = AppDef("big", [Role("r", entrypoint="true", args=args)])
    dryrun(sched, app)
    for i in range(4):
        monkeypatch.setenv(f"TSM_TEST_BIG_{i}", "y" * 100_000)
    with pytest.raises(InvalidAppError, match=r"role 'r': the command line and environment take \d+ bytes.*ARG_MAX"):
        dryrun(sched, app)
