"""Issue 25 on Ray, pure: what the driver is handed for a time limit, a warning, preemptions and excluded
nodes, what the dry run says, how the status shows a preempted replica and the excluded nodes, and the
option the driver does not carry out yet refused. The driver itself runs on the real Ray head in
``tests/integration/test_ray_lifecycle.py`` and ``tests/integration/test_ray_long_runs.py`` (a second node
lost under a replica)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tsm.errors import InvalidRunOptionError
from tsm.schedulers.common.lifecycle_opts import DEFAULT_MAX_PREEMPTIONS
from tsm.schedulers.ray import status as st
from tsm.schedulers.ray.request import (
    META_ROLES,
    META_SCHEDULER,
    META_STOP_WAIT,
    DriverPayload,
    RayOptions,
    build_request,
    exclusion_selector,
    format_request,
    node_matches,
)
from tsm.specs.api import AppDef, AppState, Role


def _app() -> AppDef:
    return AppDef("a", [Role("w", image="", entrypoint=sys.executable, args=["-c", "pass"])])


def test_payload_carries_the_limit_and_the_warning() -> None:
    opts = RayOptions.from_cfg({"time_limit": "2h", "warn_signal": "usr1", "warn_before": "5m", "grace_period": 5})
    req = build_request(_app(), opts, "s", "http://h:8265", 0.0)
    p = req.payload
    assert (p.time_limit, p.warn_signal, p.warn_before) == (7200.0, "USR1", 300.0)
    assert p.replicas[0].env["TSM_WARN_SIGNAL"] == "USR1"
    # `ray job stop` must leave the driver the warning's time (Ray's default is 3 s)
    assert req.runtime_env["env_vars"]["RAY_JOB_STOP_WAIT_TIME_S"] == req.metadata[META_STOP_WAIT] == "320"
    assert DriverPayload.from_json(p.to_json()) == p
    text = format_request(req)
    assert "# time limit 2h, enforced by the driver; SIGUSR1 5m before it" in text
    assert "# on cancel: SIGUSR1, 5m, then SIGTERM" in text


def test_without_the_options_nothing_changes() -> None:
    req = build_request(_app(), RayOptions(), "s", "http://h:8265", 0.0)
    assert (req.payload.time_limit, req.payload.warn_signal) == (None, "")
    assert "RAY_JOB_STOP_WAIT_TIME_S" not in req.runtime_env["env_vars"] and META_STOP_WAIT not in req.metadata
    assert "TSM_WARN_SIGNAL" not in req.payload.replicas[0].env


def test_a_payload_written_before_the_options_still_reads() -> None:
    old = build_request(_app(), RayOptions(), "s", "http://h:8265", 0.0).payload
    data = json.loads(old.to_json())
    for k in ("time_limit", "warn_signal", "warn_before", "max_preemptions", "requeue_on_time_limit", "exclude_nodes"):
        data.pop(k)
    old = DriverPayload.from_json(json.dumps(data))
    assert (old.time_limit, old.max_preemptions, old.requeue_on_time_limit, old.exclude_nodes) == (
        None, DEFAULT_MAX_PREEMPTIONS, False, [])


def test_payload_carries_preemptions_requeue_and_excluded_nodes() -> None:
    opts = RayOptions.from_cfg({"time_limit": "1h", "requeue_on_time_limit": True, "max_preemptions": 5,
                                "exclude_nodes": ["10.0.0.7", "abcdef0123456789"]})
    p = build_request(_app(), opts, "s", "http://h:8265", 0.0).payload
    assert (p.max_preemptions, p.requeue_on_time_limit, p.exclude_nodes) == (5, True, ["10.0.0.7", "abcdef0123456789"])
    assert DriverPayload.from_json(p.to_json()) == p
    text = format_request(build_request(_app(), opts, "s", "http://h:8265", 0.0))
    assert "# at the time limit the app restarts, as a preemption" in text
    assert "restart elsewhere as a preemption (max_preemptions=5; max_retries untouched)" in text
    assert "# excluded nodes (by node id, IP or hostname): 10.0.0.7, abcdef0123456789" in text


def test_node_matches_ids_prefixes_ips_and_hostnames() -> None:
    nid = "67e886162393d0f899d9b0632b76dd0a565409d40ccd513b347666fc"
    assert node_matches(nid, nid, "10.0.0.7", "gpu3.cluster") and node_matches(nid[:8], nid, "", "")
    assert not node_matches(nid[:7], nid, "", "")  # too short a prefix to name one node
    assert node_matches("10.0.0.7", nid, "10.0.0.7", "") and not node_matches("10.0.0.70", nid, "10.0.0.7", "")
    assert node_matches("gpu3.cluster", nid, "", "gpu3.cluster") and node_matches("gpu3", nid, "", "gpu3.cluster")
    assert not node_matches("", nid, "", "") and not node_matches("gpu", nid, "", "gpu3.cluster")


def test_exclusion_selector_is_a_node_id_label_selector() -> None:
    assert exclusion_selector({"b", "a"}) == {"ray.io/node-id": "!in(a,b)"}
    assert exclusion_selector(set()) == {}


def test_status_shows_a_preempted_replica_and_the_excluded_nodes() -> None:
    nid = "67e886162393d0f899d9b0632b76dd0a565409d40ccd513b347666fc"
    why = f"preempted: node {nid[:12]} (10.0.0.7) was lost; restarted elsewhere (preemption 1 of max_preemptions=3)"
    record = {"state": "RUNNING", "msg": "", "num_restarts": 1, "roles": [["w", [
        {"state": "RUNNING", "node_ip": "10.0.0.8", "msg": why, "preempted": True, "restarts": 1},
        {"state": "RUNNING", "node_ip": "10.0.0.9", "msg": "", "preempted": False}]]],
        "excluded": [{"node_id": nid, "node_ip": "10.0.0.7", "why": "lost under role 'w' replica 0 (attempt 0)"}]}
    meta = {META_SCHEDULER: "ray", META_ROLES: json.dumps([["w", 2]])}
    d = st.describe("a-1", "RUNNING", "", meta, record)
    assert d.state == AppState.RUNNING and d.num_restarts == 1
    assert d.msg == f"excluded nodes: {nid[:12]} (10.0.0.7): lost under role 'w' replica 0 (attempt 0)"
    r0, r1 = d.roles_statuses[0].replicas
    assert (r0.preempted, r0.error_msg, r0.restarts) == (True, why, 1)
    assert (r1.preempted, r1.error_msg) == (False, "")
    failed = st.describe("a-1", "FAILED", "", meta, dict(record, state="FAILED", msg="role 'w' replica 1 exited with code 3"))
    assert failed.msg.startswith("role 'w' replica 1 exited with code 3; excluded nodes: 67e886162393 (10.0.0.7)")
    assert st.describe("a-1", "RUNNING", "", meta, dict(record, excluded=[])).msg == ""


def test_payload_carries_the_stall_rule() -> None:
    opts = RayOptions.from_cfg({"stall_timeout": "15m", "on_stall": "fail"})
    req = build_request(_app(), opts, "s", "http://h:8265", 0.0)
    assert (req.payload.stall_timeout, req.payload.on_stall) == (900.0, "fail")
    assert "# a replica without output and CPU for 15m is stalled: the app fails" in format_request(req)
    with pytest.raises(InvalidRunOptionError, match="on_stall"):
        RayOptions.from_cfg({"stall_timeout": "15m", "on_stall": "later"})


def test_last_line_and_session_cpu(tmp_path: Path) -> None:
    from tsm.schedulers.ray.driver import last_line, session_cpu

    log = tmp_path / "w.0.0.log"
    log.write_bytes(b"1.0 o first\n2.0 e second\n3.0 o \n")
    assert last_line(log) == "second"
    log.write_bytes(b"1.0 o first\n2.0 O no newline")
    assert last_line(log) == "no newline"
    assert last_line(tmp_path / "missing") == ""
    busy = subprocess.Popen([sys.executable, "-c", "import time\nt = time.process_time()\n"
                             "while time.process_time() - t < 0.3: pass\nprint('done', flush=True)\ntime.sleep(30)"],
                            stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert busy.stdout is not None and busy.stdout.readline() == b"done\n"
        assert session_cpu(busy.pid) >= 0.3 * os.sysconf("SC_CLK_TCK") - 1  # its own session's ticks
        assert session_cpu(2**22 + 7) == 0  # no such session
    finally:
        busy.kill()
        busy.wait()
