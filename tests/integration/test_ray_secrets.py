"""Secrets on the real Ray head: a value from the submitter's environment and a nasty one from a file reach
every attempt of every replica, a restart on another node after its node was lost included, byte for byte
(each replica prints a sha256, never the value), and appear in none of Ray's job info (``get_job_info``,
``list_jobs``: entrypoint, runtime_env, metadata), the job's logs, the State API, any file Ray wrote on the
node, tsm's dry run, describe, status, list, store or files -- and the cluster's store holds nothing of them
once the driver has started."""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from integration.ray_cluster import RayCluster, ray_cluster  # noqa: F401 (the fixture test modules ask for)
from integration.test_ray_long_runs import WorkerNode, record, wait_for
from testutil import everything_under as _everything_under
from tsm.runner import get_runner
from tsm.schedulers.api import Stream
from tsm.schedulers.ray.client import RayClient
from tsm.specs.api import AppDef, AppState, Resource, RetryPolicy, Role

pytestmark = [pytest.mark.integration, pytest.mark.ray]
PY = sys.executable
HANG = 300.0
#: shell metacharacters, quotes, a backslash, unicode, inner and trailing newlines; each run's own (the shared
#: head keeps every earlier job, and its logs grow: a fixed value could be an earlier run's)
NASTY = "a b'c\"$HOME`;\n\\x é {}\n"

#: prints each secret's sha256 (of the exact bytes of its environment variable), whether the source variable
#: or the token file reached it; replica 0's first attempt fails, so its retry must get them too
PROGRAM = r"""
import hashlib, os, sys
def h(n):
    v = os.environb.get(n.encode())
    return hashlib.sha256(v).hexdigest() if v is not None else None
print("SEEN", os.environ["TSM_REPLICA_ID"], os.environ["TSM_ATTEMPT"], h("TOKEN"), h("NASTY"), "SRC" in os.environ,
      os.path.exists("nasty"), flush=True)
if os.environ["TSM_REPLICA_ID"] == "0" and os.environ["TSM_ATTEMPT"] == "0":
    sys.exit(3)
"""

#: the same report; a first attempt then waits for the file argv[1], a restarted one ends at once
LOST = r"""
import hashlib, os, sys, time
def h(n):
    v = os.environb.get(n.encode())
    return hashlib.sha256(v).hexdigest() if v is not None else None
print("SEEN", os.environ["TSM_ATTEMPT"], repr(os.environ["TSM_LAST_EXIT"]), h("TOKEN"), h("NASTY"), flush=True)
if not os.environ["TSM_LAST_EXIT"]:
    while not os.path.exists(sys.argv[1]):
        time.sleep(0.2)
"""


def _sha(v: str) -> str:
    return hashlib.sha256(v.encode()).hexdigest()




def _dump(model: Any) -> str:
    """A job's details (a pydantic model), every field."""
    return str(model.model_dump_json() if hasattr(model, "model_dump_json") else model.json())


def _state(address: str, resource: str) -> str:
    with urllib.request.urlopen(f"{address}/api/v0/{resource}?detail=1&limit=10000", timeout=30) as resp:
        return resp.read().decode(errors="replace")


def _ray_files_since(start: float) -> str:
    """What every file of the Ray session written since ``start`` holds (logs, unpacked packages, records)."""
    root = Path("/tmp/ray/session_latest").resolve()
    out = []
    for p in root.rglob("*"):
        try:
            if p.is_file() and not p.is_symlink() and p.stat().st_mtime >= start - 1:
                out.append(p.read_bytes().decode(errors="replace"))
        except OSError:  # a socket, or gone meanwhile
            continue
    return "\n".join(out)


def _assert_nowhere(values: list[str], texts: list[str]) -> None:
    """None of ``values`` is in any of ``texts`` (failing names the text, never shows it)."""
    held = [i for i, text in enumerate(texts) if any(v in text for v in values)]
    if held:
        pytest.fail(f"a secret's value is in the texts numbered {held}", pytrace=False)


