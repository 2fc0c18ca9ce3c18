"""``tsm exec``, ``tsm stack`` and ``tsm port-forward`` on the real Docker engine of ``scripts/docker-up``.

The image (``tsm-test/python``: busybox and python3) has no py-spy: the first ``tsm stack`` copies this host's
into the container, as it would for any user's image.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from integration.debug_checks import check_all, debug_app, tsm
from integration.docker_engine import PYTHON_IMAGE, DockerEngine
from tsm.cli import _exits
from tsm.runner.api import Runner, get_runner

pytestmark = [pytest.mark.integration, pytest.mark.docker]


@pytest.fixture
def runner(docker_engine: DockerEngine) -> Iterator[Runner]:
    with get_runner() as r:
        yield r


def test_exec_stack_and_port_forward_reach_the_container(runner: Runner) -> None:
    handle = runner.run(debug_app(PYTHON_IMAGE), "docker")
    try:
        check_all(runner, handle, cwd="/")
    finally:
        runner.cancel(handle)
    r = tsm("exec", f"{handle}/trainer/0", "--", "true")
    assert r.returncode == _exits.NOT_RUNNING and r.stderr.count("\n") == 1, r.stderr
