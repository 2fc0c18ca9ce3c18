"""Issue 25 on Ray, pure: what the driver is handed for a time limit and a warning, what the dry run says,
and the options the driver does not carry out yet refused. The driver itself runs on the real Ray head in
``tests/integration/test_ray_lifecycle.py``."""

from __future__ import annotations

import json
import sys

import pytest

from tsm.errors import InvalidRunOptionError
from tsm.schedulers.ray.request import (
    META_STOP_WAIT,
    DriverPayload,
    RayOptions,
    build_request,
    format_request,
)
from tsm.specs.api import AppDef, Role


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
    for k in ("time_limit", "warn_signal", "warn_before"):
        data.pop(k)
    assert DriverPayload.from_json(json.dumps(data)).time_limit is None


@pytest.mark.parametrize("cfg", [{"stall_timeout": "5m"}, {"exclude_nodes": "n1"}, {"max_preemptions": 5},
                                 {"time_limit": "1h", "requeue_on_time_limit": True}])
def test_options_not_carried_out_are_refused(cfg: dict[str, object]) -> None:
    with pytest.raises(InvalidRunOptionError, match="not supported on ray yet"):
        RayOptions.from_cfg(cfg)  # type: ignore[arg-type]
