"""The pure request builder of the ray scheduler: AppDef -> the Ray job and the driver's payload (no cluster)."""

from __future__ import annotations

import json
import sys

import pytest

import hostile
from tsm.errors import InvalidAppError, InvalidRunOptionError
from tsm.schedulers.ray import create_scheduler
from tsm.schedulers.ray.client import DEFAULT_ADDRESS, resolve_address
from tsm.schedulers.ray.request import (
    META_APP,
    META_ROLES,
    META_SCHEDULER,
    DriverPayload,
    RayOptions,
    build_request,
    bundle_of,
    format_request,
)
from tsm.schedulers.ray.scheduler import parse_log
from tsm.schedulers.ray.status import describe
from tsm.specs.api import AppDef, AppState, Resource, RetryPolicy, Role, macros
from tsm.specs.mounts import BindMount


def _app(**kw: object) -> AppDef:
    return AppDef("train", [
        Role("trainer", entrypoint="python", args=["-c", "${replica_id}", macros.rank0_env, macros.app_id],
             env={"A": "b ${replica_id}"}, num_replicas=2, resource=Resource(cpu=2, gpu=0, memMB=1024), **kw),
        Role("ps", entrypoint="sh", args=["-c", "echo $$"], resource=Resource(cpu=1, memMB=0)),
    ])


def test_one_actor_per_replica_with_the_roles_resources_and_macros() -> None:
    req = build_request(_app(), RayOptions(), "sess", "http://h:8265", 100.0)
    p = req.payload
    assert [(r.role, r.replica_id, r.actor) for r in p.replicas] == [
        ("trainer", 0, f"{req.app_id}/trainer/0"), ("trainer", 1, f"{req.app_id}/trainer/1"),
        ("ps", 0, f"{req.app_id}/ps/0")]
    assert p.replicas[1].command == ["python", "-c", "1", "TSM_RANK0_HOST", req.app_id]
    assert p.replicas[1].env["A"] == "b 1"
    assert p.replicas[1].env["TSM_REPLICA_ID"] == "1" and p.replicas[1].env["TSM_NUM_REPLICAS"] == "2"
    assert "TSM_RANK0_HOST" not in p.replicas[0].env  # the driver adds it once rank 0 is placed
    assert p.replicas[0].bundle == {"CPU": 2.0, "memory": 1024.0 * 1024 * 1024}
    assert p.replicas[2].bundle == {"CPU": 1.0}
    assert p.strategy == "SPREAD" and p.gang_timeout == 120.0
    assert req.metadata[META_SCHEDULER] == "ray" and req.metadata[META_APP] == "train"
    assert json.loads(req.metadata[META_ROLES]) == [["trainer", 2], ["ps", 1]]
    assert req.entrypoint.startswith("python -m tsm.schedulers.ray.driver tsm_ray_payload_")


def test_bundles_never_empty_and_gpu_memory_only_when_asked() -> None:
    assert bundle_of(0, 0, 0) == {"CPU": 0.01}
    assert bundle_of(1, 2, 10) == {"CPU": 1.0, "GPU": 2.0, "memory": 10.0 * 1024 * 1024}


def test_payload_round_trips_hostile_values_through_ascii_json() -> None:
    args, env = hostile.args("/tmp/x"), hostile.env("/tmp/x")
    app = AppDef("h", [Role("r", entrypoint=sys.executable, args=args, env=env, resource=Resource(cpu=1, memMB=1))])
    req = build_request(app, RayOptions(), "s", DEFAULT_ADDRESS, 0.0)
    text = req.payload.to_json()
    assert text.isascii()
    back = DriverPayload.from_json(text)
    assert back == req.payload
    assert back.replicas[0].command[1:] == args
    assert {k: back.replicas[0].env[k] for k in env} == env


def test_dry_run_prints_the_submission_and_each_actor() -> None:
    s = create_scheduler("t", address="http://ray:8265")
    info = s.submit_dryrun(_app(), {"placement_strategy": "PACK", "gang_timeout": 5})
    text = str(info)
    assert "ray job submit --address http://ray:8265" in text and "PACK" in text and "timeout 5s" in text
    assert text.count("\nactor ") == 3
    assert format_request(info.request) == text


