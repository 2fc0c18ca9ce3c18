"""Runs the scheduler contract (:mod:`conformance`) against every backend: local, the in-memory fake, and
Slurm on the real cluster of ``scripts/slurm-up`` (integration-marked: skipped without a cluster, except
under CI, where it must run)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import conformance
import pytest
from conformance import BACKENDS, CHECKS, MAKERS, Backend

from integration.slurm_cluster import slurm_cluster  # noqa: F401 (the fixture the slurm backend asks for)

#: Contract cases a backend is known to fail today, as (backend, check) -> reason; each is a strict xfail,
#: so the day the backend is fixed the suite says so and the entry must go.
KNOWN_FAILURES: dict[tuple[str, str], str] = {}


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    if request.param == "slurm":
        request.getfixturevalue("slurm_cluster")
    gen = MAKERS[request.param](tmp_path)
    yield next(gen)
    next(gen, None)


@pytest.mark.parametrize("check", sorted(CHECKS))
def test_contract(backend: Backend, check: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    reason = KNOWN_FAILURES.get((backend.name, check))
    if reason:
        request.applymarker(pytest.mark.xfail(strict=True, reason=reason))
    fn = CHECKS[check]
    kwargs: dict[str, Any] = {"tmp_path": tmp_path} if "tmp_path" in fn.__code__.co_varnames else {}
    fn(backend, **kwargs)


def test_every_check_is_run() -> None:
    """A check_* function added to the suite is picked up (the suite cannot shrink silently)."""
    assert len(CHECKS) >= 10
    assert all(callable(getattr(conformance, f"check_{name}")) for name in CHECKS)


def test_the_fake_serves_a_runner() -> None:
    """Runner tests can run on the fake: it launches, waits, reads logs and lists through the runner."""
    import sys

    from fake import create_scheduler

    from tsm.runner.api import Runner
    from tsm.specs.api import AppDef, AppState, Resource, Role

    runner = Runner("t", scheduler_factories={"fake": create_scheduler})
    code = "import os; print(os.environ['TSM_APP_HANDLE'])"
    app = AppDef(
        "echo", [Role("r", entrypoint=sys.executable, args=["-c", code], resource=Resource(cpu=1, memMB=64))]
    )
    handle = runner.run(app, scheduler="fake")
    status = runner.wait(handle, timeout=conformance.HANG)
    assert status is not None and status.state == AppState.SUCCEEDED
    assert list(runner.log_lines(handle, "r", 0)) == [handle + "\n"]
    assert handle in [row.app_handle for row in runner.list()]
    runner.cancel(handle)  # ended: nothing happens
    assert runner.status("fake://t/fake-0-0") is None


def test_the_fake_refuses_a_missing_program_and_leaves_nothing_running(tmp_path: Path) -> None:
    """A replica that cannot start fails the submission and stops the replicas started before it."""
    import sys

    from fake import FakeScheduler

    from tsm.errors import SubmissionError
    from tsm.specs.api import AppDef, Role

    s = FakeScheduler("t")
    ok = Role("a", entrypoint=sys.executable, args=["-c", "import time; time.sleep(600)"])
    missing = Role("b", entrypoint=str(tmp_path / "no-such-program"))
    with pytest.raises(SubmissionError, match="could not start"):
        s.submit(AppDef("broken", [ok, missing]))
    (row,) = s.list()
    desc = s.describe(row.app_id)
    assert desc is not None and desc.state.is_terminal and "could not start" in desc.msg
    pid = desc.roles_statuses[0].replicas[0].pid
    assert pid is not None and not conformance._alive(pid)
