"""Declared secrets on the real cluster of ``scripts/slurm-up``, submitted through the runner (``-c secrets=``).

Two replicas, on two nodes, get a canary from the submitter's environment and a nasty value from a file;
each prints the sha256 of each value (never the value) and the modes of the files it read them from, on
both of its tries (the first fails, so the batch script requeues the job). While the second try runs, the
values are in none of Slurm's own records of the job (``scontrol show job -dd``, ``scontrol write
batch_script``, ``squeue``, ``sacct`` and, read as root, the job's saved environment in the controller's
state), the dry run, describe, status or list; once the app has ended they are in no file under
``$TSM_HOME`` (its job directory included) and no table of its store. A cancel removes the files at once;
the same holds over ``-c ssh=``.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from testutil import store_text, wait_until
from tsm.runner.api import get_runner
from tsm.schedulers.slurm.ssh_host import RemoteRecord
from tsm.specs.api import AppDef, AppState, Resource, Role

from .conftest import SlurmCluster, SshServer

pytestmark = [pytest.mark.integration, pytest.mark.slurm]

HANG = 240.0  # seconds: a guard against a hang, never a performance claim
SESSION = "slurmsecrets"
SMALL = Resource(cpu=1, memMB=200)
NASTY = "a b'c\"$HOME`;\n\\x é $(PATH) ${USER}"
#: each replica prints its try, the sha256 of each named variable (never the value) and the modes of the job
#: directory's secrets folder and files. With a mark path, the first try fails: replica 0 exits 3 once every
#: other replica has exited 0 (its status file says so; none is killed mid-way by srun's --kill-on-bad-exit);
#: the second try waits for the test's go file, so the test reads the live job
CODE = """
import hashlib, os, stat, sys, time
names, mark = sys.argv[1].split(","), sys.argv[2] if len(sys.argv) > 2 else ""
attempt, rid, n = os.environ["TSM_ATTEMPT"], os.environ["TSM_REPLICA_ID"], int(os.environ["TSM_NUM_REPLICAS"])
sums = " ".join(v + "=" + hashlib.sha256(os.environ[v].encode()).hexdigest() for v in names)
folder = os.path.join(os.environ["TSM_JOB_DIR"], "secrets")
modes = [oct(stat.S_IMODE(os.lstat(folder).st_mode))]
modes += sorted(f + ":" + oct(stat.S_IMODE(os.lstat(os.path.join(folder, f)).st_mode)) for f in os.listdir(folder))
print("try", attempt, sums, " ".join(modes), "TSM_SECRET_NAMES" in os.environ, flush=True)
def exited(i):
    try:
        words = open(os.path.join(os.environ["TSM_JOB_DIR"], "r", f"{i}.status")).read().split()
    except OSError:
        return False
    return words[:2] == ["exited", "0"] and words[3:4] == [attempt]
if mark:
    open(f"{mark}-{attempt}-{rid}", "w").close()
    if attempt == "0" and rid != "0":
        sys.exit(0)
    while not (all(exited(i) for i in range(1, n)) if attempt == "0" else os.path.exists(mark + "-go")):
        time.sleep(0.05)
    sys.exit(3 if attempt == "0" else 0)
