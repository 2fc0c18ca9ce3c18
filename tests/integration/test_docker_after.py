"""``--after`` on the real Docker engine: containers made only once their local dependency succeeded."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from integration.after_checks import waits_for_local_apps
from integration.docker_engine import PYTHON_IMAGE, DockerEngine
from tsm.runner.api import get_runner
from tsm.schedulers.docker.scheduler import DockerScheduler
from tsm.specs.api import Resource, Role

pytestmark = [pytest.mark.integration, pytest.mark.docker]

SESSION = "afterit"


@pytest.fixture
def engine(docker_engine: DockerEngine) -> Iterator[None]:
    yield
    s = DockerScheduler(SESSION)
    s.cleanup(include_running=True, session=SESSION)
    s.close()


def test_a_docker_app_waits_for_local_apps_through_tsms_watcher(engine: None, tmp_path: Path) -> None:
    role = Role("r", image=PYTHON_IMAGE, entrypoint="python3", args=["-c", "print('ran')"],
                resource=Resource(cpu=1, memMB=200))
    with get_runner(SESSION) as runner:
        waits_for_local_apps(runner, "docker", role, {}, tmp_path)
