"""The runner refuses a role's lockfile environment on a backend that does not build them (never ignores it)."""

from __future__ import annotations

import pytest

import tsm
from schedulers.fake import create_scheduler
from tsm.errors import NotSupportedError
from tsm.runner.api import Runner
from tsm.schedulers.api import LockfileEnvironments
from tsm.schedulers.local.scheduler import LocalScheduler


def test_a_backend_without_the_capability_refuses_a_role_with_an_environment() -> None:
    role = tsm.Role("r", entrypoint="python", args=["-c", "pass"], environment=tsm.Environment("uv.lock"))
    runner = Runner("t", scheduler_factories={"fake": create_scheduler})
    with runner, pytest.raises(NotSupportedError, match="does not build lockfile environments"):
        runner.dryrun(tsm.AppDef("a", roles=[role]), "fake")


def test_the_backends_that_build_them_declare_it() -> None:
    from tsm.schedulers.docker.scheduler import DockerScheduler
    from tsm.schedulers.kubernetes.scheduler import KubernetesScheduler
    from tsm.schedulers.ray.scheduler import RayScheduler
    from tsm.schedulers.slurm.scheduler import SlurmScheduler

    for cls in (LocalScheduler, SlurmScheduler, DockerScheduler, KubernetesScheduler, RayScheduler):
        assert issubclass(cls, LockfileEnvironments), cls


def test_role_environment_round_trips_through_the_app_json() -> None:
    role = tsm.Role("r", entrypoint="python", environment=tsm.Environment("/x/uv.lock", python="3.12"))
    back = tsm.AppDef.from_dict(tsm.AppDef("a", roles=[role]).to_dict())
    assert back.roles[0].environment == tsm.Environment("/x/uv.lock", python="3.12")
    plain = tsm.AppDef.from_dict(tsm.AppDef("a", roles=[tsm.Role("r", entrypoint="x")]).to_dict())
    assert plain.roles[0].environment is None