time.sleep(float(os.environ.get("HOLD", "0")))
"""


def sha(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def forms(value: str) -> list[str]:
    """How a value could show in text: as it is, JSON-escaped, shell-quoted."""
    return [value, json.dumps(value)[1:-1], json.dumps(value, ensure_ascii=False)[1:-1], value.replace("'", "'\"'\"'")]


def leaks(text: str, values: list[str]) -> list[str]:
    return [f[:8] + "..." for v in values for f in forms(v) if f in text]


def files_leaking(home: Path, values: list[str]) -> list[str]:
    out = []
    for p in home.rglob("*"):
        if p.is_file() and not p.is_symlink():
            data = p.read_bytes()
            out += [f"{p}: {f[:8]}..." for v in values for f in forms(v) if f.encode() in data]
    return out




def run(*args: str) -> str:
    proc = subprocess.run(list(args), capture_output=True, text=True, timeout=120, errors="replace")
    return proc.stdout + proc.stderr


def tsm_cli(*args: str) -> str:
    return run(sys.executable, "-m", "tsm.cli.main", *args)


def slurm_records(job_id: str) -> str:
    """What Slurm tells anyone who asks about the job, and (as root) the environment it saved for it."""
    texts = [run("scontrol", "show", "job", "-dd", job_id), run("scontrol", "write", "batch_script", job_id, "-"),
             run("squeue", "-j", job_id, "-o", "%all"), run("sacct", "-j", job_id, "-P", "-l")]
    return "\n".join(texts)


def saved_environment(job_id: str) -> bytes | None:
    """The environment slurmctld keeps for the job (the submitter's, under ``--export=ALL``), when readable."""
    out = run("scontrol", "show", "config")
    where = next((ln.split("=", 1)[1].strip() for ln in out.splitlines() if ln.startswith("StateSaveLocation")), "")
    found = glob.glob(os.path.join(where, "hash.*", f"job.{job_id}", "environment")) if where else []
    try:
        return Path(found[0]).read_bytes() if found else None
    except OSError:
        return None


@pytest.fixture(autouse=True)
def cluster(slurm_cluster: SlurmCluster, monkeypatch: pytest.MonkeyPatch) -> SlurmCluster:
    """The cluster, with this venv's python first on PATH: jobs carry the submitter's PATH."""
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    return slurm_cluster


@pytest.fixture
def submitted() -> Iterator[list[str]]:
    """The handles a test submits; those still running after it (a failed test's) are cancelled."""
    handles: list[str] = []
    yield handles
    with get_runner(SESSION) as runner:
        for handle in handles:
            st = runner.status(handle)
            if st is not None and not st.state.is_terminal:
                runner.cancel(handle)


def test_secrets_reach_both_replicas_and_their_retry_and_nothing_slurm_or_tsm_keeps(
        tsm_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, submitted: list[str]) -> None:
    canary = "canary-" + os.urandom(8).hex()
    monkeypatch.setenv("TSM_IT_CANARY", canary)
    nasty_file = tmp_path / "nasty"
    nasty_file.write_text(NASTY)
    values = [canary, NASTY]
    mark = str(tmp_path / "ready")
    role = Role("r", entrypoint="python", args=["-c", CODE, "TSM_IT_CANARY,NASTY", mark], num_replicas=2,
                max_retries=1, resource=SMALL)
    cfg = {"secrets": ["TSM_IT_CANARY", f"NASTY:file:{nasty_file}"]}
    with get_runner(SESSION) as runner:
        info = runner.dryrun(AppDef("secrets", [role]), "slurm", cfg=cfg)
        assert leaks(str(info), values) == [] and leaks(repr(info.request), values) == []
        assert "TSM_IT_CANARY=<secret> NASTY=<secret>" in str(info)
        handle = runner.schedule(info)
        submitted.append(handle)
        app_id = handle.rsplit("/", 1)[-1]

        def second_try_runs() -> bool:
            st = runner.status(handle)
            assert st is not None and not st.state.is_terminal, st
            return all(Path(f"{mark}-1-{i}").exists() for i in range(2))

        wait_until(second_try_runs, "both replicas' second try to run", HANG)
        records = slurm_records(app_id)
        assert "TSM_SECRET_NAMES='TSM_IT_CANARY NASTY' srun" in records  # the script Slurm keeps: names only
        assert leaks(records, values) == [], records
        env = saved_environment(app_id)
        if os.geteuid() == 0:  # root reads the controller's state: the job's environment lacks the canary
            assert env is not None, "the controller's saved environment of the job was not found"
            assert (b"TSM_IT_CANARY" in env, canary.encode() in env) == (False, False)
        shown = [repr(runner.describe(handle)), str(runner.status(handle)), repr(runner.list("slurm")),
                 tsm_cli("describe", handle), tsm_cli("status", handle), tsm_cli("list", "-s", "slurm")]
        assert app_id in shown[-1] and leaks("\n".join(shown), values) == []
        Path(f"{mark}-go").touch()
        st = runner.wait(handle, wait_interval=0.5, timeout=HANG)
        assert st is not None and st.state == AppState.SUCCEEDED, st
        want = f"TSM_IT_CANARY={sha(canary)} NASTY={sha(NASTY)} 0o700 NASTY:0o400 TSM_IT_CANARY:0o400 False"
        hosts = set()
        for i in range(2):
            assert list(runner.log_lines(handle, "r", i)) == [f"try 0 {want}\n", f"try 1 {want}\n"]
            desc = runner.scheduler("slurm").describe(app_id)
            assert desc is not None
            hosts |= {r.hostname for rs in desc.roles_statuses for r in rs.replicas}
        assert len(hosts) == 2, hosts  # one replica per node
        job_dir = runner.scheduler("slurm").job_dir(app_id)
        assert job_dir is not None and str(job_dir).startswith(str(tsm_home))
        assert not (job_dir / "secrets").exists()  # the batch script removed them as the app ended
        assert files_leaking(tsm_home, values) == [] and leaks(store_text(tsm_home), values) == []
        assert runner.remove([handle]) == [handle]
        assert not job_dir.exists()


def test_a_cancel_removes_the_secrets_files(monkeypatch: pytest.MonkeyPatch, submitted: list[str]) -> None:
    canary = "canary-" + os.urandom(8).hex()
    monkeypatch.setenv("TSM_IT_CANARY", canary)
    role = Role("r", entrypoint="python", args=["-c", CODE, "TSM_IT_CANARY"], env={"HOLD": "600"}, resource=SMALL)
    with get_runner(SESSION) as runner:
        handle = runner.run(AppDef("seccancel", [role]), "slurm", cfg={"secrets": ["TSM_IT_CANARY"]})
        submitted.append(handle)
        app_id = handle.rsplit("/", 1)[-1]
        wait_until(lambda: bool(list(runner.log_lines(handle, "r", 0))), "the replica to start", HANG)
        job_dir = runner.scheduler("slurm").job_dir(app_id)
        assert job_dir is not None and (job_dir / "secrets" / "TSM_IT_CANARY").is_file()
        runner.cancel(handle)
        st = runner.status(handle)
        assert st is not None and st.state == AppState.CANCELLED, st
        assert not (job_dir / "secrets").exists()
        assert runner.remove([handle]) == [handle]


def test_secrets_over_ssh_reach_the_replicas_and_leave_the_login_node(
        ssh_server: SshServer, tsm_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    canary = "canary-" + os.urandom(8).hex()
    monkeypatch.setenv("TSM_IT_CANARY", canary)
    nasty_file = tmp_path / "nasty"
    nasty_file.write_text(NASTY)
    values = [canary, NASTY]
    role = Role("r", entrypoint="python3", args=["-c", CODE, "TSM_IT_CANARY,NASTY"], num_replicas=2)
    cfg: dict[str, Any] = ssh_server.cfg(secrets=["TSM_IT_CANARY", f"NASTY:file:{nasty_file}"])
    with get_runner(SESSION) as runner:
        info = runner.dryrun(AppDef("sshsecrets", [role]), "slurm", cfg=cfg)
        assert leaks(str(info), values) == []
        handle = runner.schedule(info)
        st = runner.wait(handle, wait_interval=0.5, timeout=HANG)
        assert st is not None and st.state == AppState.SUCCEEDED, st
        want = f"TSM_IT_CANARY={sha(canary)} NASTY={sha(NASTY)} 0o700 NASTY:0o400 TSM_IT_CANARY:0o400 False"
        for i in range(2):
            assert list(runner.log_lines(handle, "r", i)) == [f"try 0 {want}\n"]
        rec = RemoteRecord.load(handle.rsplit("/", 1)[-1])
        assert rec is not None
        remote = Path(rec.job_dir)
        if os.geteuid() == 0:  # the test's login node (scripts/sshd-up) is this machine: its user's files
            assert (remote / "app.json").is_file() and not (remote / "secrets").exists()
            assert files_leaking(remote, values) == []
        assert files_leaking(tsm_home, values) == [] and leaks(store_text(tsm_home), values) == []
        assert runner.remove([handle]) == [handle]