@pytest.fixture
def values(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    """This run's canary (in the submitter's ``$SRC``) and nasty value (in ``launch/nasty``, the launching
    directory, shipped as the job's working_dir); the working directory is ``launch``."""
    canary, nasty = f"tsm-canary-{secrets.token_hex(8)}", NASTY.format(secrets.token_hex(8))
    monkeypatch.setenv("SRC", canary)
    d = tmp_path / "launch"
    d.mkdir()
    (d / "nasty").write_text(nasty + "\n")  # one trailing newline is dropped: the value keeps its own
    monkeypatch.chdir(d)
    return canary, nasty


def test_secrets_reach_every_attempt_of_every_replica_and_ray_keeps_none(
        ray_cluster: RayCluster, tsm_home: Path, values: tuple[str, str]) -> None:  # noqa: F811
    from ray.job_submission import JobSubmissionClient

    start = time.time()
    canary, nasty = values
    runner = get_runner("ray-secrets")
    role = Role("w", entrypoint=PY, args=["-c", PROGRAM], num_replicas=2, max_retries=1,
                retry_policy=RetryPolicy.REPLICA, resource=Resource(cpu=1, memMB=100),
                secrets=[f"NASTY:file:{Path.cwd() / 'nasty'}"])
    info = runner.dryrun(AppDef("sec", [role]), "ray",
                         cfg={"secrets": ["TOKEN:env:SRC"], "address": ray_cluster.address})
    shown = str(info)
    assert shown.count("TOKEN=<secret>") == 2 and shown.count("NASTY=<secret>") == 2
    uri = info.request.payload.secrets_uri
    handle = runner.schedule(info)
    app_id = handle.rsplit("/", 1)[1]
    status = runner.wait(handle, timeout=HANG)
    assert status is not None and status.state == AppState.SUCCEEDED, status
    seen = [ln.split() for k in range(2) for ln in runner.log_lines(handle, "w", k) if ln.startswith("SEEN")]
    assert sorted((s[1], s[2]) for s in seen) == [("0", "0"), ("0", "1"), ("1", "0")]
    for s in seen:  # the exact bytes; the source variable and the token file did not travel
        assert s[3:] == [_sha(canary), _sha(nasty), "False", "False"], s
    client = RayClient(ray_cluster.address)
    assert not client.package_exists(uri)  # the driver took them: the cluster's store holds nothing

    jobs = JobSubmissionClient(ray_cluster.address)
    job = jobs.get_job_info(app_id)
    assert job.runtime_env and job.entrypoint and job.metadata  # what is checked below is the real job
    env = {**os.environ, "TSM_CLI_SERVER": "0"}
    cli = [subprocess.run([PY, "-m", "tsm.cli.main", *args], capture_output=True, text=True, env=env,
                          check=True).stdout
           for args in (["status", handle], ["status", "--json", handle], ["list"], ["list", "-s", "ray"],
                        ["describe", handle])]
    assert app_id in cli[3] and "TOKEN:env:SRC" in cli[4]
    sched = runner.scheduler("ray")
    texts = [
        _dump(job), json.dumps(job.runtime_env), job.entrypoint, json.dumps(job.metadata),
        "\n".join(_dump(j) for j in jobs.list_jobs()), jobs.get_job_logs(app_id),
        _state(ray_cluster.address, "tasks"), _state(ray_cluster.address, "actors"),
        json.dumps(sched.record_of(client.job(app_id), ray_cluster.address)),
        shown, json.dumps(info.request, default=lambda o: getattr(o, "__dict__", str(o))),
        repr(runner.describe(handle)), repr(sched.describe(app_id)), repr(runner.status(handle)), repr(runner.list("ray")), *cli,
        _everything_under(tsm_home), _ray_files_since(start),
    ]
    assert app_id in texts[-1] and app_id in texts[-2]  # the files read are the app's (the driver's record, ...)
    _assert_nowhere([canary, nasty], texts)
    runner.remove([handle])
    assert not client.package_exists(uri)
    _assert_nowhere([canary, nasty], [_everything_under(tsm_home)])


@pytest.fixture
def worker(ray_cluster: RayCluster, tmp_path: Path) -> Iterator[WorkerNode]:  # noqa: F811
    node = WorkerNode(ray_cluster.address, tmp_path / "worker-node.log")
    try:
        yield node
    finally:
        node.kill()


def test_a_replica_restarted_on_another_node_gets_them_again(
        ray_cluster: RayCluster, worker: WorkerNode, tsm_home: Path, values: tuple[str, str],  # noqa: F811
        tmp_path: Path) -> None:
    from ray.job_submission import JobSubmissionClient

    from tsm.schedulers.ray import create_scheduler

    canary, nasty = values
    flag = tmp_path / "go"
    sched = create_scheduler("ray-secrets", address=ray_cluster.address)
    app = AppDef("lost", [Role("w", entrypoint=PY, args=["-c", LOST, str(flag)], num_replicas=2, max_retries=0,
                               retry_policy=RetryPolicy.REPLICA, resource=Resource(cpu=0.5, memMB=100),
                               secrets=["TOKEN:env:SRC", f"NASTY:file:{Path.cwd() / 'nasty'}"])])
    app_id = sched.submit(app, {"placement_strategy": "SPREAD", "max_preemptions": 1})
    reps = wait_for("both replicas running", lambda: (
        r if all(x.get("state") == "RUNNING" and x.get("pid") for x in r) else None)
        if (r := [record(sched, app_id, k) for k in (0, 1)]) else None)
    lost = [k for k in (0, 1) if reps[k]["node_id"] == worker.node_id]
    assert len(lost) == 1, f"SPREAD placed no replica on the worker node {worker.node_id}: {reps}"
    worker.kill()
    rep = wait_for("the lost replica's restart to end", lambda: (
        r if (r := record(sched, app_id, lost[0])).get("attempt") == 1 and r.get("state") == "SUCCEEDED" else None))
    assert rep["node_id"] != worker.node_id
    flag.write_text("go")
    final = sched.wait(app_id, timeout=HANG)
    assert final is not None and final.state == AppState.SUCCEEDED, final
    out = [ln.split() for ln in sched.log_iter(app_id, "w", lost[0], streams=Stream.STDOUT) if ln.startswith("SEEN")]
    assert out[-1] == ["SEEN", "1", "'preempted'", _sha(canary), _sha(nasty)], out
    job = JobSubmissionClient(ray_cluster.address).get_job_info(app_id)
    _assert_nowhere([canary, nasty], [_dump(job), _everything_under(tsm_home)])
    sched.close()
