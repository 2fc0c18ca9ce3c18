"""Secrets on the real Docker engine, submitted through the runner (``-c secrets=``): two replicas and a
ROLE retry's new containers get the exact values from their role's read-only volume, and no value is in
``docker inspect`` of any container or volume of the app, the dry run, ``describe``, ``status``, ``list``,
nor any file or store row under ``$TSM_HOME``; ``tsm rm`` leaves no volume behind.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from integration.docker_engine import PYTHON_IMAGE, DockerEngine
from testutil import everything_under as _everything_under
from tsm.runner.api import get_runner
from tsm.schedulers.docker.request import LABEL_FILLER, SECRETS_DIR
from tsm.schedulers.docker.scheduler import DockerScheduler
from tsm.specs.api import AppDef, AppState, Resource, RetryPolicy, Role

pytestmark = [pytest.mark.integration, pytest.mark.docker]

HANG = 240.0  # seconds: a guard against a hang, never a performance claim
SESSION = "secit"
CANARY = "tsm-canary-docker-it-81c4"
NASTY = "a b'c\"$HOME`;\n\\x é\n"
ARGV = ["a b", "", "$HOME", "'\""]

# prints each secret's sha256 (never the value), whether the source variable leaked and its argv; replica
# 0's first attempt fails, so the ROLE retry's new containers must get the secrets too
PROGRAM = r"""
import hashlib, os, sys
got = [hashlib.sha256(os.environ[n].encode()).hexdigest() if n in os.environ else None for n in ("TOKEN", "NASTY")]
print("SEEN", os.environ["TSM_REPLICA_ID"], os.environ["TSM_ATTEMPT"], *got, "SRC" in os.environ,
      repr(sys.argv[1:]), flush=True)
if os.environ["TSM_REPLICA_ID"] == "0" and os.environ["TSM_ATTEMPT"] == "0":
    sys.exit(3)
