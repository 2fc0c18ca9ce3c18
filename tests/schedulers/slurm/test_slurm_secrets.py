"""Secrets on Slurm without a cluster: the dry run holds names only; the files written at submit (here, and on a
"login node" that is a fake ``ssh`` running the local ``sh``) are 0400 in a 0700 folder and hold the exact
bytes; sbatch's environment lacks the variables that held them; the batch script, run with bash against a
stand-in for ``srun``, puts each value byte-exact into its replicas' environment and removes the folder as
the app ends. The real cluster is in ``tests/integration/test_slurm_secrets.py``."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from slurm_util import dryrun, no_slurm

from tsm.errors import InvalidAppError, SecretError, SubmissionError
from tsm.runner import get_runner
from tsm.schedulers.common.ssh import SshConnection, SshTarget
from tsm.schedulers.slurm import SlurmBatchRequest, SlurmQueries, SlurmScheduler
from tsm.schedulers.slurm.array import submit_array
from tsm.schedulers.slurm.host import LocalHost
from tsm.schedulers.slurm.secrets import NAMES_VAR, Delivery, write_dir
from tsm.schedulers.slurm.ssh_host import SshHost
from tsm.specs.api import AppDef, Role

CANARY = "tsm-canary-" + os.urandom(6).hex()
NASTY = "a b'c\"$HOME`;\n\\x é $(id) ${PATH}"
#: a value whose trailing newlines are its own (an env variable's: nothing is dropped)
TRAILING = "ends with newlines\n\n"

#: the replica: the sha256 of each named variable (never the value), and which of tsm's names it sees
REPORT = """
import hashlib, json, os, sys
names = sys.argv[1].split(",")
print(json.dumps({"sums": {n: hashlib.sha256(os.environ[n].encode()).hexdigest() if n in os.environ else None
                           for n in names}, "names_var": "TSM_SECRET_NAMES" in os.environ}))
"""


def sha(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def leaks(text: str) -> list[str]:
    values = [CANARY, NASTY, TRAILING.rstrip("\n")]
    return [v[:8] for v in values for form in (v, json.dumps(v)[1:-1]) if form in text]


def secret_app(*roles: Role) -> AppDef:
    return AppDef("sec", list(roles) or [Role("r", entrypoint=sys.executable, args=["-c", REPORT, "TOK"],
                                              num_replicas=2)])


# -- the dry run ---------------------------------------------------------------------------------------------
def test_the_dry_run_names_each_secret_and_holds_no_value(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SRC", CANARY)
    (tmp_path / "nasty").write_text(NASTY + "\n")
    info = get_runner("t").dryrun(secret_app(), "slurm", cfg={
        "slurm_version": "22.05", "secrets": ["TOK:env:SRC", f"NASTY:file:{tmp_path / 'nasty'}"]})
    req = info.request
    assert isinstance(req, SlurmBatchRequest)
    assert req.secrets == ["TOK:env:SRC", f"NASTY:file:{tmp_path / 'nasty'}"]
    shown = str(info)
    assert "# secrets: TOK=<secret> NASTY=<secret>" in shown and "TOK:env:SRC" in shown
    assert f"{NAMES_VAR}='TOK NASTY' srun " in req.script
    assert leaks(shown) == [] and leaks(json.dumps(dataclasses.asdict(req))) == []


def test_only_the_roles_that_declare_a_secret_name_it_to_their_wrapper(sched: SlurmScheduler) -> None:
    app = secret_app(Role("a", entrypoint="true", secrets=["TOK"]), Role("b", entrypoint="true"))
    req = dryrun(sched, app)
    sruns = [ln for ln in req.script.splitlines() if "srun " in ln and not ln.startswith("#")]
    assert sruns[0].startswith(f"{NAMES_VAR}=TOK srun --het-group=0 ") and sruns[1].startswith("srun --het-group=1 ")
    assert req.secrets == ["TOK"]
    assert dryrun(sched, secret_app(Role("c", entrypoint="true"))).secrets is None


@pytest.mark.skipif(shutil.which("shellcheck") is None and os.environ.get("CI", "").lower() not in ("1", "true", "yes"),
                    reason="shellcheck is not installed (Debian: apt-get install shellcheck)")
def test_a_script_with_secrets_passes_shellcheck(sched: SlurmScheduler) -> None:
    script = dryrun(sched, secret_app(Role("a", entrypoint="true", secrets=["TOK", "B"]),
                                      Role("b", entrypoint="true", secrets=["B"]))).script
    proc = subprocess.run(["shellcheck", "-S", "warning", "-s", "bash", "-"], input=script, capture_output=True,
                          text=True)  # fmt: skip
    assert proc.returncode == 0, proc.stdout


def test_a_name_of_the_wrappers_own_is_refused(sched: SlurmScheduler) -> None:
    with pytest.raises(InvalidAppError, match="_tsm_"):
        dryrun(sched, secret_app(Role("a", entrypoint="true", secrets=["_tsm_n"])))


def test_the_delivery_never_shows_a_value() -> None:
    d = Delivery({"TOK": CANARY}, frozenset({"SRC"}))
    assert "TOK" in repr(d) and CANARY not in repr(d) and CANARY not in str(d)


# -- the batch script and the wrapper, run with bash ---------------------------------------------------------
FAKE_SRUN = """\
import os, subprocess, sys
args, opts = sys.argv[1:], {}
while args and args[0].startswith("-"):
    key, _, value = args.pop(0).partition("=")
    opts[key] = value
