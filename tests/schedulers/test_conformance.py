"""Runs the scheduler contract (:mod:`conformance`) against every backend: local, the in-memory fake, the
Docker and Kubernetes schedulers on their fake engines (``docker/fake_docker.py``, ``kubernetes/fake_kube.py``:
the real schedulers and clients over an in-memory engine, in the fast suite), and Slurm on the real cluster
of ``scripts/slurm-up`` (integration-marked: skipped without a cluster, except under CI, where it must run).
The real Docker and Kubernetes engines run the same contract in ``tests/integration``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import conformance
import pytest
from conformance import BACKENDS, CHECKS, MAKERS, Backend

from integration.slurm_cluster import slurm_cluster  # noqa: F401 (the fixture the slurm backend asks for)
from tsm.specs.api import AppDryRunInfo, Role

_NOT_UTF8 = "the API carries JSON text: the corpus's values that are not UTF-8 are refused at dry run (tested apart)"
_ONE_LOG = "Kubernetes keeps stdout and stderr in one log: asking for one stream is refused (NotSupportedError)"
#: Contract cases a backend is known to fail today, as (backend, check) -> reason; each is a strict xfail,
#: so the day the backend is fixed the suite says so and the entry must go.
KNOWN_FAILURES: dict[tuple[str, str], str] = {
    ("docker-fake", "args_and_env_arrive_byte_exact"): _NOT_UTF8,
    ("kubernetes-fake", "args_and_env_arrive_byte_exact"): _ONE_LOG,
    ("kubernetes-fake", "log_iter_names_valid_roles_and_replicas"): _ONE_LOG,
    ("kubernetes-fake", "logs_follow_filter_and_split_streams"): _ONE_LOG,
}


#: Contract cases a backend answers elsewhere, as (backend, check) -> where (skipped here, never counted).
ELSEWHERE: dict[tuple[str, str], str] = {
    (b, c): "Slurm counts time limits in whole minutes (a 1s limit would be one): "
            "tests/integration/test_slurm_lifecycle.py checks its long runs"
    for b in ("slurm",)
    for c in ("time_limit_ends_the_app_with_the_policys_message", "requeue_at_the_time_limit_spends_the_preemption_budget",
              "the_warning_comes_before_the_time_limit")
}


class ImageBackend(Backend):
    """A container backend's: roles run ``python`` from an image (the fakes ignore the image)."""

    def role(self, name: str, *args: str, **kw: Any) -> Role:
        return Role(name, image="fake/python", entrypoint=conformance.PY, args=list(args), resource=conformance.SMALL,
                    **kw)


def _docker_fake(tmp_path: Path) -> Iterator[Backend]:
    from schedulers.docker.fake_docker import FakeDockerEngine, FakeImages, fake_client
    from tsm.schedulers.docker.scheduler import DockerScheduler

    engine = FakeDockerEngine()
    s = DockerScheduler("conformance", client=fake_client(engine), images=FakeImages())

    def check(app_id: str, info: AppDryRunInfo[Any]) -> None:
        made = [a for name, a in engine.calls if name == "create_container"]
        assert [m["name"] for m in made] == [c.name for c in info.request.containers]
        held = {c.name: c for c in engine.by_id.values()}
        for c in info.request.containers:
            assert held[c.name].command == c.command and held[c.name].env == c.env

    yield ImageBackend("docker-fake", s, "nosuchapp-00000000", check, retries=True)
    s.cleanup(include_running=True)
    s.close()


def _kubernetes_fake(tmp_path: Path) -> Iterator[Backend]:
    from schedulers.kubernetes.fake_kube import FakeCluster
    from tsm.schedulers.kubernetes.scheduler import KubernetesScheduler

    cluster = FakeCluster()
    s = KubernetesScheduler("conformance", client=cluster.client())

    def check(app_id: str, info: AppDryRunInfo[Any]) -> None:
        jobs = {j["metadata"]["name"]: j for j in cluster.jobs.values()}
        for j in info.request.jobs:
            held = jobs[j["metadata"]["name"]]
            assert held["spec"]["template"]["spec"]["containers"] == j["spec"]["template"]["spec"]["containers"]

    yield ImageBackend("kubernetes-fake", s, "nosuchapp-00000000", check, retries=True,
                       cfg={"gang_timeout": 60.0, "dns": "yes"})
    s.cleanup(include_running=True)
    s.close()
    cluster.close()


ALL_MAKERS = {**MAKERS, "docker-fake": _docker_fake, "kubernetes-fake": _kubernetes_fake}


#: every (backend, check) pair the contract holds the backend to: the ELSEWHERE pairs are not generated (their
#: rule is checked by the test named there), so nothing here is skipped
CONTRACT = [
    pytest.param(p.values[0], check, id=f"{p.id}-{check}", marks=p.marks)
    for p in [*BACKENDS, pytest.param("docker-fake", id="docker-fake"), pytest.param("kubernetes-fake", id="kubernetes-fake")]
    for check in sorted(CHECKS)
    if (p.values[0], check) not in ELSEWHERE
]


@pytest.fixture
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    if request.param == "slurm":
        request.getfixturevalue("slurm_cluster")
    gen = ALL_MAKERS[request.param](tmp_path)
    yield next(gen)
    next(gen, None)


@pytest.mark.parametrize(("backend", "check"), CONTRACT, indirect=["backend"])
def test_contract(backend: Backend, check: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    reason = KNOWN_FAILURES.get((backend.name, check))
    if reason:
        request.applymarker(pytest.mark.xfail(strict=True, reason=reason))
    fn = CHECKS[check]
    kwargs: dict[str, Any] = {"tmp_path": tmp_path} if "tmp_path" in fn.__code__.co_varnames else {}
    fn(backend, **kwargs)


def test_the_checks_left_to_other_tests_name_a_test_that_exists() -> None:
    """Each pair not generated (ELSEWHERE) names the test file that checks its rule, and that file exists."""
    root = Path(__file__).resolve().parents[2]
    for (name, check), why in ELSEWHERE.items():
        assert check in CHECKS, (name, check)
        assert any((root / w).is_file() for w in why.split() if w.startswith("tests/")), why


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
