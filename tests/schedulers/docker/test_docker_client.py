"""The one connect-and-ping of the Docker engine (:class:`tsm.workspace.image.DockerEngine`), shared by the
backend's container client and the images: an engine that is not there is one typed error saying how to
start Docker, from either."""

from __future__ import annotations

import pytest

from tsm.errors import SchedulerUnavailableError
from tsm.schedulers.docker.client import DockerClient
from tsm.workspace.image import START_HINT, DockerEngine, ImageEngine


@pytest.mark.parametrize("kind", [DockerClient, ImageEngine])
def test_an_engine_that_is_not_there_is_one_typed_error(kind: type[DockerEngine], tmp_path: object,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-such.sock")
    engine = kind(timeout=5)
    assert isinstance(engine, DockerEngine)
    with pytest.raises(SchedulerUnavailableError, match="cannot reach the Docker engine") as e:
        _ = engine.api
    assert str(e.value).endswith(START_HINT)
    engine.close()  # nothing was connected: closing is a no-op
