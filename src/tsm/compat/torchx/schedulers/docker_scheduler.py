"""TorchX's ``schedulers.docker_scheduler`` at TorchX's path: tsm's Docker scheduler under TorchX's names.

``DockerScheduler`` *is* tsm's (:class:`tsm.schedulers.docker.scheduler.DockerScheduler`), so a tool's
subclass (NeMo-Run's ``PersistentDockerScheduler(DockerScheduler)``, created with ``super().__init__(session_name)``)
runs on tsm's backend. ``DockerOpts`` is its typed options, ``DockerJob`` its request, ``_to_str`` the
bytes-or-text helper tools use on container logs. Importing this module does not import the Docker SDK.
"""

from __future__ import annotations

from tsm.schedulers.docker import create_scheduler as create_scheduler
from tsm.schedulers.docker.request import (
    LABEL_APP as LABEL_APP_ID,
    LABEL_REPLICA as LABEL_REPLICA_ID,
    LABEL_ROLE as LABEL_ROLE_NAME,
    DockerOptions as DockerOpts,
    DockerRequest as DockerJob,
)
from tsm.schedulers.docker.scheduler import DockerScheduler as DockerScheduler

__all__ = ["LABEL_APP_ID", "LABEL_REPLICA_ID", "LABEL_ROLE_NAME", "DockerJob", "DockerOpts", "DockerScheduler", "_to_str",
           "create_scheduler"]


def _to_str(a: str | bytes) -> str:
    """``a`` as text: bytes are decoded as UTF-8 (TorchX's helper for container log chunks)."""
    return a.decode("utf-8") if isinstance(a, bytes) else a
