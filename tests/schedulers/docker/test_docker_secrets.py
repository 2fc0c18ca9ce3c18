"""Secrets on Docker, on the fake engine and the host's shells: the dry run, the request and the containers'
config hold names only; the wrapper exports each file's bytes exactly and runs the argv as given; every
replica, a retry's replacement too, gets the values from its role's volume; the volume goes with the app;
an image without /bin/sh and a missing value fail at submit leaving nothing."""

from __future__ import annotations

import hashlib
import json
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from schedulers.docker.fake_docker import FakeDockerEngine, FakeImages, fake_client
from testutil import everything_under as _everything_under
from tsm.errors import InvalidAppError, NotSupportedError, SecretError, SubmissionError
from tsm.runner.api import Runner
from tsm.schedulers.docker.request import (
    LABEL_APP,
    LABEL_FILLER,
    LABEL_OWNER,
    LABEL_SCHEDULER,
    SECRETS_DIR,
    DockerRequest,
    script,
)
from tsm.schedulers.docker.scheduler import DockerScheduler
from tsm.specs.api import AppDef, AppState, BindMount, RetryPolicy, Role

PY = sys.executable
CANARY = "tsm-canary-docker-5b1e"
NASTY = "a b'c\"$HOME`;\n\\x é\n"

# prints each secret's sha256 (never the value) and whether the source variable leaked; replica 0's
# first attempt fails, so a retry's new containers must get the secrets too
PROGRAM = r"""
import hashlib, os, sys
got = [hashlib.sha256(os.environ[n].encode()).hexdigest() if n in os.environ else None for n in ("TOKEN", "NASTY")]
print("SEEN", os.environ["TSM_REPLICA_ID"], os.environ["TSM_ATTEMPT"], *got, "SRC" in os.environ, sys.argv[1:],
      flush=True)
if os.environ["TSM_REPLICA_ID"] == "0" and os.environ["TSM_ATTEMPT"] == "0":
    sys.exit(3)
"""
ARGV = ["a b", "", "$HOME", "'\"", "-c"]


def _sha(v: str) -> str:
    return hashlib.sha256(v.encode()).hexdigest()


@pytest.fixture
def engine() -> Iterator[FakeDockerEngine]:
    e = FakeDockerEngine()
    yield e
    for c in list(e.by_id.values()):
        if c.current is not None:
            c.current.signal(9)
    for v in e.vols.values():
        shutil.rmtree(v["dir"], ignore_errors=True)


@pytest.fixture
def runner(engine: FakeDockerEngine) -> Iterator[Runner]:
    r = Runner("t", scheduler_factories={
        "docker": lambda session, **kw: DockerScheduler(session, client=fake_client(engine), images=FakeImages())})
    yield r
    r.close()