procs = []
for t in range(int(opts.get("--ntasks", "1"))):
    env = dict(os.environ, SLURM_PROCID=str(t), SLURMD_NODENAME="fake%d" % t)
    out, err = (open(opts[o].replace("%t", str(t)), "ab") for o in ("--output", "--error"))
    procs.append(subprocess.Popen(args, cwd=opts.get("--chdir"), stdout=out, stderr=err, env=env))
sys.exit(max(p.wait() for p in procs))
"""


def fake_bin(tmp_path: Path, **programs: str) -> Path:
    """A folder of stand-ins (``name=body``; a body starting ``#!`` is a script as it is, else Python)."""
    bindir = tmp_path / "fakebin"
    bindir.mkdir(exist_ok=True)
    for name, body in programs.items():
        path = bindir / name
        path.write_text(body if body.startswith("#!") else f"#!{sys.executable}\n{body}")
        path.chmod(0o755)
    return bindir


def run_batch(sched: SlurmScheduler, app: AppDef, tmp_path: Path, values: dict[str, str]) -> tuple[Path, str]:
    """Write the app's job directory with ``values`` as its secrets' files, run its batch script with bash."""
    req = dryrun(sched, app, {"job_dir": str(tmp_path / "job")})
    job_dir = Path(req.job_dir)
    job_dir.mkdir()
    (job_dir / "job.sbatch").write_text(req.script)
    write_dir(job_dir, values)
    bindir = fake_bin(tmp_path, srun=FAKE_SRUN, scontrol='import sys\nif sys.argv[1:3] == ["show", "hostnames"]: print("localhost")',
                      scancel="")  # fmt: skip
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "fake0"}
    env.pop("SLURM_RESTART_COUNT", None)
    proc = subprocess.run(["bash", str(job_dir / "job.sbatch")], env=env, capture_output=True, text=True, timeout=60)
    return job_dir, proc.stderr + f"\nexit {proc.returncode}"


def test_each_replica_gets_its_roles_secrets_byte_exact_and_the_folder_goes_as_the_app_ends(
        sched: SlurmScheduler, tmp_path: Path) -> None:
    # names the wrapper also uses for its own variables: the values must not become them (they go into the
    # status file) and the replica must still get them
    names = "TOK,NASTY,TRAILING,host,status,cmd"
    values = {"TOK": CANARY, "NASTY": NASTY, "TRAILING": TRAILING, "host": CANARY + "h", "status": CANARY + "s",
              "cmd": CANARY + "c"}  # fmt: skip
    app = secret_app(Role("r", entrypoint=sys.executable, args=["-c", REPORT, names], num_replicas=2,
                          secrets=list(values)),
                     Role("plain", entrypoint=sys.executable, args=["-c", REPORT, "TOK"]))
    job_dir, said = run_batch(sched, app, tmp_path, values)
    assert said.endswith("exit 0"), said
    for k in range(2):
        got = json.loads((job_dir / "r" / f"{k}.stdout").read_text())
        assert got == {"sums": {n: sha(v) for n, v in values.items()}, "names_var": False}
        assert (job_dir / "r" / f"{k}.status").read_text().startswith("exited 0 ")
        assert f" fake{k}\n" in (job_dir / "r" / f"{k}.status").read_text()
    assert json.loads((job_dir / "plain" / "0.stdout").read_text()) == {"sums": {"TOK": None}, "names_var": False}
    assert not (job_dir / "secrets").exists()  # the app is over: its secrets' files went
    everything = "".join(p.read_text(errors="replace") for p in job_dir.rglob("*") if p.is_file())
    assert leaks(everything + said) == [] and CANARY not in everything


