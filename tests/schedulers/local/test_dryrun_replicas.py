"""The local dry run of many replicas (issue 26): a role without ``${replica_id}`` has its macros applied
once and its exec size counted once, and must still give every replica exactly what a per-replica pass
gives, including the same exec-size error naming the first replica over the limit."""

from __future__ import annotations

import os

import pytest

from tsm.errors import InvalidAppError
from tsm.schedulers.local.scheduler import LocalScheduler
from tsm.specs import AppDef, Role
from tsm.specs.validate import check_exec_size, exec_limit


def test_replicas_get_their_own_ids_and_macros(sched: LocalScheduler) -> None:
    roles = [
        Role("plain", entrypoint="echo", args=["${app_id}", "x"], env={"A": "${img_root}"}, num_replicas=12),
        Role("per", entrypoint="echo", args=["${replica_id}", "${app_id}"], env={"R": "r${replica_id}"},
             num_replicas=12),
    ]
    req = sched.submit_dryrun(AppDef("ids", roles)).request
    app_id = req.app_id
    plain, per = req.roles
    for k, rep in enumerate(plain.replicas):
        assert rep.cmd[-2:] == [app_id, "x"]
        assert rep.env["TSM_REPLICA_ID"] == str(k) and rep.env["A"] == rep.cwd
    for k, rep in enumerate(per.replicas):
        assert rep.cmd[-2:] == [str(k), app_id]
        assert rep.env["TSM_REPLICA_ID"] == str(k) and rep.env["R"] == f"r{k}"
    assert plain.replicas[0].env is not plain.replicas[1].env  # each replica's environment is its own


def test_the_first_replica_over_the_exec_limit_is_named(sched: LocalScheduler) -> None:
    # Replica 10's TSM_REPLICA_ID is one byte longer than replica 0's: pad the environment so that replica 0
    # fills the limit exactly; replicas 0-9 then fit and replica 10 is the first that does not.
    role = Role("r", entrypoint="true", num_replicas=11)
    rep0 = sched.submit_dryrun(AppDef("big", [role])).request.roles[0].replicas[0]
    room = exec_limit() - check_exec_size("r", rep0.cmd, {**os.environ, **rep0.env})
    pad: dict[str, str] = {}
    j = 0
    while room > 0:
        name = f"PAD_{j}"
        cost = room if room <= 100_000 else min(100_000, room - 64)  # the last one never too small
        value = "x" * (cost - len(name) - 2 - 8)  # "NAME=value", its NUL, its pointer
        pad[name] = value
        room -= cost
        j += 1
    assert room == 0
    role = Role("r", entrypoint="true", env=pad, num_replicas=11)
    first = sched.submit_dryrun(AppDef("big", [Role("r", entrypoint="true", env=pad, num_replicas=10)]))
    assert len(first.request.roles[0].replicas) == 10  # replicas 0-9 fit exactly
    with pytest.raises(InvalidAppError, match=r"role 'r' replica 10: the command line and environment take"):
        sched.submit_dryrun(AppDef("big", [role]))