@pytest.mark.parametrize("cfg, match", [
    ({"placement_strategy": "STRICT_PACK"}, "placement_strategy"),
    ({"gang_timeout": 0}, "gang_timeout"),
    ({"grace_period": -1}, "grace_period"),
])
def test_bad_run_options_are_refused(cfg: dict[str, object], match: str) -> None:
    with pytest.raises(InvalidRunOptionError, match=match):
        create_scheduler("t").submit_dryrun(_app(), cfg)


def test_what_ray_cannot_run_is_refused() -> None:
    s = create_scheduler("t")
    with pytest.raises(InvalidAppError, match="mounts"):
        s.submit_dryrun(AppDef("m", [Role("r", entrypoint="x", resource=Resource(cpu=1, memMB=1),
                                          mounts=[BindMount("/a", "/b")])]))


def test_every_retry_policy_is_carried_to_the_driver() -> None:
    for policy in RetryPolicy:
        req = build_request(_app(max_retries=3, retry_policy=policy), RayOptions(), "s", DEFAULT_ADDRESS, 0.0)
        assert (req.payload.roles[0].max_retries, req.payload.roles[0].retry_policy) == (3, policy.value)


def test_address_option_then_env_then_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert resolve_address("") == DEFAULT_ADDRESS
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:8265")
    assert resolve_address("") == "http://10.0.0.1:8265"
    assert resolve_address("https://x:1") == "https://x:1"


def test_log_records_split_by_stream_and_time() -> None:
    raw = b"1.0 o a\n2.0 e b \xff\n3.0 O last"
    assert parse_log(raw, ["stdout"], None, None) == ["a\n", "last"]
    assert parse_log(raw, ["stderr"], None, None) == ["b \udcff\n"]
    assert parse_log(raw, ["stdout", "stderr"], None, None) == ["a\n", "b \udcff\n", "last"]
    from datetime import datetime, timezone

    assert parse_log(raw, ["stdout", "stderr"], datetime.fromtimestamp(1.5, timezone.utc),
                     datetime.fromtimestamp(2.5, timezone.utc)) == ["b \udcff\n"]


def test_status_combines_the_job_state_and_the_drivers_record() -> None:
    meta = {META_ROLES: json.dumps([["a", 2]]), "tsm.created": "5.0"}
    rec = {"state": "RUNNING", "msg": "", "num_restarts": 1, "roles": [["a", [
        {"state": "SUCCEEDED", "node_ip": "n1", "pid": 11, "exit_code": 0, "restarts": 0},
        {"state": "RUNNING", "node_ip": "n2", "pid": 12, "exit_code": None, "restarts": 1}]]]}
    d = describe("x", "RUNNING", "", meta, rec)
    assert d.state == AppState.RUNNING and d.num_restarts == 1 and d.created == 5.0
    assert [(r.state, r.hostname, r.pid, r.restarts) for r in d.roles_statuses[0].replicas] == [
        (AppState.SUCCEEDED, "n1", 11, 0), (AppState.RUNNING, "n2", 12, 1)]
    stopped = describe("x", "STOPPED", "", meta, rec)
    assert stopped.state == AppState.CANCELLED
    assert [r.state for r in stopped.roles_statuses[0].replicas] == [AppState.SUCCEEDED, AppState.CANCELLED]
    crashed = describe("x", "FAILED", "driver died", meta, None)
    assert crashed.state == AppState.FAILED and "driver died" in crashed.msg
    assert [r.state for r in crashed.roles_statuses[0].replicas] == [AppState.FAILED, AppState.FAILED]
    pending = describe("x", "PENDING", "", meta, None)
    assert pending.state == AppState.PENDING and len(pending.roles_statuses[0].replicas) == 2


def test_import_tsm_schedulers_ray_does_not_import_ray() -> None:
    import subprocess

    code = "import sys, tsm.schedulers.ray.scheduler; print('ray' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_list_rows_name_the_app_and_its_session() -> None:
    from tsm.schedulers.ray.status import list_row

    row = list_row("a-1", "STOPPED", {META_APP: "train", "tsm.session": "exp", "tsm.created": "3"})
    assert (row.app_id, row.state, row.name, row.app_handle, row.created) == (
        "a-1", AppState.CANCELLED, "train", "ray://exp/a-1", 3.0)
