"""The runner's part of exec, stack and port-forward: which replicas a target names, when one is not running,
and how stacks of many replicas are folded. Pure functions over real response values (no scheduler needed)."""

from __future__ import annotations

import pytest

from tsm.errors import NotSupportedError, ReplicaNotRunningError, UnknownAppError, UsageError
from tsm.runner.api import Runner
from tsm.runner.debug import check_running, select_replicas
from tsm.runner.stacks import StackReport, group_stacks, ranges, render
from tsm.schedulers.api import DescribeAppResponse, ProcessStack, ReplicaStack
from tsm.specs.api import AppDef, AppState, ReplicaStatus, Role, RoleStatus

H = "local://default/app-1"


def desc(state: AppState = AppState.RUNNING, rep_states: tuple[AppState, ...] = (AppState.RUNNING,) * 3,
         ) -> DescribeAppResponse:
    app = AppDef("app", [Role("trainer", "img", num_replicas=len(rep_states)), Role("ps", "img")])
    return DescribeAppResponse(app_id="app-1", state=state, app=app, roles_statuses=[
        RoleStatus("trainer", [ReplicaStatus(i, s, "trainer") for i, s in enumerate(rep_states)]),
        RoleStatus("ps", [ReplicaStatus(0, AppState.RUNNING, "ps")])])


def test_select_replicas_names_every_one_or_exactly_one() -> None:
    d = desc()
    assert select_replicas(H, d, None, None, one=False) == [("trainer", 0), ("trainer", 1), ("trainer", 2), ("ps", 0)]
    assert select_replicas(H, d, "trainer", None, one=False) == [("trainer", 0), ("trainer", 1), ("trainer", 2)]
    assert select_replicas(H, d, "trainer", 2, one=True) == [("trainer", 2)]
    assert select_replicas(H, d, "ps", None, one=True) == [("ps", 0)]  # a role of one replica needs no index
    with pytest.raises(UsageError, match=r"name one replica: .* \(replicas: trainer/0..2, ps/0\)"):
        select_replicas(H, d, "trainer", None, one=True)
    with pytest.raises(UnknownAppError, match=r"has no role 'x' \(roles: trainer, ps\)"):
        select_replicas(H, d, "x", None, one=False)
    with pytest.raises(UnknownAppError, match=r"has replicas 0..2, not 3"):
        select_replicas(H, d, "trainer", 3, one=True)


def test_check_running_says_ended_or_not_started() -> None:
    check_running(H, desc(), [("trainer", 1)], "exec into")
    with pytest.raises(ReplicaNotRunningError, match=r"has ended \(FAILED\): there is no replica to dump"):
        check_running(H, desc(AppState.FAILED), [("trainer", 1)], "dump")
    with pytest.raises(ReplicaNotRunningError, match=r"has not started yet \(PENDING\)"):
        check_running(H, desc(AppState.PENDING), [("trainer", 1)], "dump")
    mixed = desc(rep_states=(AppState.RUNNING, AppState.PENDING, AppState.SUCCEEDED))
    with pytest.raises(ReplicaNotRunningError, match=r"replica trainer/1 of .* has not started yet"):
        check_running(H, mixed, [("trainer", 1)], "exec into")
    with pytest.raises(ReplicaNotRunningError, match=r"replica trainer/2 of .* has ended \(SUCCEEDED\)"):
        check_running(H, mixed, [("trainer", 2)], "exec into")
    check_running(H, mixed, [("trainer", 0), ("trainer", 1)], "dump")  # many: each replica says for itself


def frames(*names: str, line: int = 1) -> list[dict[str, object]]:
    return [{"name": n, "short_filename": "train.py", "line": line} for n in names]


def replica(k: int, *names: str, line: int = 1) -> ReplicaStack:
    threads = [{"thread_name": "MainThread", "os_thread_id": 100 + k, "active": False,
                "frames": frames(*names, line=line)}]
    return ReplicaStack("trainer", k, [ProcessStack(100 + k, "python train.py", threads)])


def test_group_stacks_folds_alike_replicas_and_marks_the_one_that_differs() -> None:
    reps = [replica(k, "allreduce", "step", "main", line=k) for k in range(8)]
    reps[3] = replica(3, "load_batch", "step", "main")
    failed = ReplicaStack("trainer", 8, error="py-spy is not installed")
    groups = group_stacks([*reps, failed])
    assert [g.replicas for g in groups] == [[f"trainer/{k}" for k in (0, 1, 2, 4, 5, 6, 7)], ["trainer/3"]]
    assert [g.outlier for g in groups] == [False, True]  # line numbers alone do not split a group
    text = render(StackReport(H, [*reps, failed], groups))
    assert text.startswith("== trainer/0-2, trainer/4-7 (7 replicas with the same stacks)\n")
    assert "== trainer/3 (1 replica)  <-- differs\n" in text
    assert text.index("load_batch (train.py:1)") > text.index("<-- differs")
    assert StackReport(H, [*reps, failed], groups).errors == [("trainer/8", "py-spy is not installed")]


def test_one_group_has_no_outlier_and_ranges_join_runs() -> None:
    groups = group_stacks([replica(0, "f"), replica(1, "f")])
    assert len(groups) == 1 and not groups[0].outlier
    assert ranges(["a/0", "a/1", "a/3", "b/4", "b/5"]) == "a/0-1, a/3, b/4-5"


def test_a_scheduler_without_the_capability_says_so() -> None:
    from tsm.schedulers.api import Scheduler

    class NoDebug(Scheduler):  # a real (if minimal) scheduler that declares none of the capabilities
        def _submit_dryrun(self, app, cfg):  # type: ignore[no-untyped-def]
            raise NotImplementedError

        def schedule(self, dryrun_info):  # type: ignore[no-untyped-def]
            raise NotImplementedError

        def describe(self, app_id):  # type: ignore[no-untyped-def]
            return desc()

        def list(self):  # type: ignore[no-untyped-def]
            return []

        def cancel(self, app_id):  # type: ignore[no-untyped-def]
            pass

    runner = Runner("default", {"plain": lambda session_name, **kw: NoDebug("plain", session_name)})
    for call in (lambda: runner.exec_replica("plain://default/app-1", "ps", 0, ["true"]),
                 lambda: runner.replica_stacks("plain://default/app-1"),
                 lambda: runner.port_forward("plain://default/app-1", "ps", 0, 80)):
        with pytest.raises(NotSupportedError, match="the plain scheduler cannot"):
            call()