def test_a_replica_whose_secret_file_is_gone_fails_saying_which(sched: SlurmScheduler, tmp_path: Path) -> None:
    app = secret_app(Role("r", entrypoint="true", secrets=["TOK", "GONE"]))
    job_dir, said = run_batch(sched, app, tmp_path, {"TOK": CANARY})
    assert said.endswith("exit 1"), said
    err = (job_dir / "r" / "0.stderr").read_text()
    assert f"tsm: secret GONE: cannot read {job_dir}/secrets/GONE" in err and CANARY not in err
    assert (job_dir / "r" / "0.status").read_text().startswith("exited 1 ")


# -- submission here: the files, sbatch's environment, failures --------------------------------------------
FAKE_SBATCH = """#!/bin/sh
env >"$FAKE_ENV_OUT"
[ -n "$FAKE_SBATCH_FAIL" ] && { echo "sbatch: error: refused" >&2; exit 1; }
echo 77
"""


def secret_files(job_dir: Path) -> dict[str, bytes]:
    """The secrets' files, checking the folder is 0700 and each file 0400."""
    folder = job_dir / "secrets"
    assert stat.S_IMODE(folder.lstat().st_mode) == 0o700 and folder.is_dir() and not folder.is_symlink()
    out = {}
    for p in folder.iterdir():
        assert stat.S_IMODE(p.lstat().st_mode) == 0o400 and p.is_file() and not p.is_symlink(), p
        out[p.name] = p.read_bytes()
    return out