@pytest.fixture
def nasty(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("SRC", CANARY)
    path = tmp_path / "nasty"
    path.write_text(NASTY + "\n")  # one trailing newline is dropped: NASTY keeps its own
    return str(path)


def _role(nasty: str, **kw: object) -> Role:
    kw.setdefault("secrets", ["NASTY:file:" + nasty])
    return Role("w", image="fake/python", entrypoint=PY, args=["-c", PROGRAM, *ARGV], **kw)  # type: ignore[arg-type]




def test_the_dry_run_shows_names_and_the_mount_never_a_value(runner: Runner, nasty: str) -> None:
    plain = Role("p", image="fake/python", entrypoint=PY, args=["-c", "pass"])
    app = AppDef("sec", [_role(nasty, num_replicas=2, secrets=["NASTY:file:" + nasty, "TOKEN:env:SRC"]), plain])
    info = runner.dryrun(app, "docker")
    req: DockerRequest = info.request
    shown = str(info)
    assert CANARY not in shown + req.to_json() and "$HOME`;" not in shown + req.to_json()
    assert req.secrets == ["NASTY:file:" + nasty, "TOKEN:env:SRC"]
    volume = f"tsm-{req.app_id}-secrets-0"
    assert f"docker volume create --label {LABEL_APP}={req.app_id}" in shown and volume in shown
    assert len([line for line in shown.splitlines() if line.startswith("docker run")]) == 3
    assert shown.count("  # NASTY=<secret> TOKEN=<secret>") == 2  # each run line of role w ends so
    assert shown.count(f"--mount type=volume,source={volume},target={SECRETS_DIR},readonly") == 2
    for c in req.containers:
        assert "TOKEN" not in c.env and "NASTY" not in c.env
        if c.role == "w":
            assert c.secrets == ["NASTY", "TOKEN"]
            assert c.command[:2] == ["/bin/sh", "-c"] and c.command[3:] == ["tsm-secrets", PY, "-c", PROGRAM, *ARGV]
            assert c.mounts == [{"type": "volume", "source": volume, "target": SECRETS_DIR, "read_only": True}]
        else:  # a role without secrets runs as it would without them: no wrapper, no volume
            assert (c.secrets, c.mounts, c.command) == ([], [], [PY, "-c", "pass"])


def _shells() -> list[list[str]]:
    found = [[sh] for sh in ("/bin/sh", "/bin/bash", "/bin/dash") if Path(sh).exists()]
    return found + ([["busybox", "sh"]] if shutil.which("busybox") else [])


VALUES = {"NASTY": NASTY, "SPACES": "  lead\tand trail  ", "BACKSLASH": "ends in \\", "NEWLINES": "\n\n",
          "CRLF": "one\r\ntwo\r", "PLAIN": "x", "tsm_line": "named as the wrapper's own variable", "IFS": ":"}


@pytest.mark.parametrize("shell", _shells(), ids=lambda s: s[-1])
def test_the_wrapper_exports_each_files_bytes_and_runs_the_argv_as_given(shell: list[str], tmp_path: Path) -> None:
    for name, value in VALUES.items():
        (tmp_path / name).write_bytes(value.encode())
    show = "import json, os, sys; print(json.dumps([{n: os.environ.get(n) for n in json.loads(sys.argv[1])}, sys.argv[2:], " \
           "sorted(k for k in os.environ if k.startswith('tsm_') and k != 'tsm_line')]))"
    names = list(VALUES)
    out = subprocess.run([*shell, "-c", script(names, str(tmp_path)), "tsm-secrets", PY, "-c", show,
                          json.dumps(names), *ARGV], capture_output=True, text=True, check=True)
    seen, argv, leftovers = json.loads(out.stdout)
    assert seen == VALUES and argv == ARGV and leftovers == []


def test_a_secret_file_that_cannot_be_read_stops_the_replica_naming_it(tmp_path: Path) -> None:
    out = subprocess.run(["/bin/sh", "-c", script(["GONE"], str(tmp_path)), "tsm-secrets", "echo", "ran"],
                         capture_output=True, text=True)
    assert (out.returncode, out.stdout) == (1, "")
    assert out.stderr == f"tsm: cannot read secret GONE from {tmp_path}/GONE\n"


def test_every_replica_and_a_retrys_new_containers_get_them_and_the_volume_goes_with_the_app(
        runner: Runner, engine: FakeDockerEngine, nasty: str, tsm_home: Path) -> None:
    app = AppDef("sec", [_role(nasty, num_replicas=2, max_retries=1, retry_policy=RetryPolicy.ROLE)])
    info = runner.dryrun(app, "docker", cfg={"secrets": ["TOKEN:env:SRC"]})
    handle = runner.schedule(info)
    status = runner.wait(handle, timeout=60)
    assert status is not None and status.state == AppState.SUCCEEDED, status
    volume = f"tsm-{info.request.app_id}-secrets-0"
    files = engine.files(volume)
    assert files == {"NASTY": NASTY.encode(), "TOKEN": CANARY.encode()}
    assert {stat.S_IMODE(Path(engine.vols[volume]["dir"], f).stat().st_mode) for f in files} == {0o444}
    seen = [line.rstrip("\n").split(maxsplit=6) for i in range(2) for line in runner.log_lines(handle, "w", i)
            if line.startswith("SEEN")]
    assert {(s[1], s[2]) for s in seen} >= {("0", "0"), ("0", "1"), ("1", "1")}  # attempt 1: new containers
    for s in seen:
        assert s[3:] == [_sha(CANARY), _sha(NASTY), "False", repr(ARGV)], s
    # the engine was told no value: not in any container's env, command or labels, nor in any call
    containers = list(engine.by_id.values())
    assert len(containers) == 2 and {c.labels["tsm.attempt"] for c in containers} == {"1"}
    for c in containers:
        assert c.volumes == {SECRETS_DIR: volume}
    app_id = info.request.app_id
    described = runner.describe(handle)
    for text in (repr([(c.env, c.command, c.labels) for c in containers]), repr(engine.calls),
                 _everything_under(tsm_home), str(info), repr(runner.status(handle)), repr(described),
                 repr(runner.list("docker"))):
        assert CANARY not in text and "$HOME`;" not in text
    assert not any(LABEL_FILLER in c.labels for c in containers)
    runner.delete(handle)
    assert engine.vols == {} and engine.by_id == {}
    assert ("remove_volume", volume) in engine.calls
    assert not (tsm_home / "docker" / app_id).exists()


def test_a_replica_docker_restarts_reads_them_again_and_remove_finished_drops_the_volume(
        runner: Runner, engine: FakeDockerEngine, nasty: str, tmp_path: Path) -> None:
    # the same container runs twice (its env the same): the first run fails, leaving a mark on the host
    first = "import os, sys; m = sys.argv[1]; os.path.exists(m) or (open(m, 'w').close(), sys.exit(3))"
    code = PROGRAM.replace('os.environ["TSM_ATTEMPT"] == "0"', "False") + "\n" + first
    app = AppDef("sec", [Role("w", image="fake/python", entrypoint=PY, args=["-c", code, str(tmp_path / "mark")],
                              secrets=["TOKEN:env:SRC", "NASTY:file:" + nasty], max_retries=1,
                              retry_policy=RetryPolicy.REPLICA)])
    handle = runner.run(app, "docker", cfg={"remove_finished": True})
    status = runner.wait(handle, timeout=60)
    assert status is not None and status.state == AppState.SUCCEEDED and status.num_restarts == 1, status
    seen = [line.split() for line in runner.log_lines(handle, "w", 0) if line.startswith("SEEN")]
    assert len(seen) == 2  # the first run and Docker's restart of the same container
    assert all(s[3:5] == [_sha(CANARY), _sha(NASTY)] for s in seen)
    assert engine.vols == {} and engine.by_id == {}


def test_an_image_without_a_shell_fails_at_submit_saying_so_and_leaves_nothing(
        runner: Runner, engine: FakeDockerEngine, nasty: str) -> None:
    engine.shell = False
    with pytest.raises(SubmissionError, match=r"image fake/python has no /bin/sh; on Docker a role's secrets"):
        runner.run(AppDef("sec", [_role(nasty)]), "docker")
    assert engine.vols == {} and engine.by_id == {} and engine.nets == {}


def test_a_missing_value_fails_before_anything_is_made(runner: Runner, engine: FakeDockerEngine, nasty: str,
                                                       tsm_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TSM_NO_SUCH_VAR", raising=False)
    with pytest.raises(SecretError, match=r"secret X: \$TSM_NO_SUCH_VAR is not set"):
        runner.run(AppDef("sec", [_role(nasty)]), "docker", cfg={"secrets": ["X:env:TSM_NO_SUCH_VAR"]})
    assert engine.calls == [] and not list((tsm_home / "docker").glob("sec-*"))


def test_cleanup_removes_the_volumes_and_fillers_a_crashed_launcher_left(engine: FakeDockerEngine) -> None:
    client = fake_client(engine)
    labels = {LABEL_SCHEDULER: "docker", LABEL_APP: "gone-1", LABEL_OWNER: client.owner}
    client.create_volume("tsm-gone-1-secrets-0", labels)
    engine.create_container("fake/python", [], ["/bin/sh"], labels={
        LABEL_FILLER: "tsm-gone-1-secrets-0", LABEL_APP: "gone-1", LABEL_OWNER: client.owner},
        host_config={"mounts": [{"Target": SECRETS_DIR, "Source": "tsm-gone-1-secrets-0", "Type": "volume"}]})
    other = {**labels, LABEL_OWNER: "someone-else"}
    client.create_volume("tsm-theirs-secrets-0", other)
    s = DockerScheduler("t", client=client, images=FakeImages())
    s.cleanup()
    assert list(engine.vols) == ["tsm-theirs-secrets-0"] and engine.by_id == {}


def test_what_docker_cannot_deliver_is_refused_at_dry_run(runner: Runner, nasty: str, tmp_path: Path) -> None:
    with pytest.raises(NotSupportedError, match="takes secrets from env or file, not k8s"):
        runner.dryrun(AppDef("sec", [_role(nasty)]), "docker", cfg={"secrets": ["B:k8s:creds/b"]})
    mounted = _role(nasty, mounts=[BindMount(str(tmp_path), SECRETS_DIR + "/")])
    with pytest.raises(InvalidAppError, match=f"mounts {SECRETS_DIR}, where its secrets' volume goes"):
        runner.dryrun(AppDef("sec", [mounted]), "docker")