"""


def _sha(v: str) -> str:
    return hashlib.sha256(v.encode()).hexdigest()


@pytest.fixture
def engine(docker_engine: DockerEngine) -> Iterator[None]:
    yield
    s = DockerScheduler(SESSION)
    s.cleanup(include_running=True, session=SESSION)
    s.close()




def test_secrets_reach_both_replicas_and_a_retry_and_are_kept_nowhere(
        engine: None, tsm_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import docker

    monkeypatch.setenv("SRC", CANARY)
    (tmp_path / "nasty").write_text(NASTY + "\n")  # one trailing newline is dropped: NASTY keeps its own
    role = Role("w", image=PYTHON_IMAGE, entrypoint="python3", args=["-c", PROGRAM, *ARGV], num_replicas=2,
                max_retries=1, retry_policy=RetryPolicy.ROLE, resource=Resource(cpu=1, memMB=200),
                secrets=["NASTY:file:" + str(tmp_path / "nasty")])
    runner = get_runner(SESSION)
    info = runner.dryrun(AppDef("sec", [role]), "docker", cfg={"secrets": ["TOKEN:env:SRC"]})
    shown = str(info)
    app_id = info.request.app_id
    volume = f"tsm-{app_id}-secrets-0"
    assert shown.count("  # NASTY=<secret> TOKEN=<secret>") == 2
    assert shown.count(f"--mount type=volume,source={volume},target={SECRETS_DIR},readonly") == 2
    handle = runner.schedule(info)
    status = runner.wait(handle, timeout=HANG)
    assert status is not None and status.state == AppState.SUCCEEDED, status

    seen = [line.rstrip("\n").split(maxsplit=6) for i in range(2) for line in runner.log_lines(handle, "w", i)
            if line.startswith("SEEN")]
    assert {(s[1], s[2]) for s in seen} >= {("0", "0"), ("0", "1"), ("1", "1")}  # attempt 1: new containers
    for s in seen:
        assert s[3:] == [_sha(CANARY), _sha(NASTY), "False", repr(ARGV)], s

    client = docker.from_env()
    try:
        containers = client.containers.list(all=True, filters={"label": f"tsm.app-id={app_id}"})
        assert len(containers) == 2 and {c.labels["tsm.attempt"] for c in containers} == {"1"}
        for c in containers:
            mounts = [m for m in c.attrs["Mounts"] if m["Destination"] == SECRETS_DIR]
            assert [(m["Type"], m["Name"], m["RW"]) for m in mounts] == [("volume", volume, False)]
        assert not client.containers.list(all=True, filters={"label": [LABEL_FILLER, f"tsm.app-id={app_id}"]})
        volumes = client.volumes.list(filters={"label": f"tsm.app-id={app_id}"})
        assert [v.name for v in volumes] == [volume]
        # another uid in a container reads the files (0444, root's), and cannot change them (read-only)
        probe = client.containers.run(PYTHON_IMAGE, ["/bin/sh", "-c", f"stat -c '%a %u' {SECRETS_DIR}/*; "
                                                     f"touch {SECRETS_DIR}/x 2>/dev/null || echo read-only"],
                                      user="65534:65534", remove=True, network_mode="none",
                                      volumes={volume: {"bind": SECRETS_DIR, "mode": "ro"}})
        assert probe.decode().split("\n") == ["444 0", "444 0", "read-only", ""]

        env = {**os.environ, "TSM_CLI_SERVER": "0"}
        cli = [subprocess.run([sys.executable, "-m", "tsm.cli.main", *args], capture_output=True, text=True,
                              env=env, check=True).stdout
               for args in (["status", handle], ["status", "--json", handle], ["list"], ["list", "-s", "docker"],
                            ["describe", handle])]
        described = runner.describe(handle)
        for text in (json.dumps([c.attrs for c in containers]), json.dumps([v.attrs for v in volumes]), shown,
                     info.request.to_json(), repr(described), repr(runner.status(handle)),
                     repr(runner.list("docker")), _everything_under(tsm_home), *cli):
            assert CANARY not in text and "$HOME`;" not in text
        assert "TOKEN" in cli[4] and "NASTY" in cli[4]  # the declaration is what describe shows

        runner.delete(handle)
        assert client.containers.list(all=True, filters={"label": f"tsm.app-id={app_id}"}) == []
        assert client.volumes.list(filters={"label": f"tsm.app-id={app_id}"}) == []
    finally:
        client.close()
        runner.close()


@pytest.fixture
def shell_less_image(engine: None) -> Iterator[str]:
    """An image without /bin/sh (nothing in it at all), removed after the test."""
    tag = "tsm-test/no-shell:secrets"
    subprocess.run(["docker", "build", "-q", "-t", tag, "-"], input="FROM scratch\nLABEL tsm.test=no-shell\n",
                   capture_output=True, text=True, check=True)
    yield tag
    subprocess.run(["docker", "rmi", "-f", tag], capture_output=True)


def test_an_image_without_a_shell_fails_at_submit_saying_so_and_leaves_nothing(
        shell_less_image: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import docker

    from tsm.errors import SubmissionError

    monkeypatch.setenv("SRC", CANARY)
    runner = get_runner(SESSION)
    app = AppDef("noshell", [Role("w", image=shell_less_image, entrypoint="/prog")])
    info = runner.dryrun(app, "docker", cfg={"secrets": ["TOKEN:env:SRC"], "pull": "never"})
    with pytest.raises(SubmissionError, match=f"image {shell_less_image} has no /bin/sh; on Docker a role's secrets"):
        runner.schedule(info)
    client = docker.from_env()
    try:
        app_id = info.request.app_id
        assert client.containers.list(all=True, filters={"label": f"tsm.app-id={app_id}"}) == []
        assert client.volumes.list(filters={"label": f"tsm.app-id={app_id}"}) == []
        assert client.networks.list(filters={"label": f"tsm.app-id={app_id}"}) == []
    finally:
        client.close()
        runner.close()