@pytest.fixture
def sbatch_here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in ``sbatch`` first on PATH that writes the environment it got to the returned file."""
    out = tmp_path / "sbatch_env"
    monkeypatch.setenv("PATH", f"{fake_bin(tmp_path, sbatch=FAKE_SBATCH)}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_ENV_OUT", str(out))
    return out


def test_submission_writes_owner_only_files_and_keeps_the_values_out_of_sbatchs_environment(
        sched: SlurmScheduler, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sbatch_here: Path) -> None:
    monkeypatch.setenv("SRC", CANARY)
    monkeypatch.setenv("TRAILING", TRAILING)
    (tmp_path / "nasty").write_text(NASTY + "\n")
    app = secret_app(Role("r", entrypoint="true", secrets=["TOK:env:SRC", f"NASTY:file:{tmp_path / 'nasty'}",
                                                             "TRAILING"]))
    info = sched.submit_dryrun(app, {"slurm_version": "22.05"})
    assert sched.schedule(info) == "77"
    job_dir = Path(info.request.job_dir)
    assert secret_files(job_dir) == {"TOK": CANARY.encode(), "NASTY": NASTY.encode(), "TRAILING": TRAILING.encode()}
    env = sbatch_here.read_text()
    assert CANARY not in env and "SRC=" not in env and "TRAILING=" not in env and "FAKE_ENV_OUT=" in env
    assert leaks((job_dir / "job.sbatch").read_text() + (job_dir / "app.json").read_text()) == []
    # tsm rm: the folder and its files go with the rest
    assert sched.remove("77") and not job_dir.exists()


def test_a_value_that_cannot_be_read_fails_the_submission_before_any_file(
        sched: SlurmScheduler, monkeypatch: pytest.MonkeyPatch, sbatch_here: Path) -> None:
    monkeypatch.delenv("NOPE", raising=False)
    info = sched.submit_dryrun(secret_app(Role("r", entrypoint="true", secrets=["NOPE"])), {"slurm_version": "22.05"})
    with pytest.raises(SecretError, match=r"\$NOPE is not set"):
        sched.schedule(info)
    assert not Path(info.request.job_dir).exists() and not sbatch_here.exists()


def test_a_refused_submission_leaves_no_secret_and_a_job_dir_holding_secrets_is_refused(
        sched: SlurmScheduler, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sbatch_here: Path) -> None:
    monkeypatch.setenv("TOK", CANARY)
    monkeypatch.setenv("FAKE_SBATCH_FAIL", "1")
    app = secret_app(Role("r", entrypoint="true", secrets=["TOK"]))
    info = sched.submit_dryrun(app, {"slurm_version": "22.05", "job_dir": str(tmp_path / "j")})
    with pytest.raises(SubmissionError, match="refused"):
        sched.schedule(info)
    assert not (tmp_path / "j").exists()
    monkeypatch.delenv("FAKE_SBATCH_FAIL")
    (tmp_path / "mine" / "secrets").mkdir(parents=True)
    (tmp_path / "mine" / "secrets" / "keep").write_text("the user's")
    info = sched.submit_dryrun(app, {"slurm_version": "22.05", "job_dir": str(tmp_path / "mine")})
    with pytest.raises(SubmissionError, match="already holds 'secrets'"):
        sched.schedule(info)
    assert (tmp_path / "mine" / "secrets" / "keep").read_text() == "the user's"


def test_a_sweeps_trials_each_get_their_files_and_sbatch_none_of_the_values(
        sched: SlurmScheduler, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sbatch_here: Path) -> None:
    monkeypatch.setenv("TOK", CANARY)
    app = secret_app(Role("r", entrypoint="true", secrets=["TOK"]))
    reqs = [dryrun(sched, app, {"job_dir": str(tmp_path / f"t{i}")}) for i in range(2)]
    ids = submit_array(LocalHost(SlurmQueries(runner=no_slurm)), reqs, "sw", 1,
                       [Delivery.read(r.secrets) for r in reqs])
    assert ids == ["77_0", "77_1"]
    for i in range(2):
        assert secret_files(tmp_path / f"t{i}") == {"TOK": CANARY.encode()}
    assert CANARY not in sbatch_here.read_text()


# -- submission on a login node (a fake ssh running the local sh) -------------------------------------------
def fake_ssh(tmp_path: Path, bindir: Path) -> str:
    path = tmp_path / "fake-ssh"
    path.write_text(f'#!/bin/bash\ncmd="${{@: -1}}"\nexport PATH={bindir}:$PATH\nexec sh -c "$cmd"\n')
    path.chmod(0o755)
    return str(path)


def test_over_ssh_the_files_travel_in_the_submission_stream_and_go_when_sbatch_refuses(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sbatch_here: Path) -> None:
    rem = SshHost(SshConnection(SshTarget("h"), control_dir=tmp_path / "c",
                                ssh=fake_ssh(tmp_path, tmp_path / "fakebin")))
    values = {"TOK": CANARY, "NASTY": NASTY, "TRAILING": TRAILING}
    job_dir = tmp_path / "remote" / "job-1234abcd"
    req = SlurmBatchRequest(script="#!/bin/bash\ntrue\n", job_dir=str(job_dir), app_name="a", roles=["r"],
                            app_json="{}", secrets=list(values))
    assert rem.submit(req, Delivery(values, frozenset())) == "77"
    assert secret_files(job_dir) == {k: v.encode() for k, v in values.items()}
    assert stat.S_IMODE(job_dir.stat().st_mode) == 0o700
    # a host that holds another app's secrets folder is refused; a refused sbatch leaves none behind
    other = dataclasses.replace(req, job_dir=str(tmp_path / "remote" / "job-other"))
    (tmp_path / "remote" / "job-other" / "secrets").mkdir(parents=True)
    with pytest.raises(SubmissionError, match="already holds 'secrets'"):
        rem.submit(other, Delivery(values, frozenset()))
    monkeypatch.setenv("FAKE_SBATCH_FAIL", "1")
    third = dataclasses.replace(req, job_dir=str(tmp_path / "remote" / "job-third"))
    with pytest.raises(SubmissionError, match="refused"):
        rem.submit(third, Delivery(values, frozenset()))
    assert not (tmp_path / "remote" / "job-third" / "secrets").exists()
    # removing the app removes the folder (through the same host)
    assert rem.remove(str(job_dir), ["r"]) and not job_dir.exists()
