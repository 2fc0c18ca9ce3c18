"""Secrets on Docker (:mod:`tsm.specs.secrets`): each role's values in a Docker volume of its own, mounted
read-only into its containers and read into the environment by a shell just before the program starts.

At dry run (:func:`~tsm.schedulers.docker.request.plan_secrets`, pure) a role that declares secrets gets the volume ``tsm-<app_id>-secrets-<i>``
mounted read-only at :data:`SECRETS_DIR`, and its command wrapped as ``/bin/sh -c SCRIPT tsm-secrets
ENTRYPOINT ARGS...``: :func:`~tsm.schedulers.docker.request.script` reads each file ``SECRETS_DIR/NAME`` into the variable ``NAME`` with the
shell's own ``read`` (byte-exact: every newline, quote, ``$`` and space kept; no program needed but the
shell), exports it and runs the program (``exec``) with its argv as given. The request (kept in
``request.json``), the dry run and the container's config (``docker inspect``: env, command, labels, mounts)
hold the names and declarations only.

At submit (:func:`deliver`, in the submitting process) the values are read (:func:`tsm.specs.secrets.resolve`)
and written into each volume through Docker's archive API, by a container that is created, never started,
and removed at once; it also tells an image without ``/bin/sh`` (then the submit fails saying so). So a
value lives in the volume's files only: under Docker's data root (root's alone on a standard engine), and
0444 there, so the container's process reads it whatever uid it runs as; never in a file of ``$TSM_HOME``
nor anywhere on the submitting host (a remote ``DOCKER_HOST`` works as a local one). A replica that Docker
restarts, or that a retry replaces, mounts the same volume again. The volumes go with the app's containers
(:func:`drop`: cancel, ``remove_finished``, ``tsm rm``, cleanup; cleanup also removes those a crashed
launcher left, :func:`drop_orphans`).
"""

from __future__ import annotations

import io
import tarfile
import time
from collections.abc import Mapping
from datetime import datetime

from tsm.errors import SubmissionError
from tsm.schedulers.docker.request import (  # the dry run's half (pure) lives with the request
    LABEL_APP,
    LABEL_FILLER,
    LABEL_OWNER,
    LABEL_ROLE,
    LABEL_SCHEDULER,
    LABEL_SESSION,
    SECRETS_DIR,
    SHELL,
    volumes,
)
from tsm.schedulers.docker.status import parse_time
from tsm.specs.secrets import parse_secret, resolve

TYPE_CHECKING = False
if TYPE_CHECKING:
    from tsm.schedulers.docker.client import DockerClient
    from tsm.schedulers.docker.request import DockerRequest

#: Seconds a volume of an app without containers counts as being submitted (cleanup leaves it).
ORPHAN_AGE = 60.0


def read_values(req: DockerRequest) -> dict[str, str]:
    """The values of ``req``'s secrets, read now (a :class:`~tsm.errors.SecretError` names one missing)."""
    return resolve([parse_secret(s) for s in req.secrets]) if req.secrets else {}


def tar_of(files: Mapping[str, bytes]) -> bytes:
    """A tar archive of ``files`` (name -> content), each 0444 and owned by root."""
    buf = io.BytesIO()
    now = int(time.time())
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o444, now
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def deliver(client: DockerClient, req: DockerRequest, values: Mapping[str, str]) -> None:
    """Make each secrets volume of ``req`` and write its role's ``values`` into it (see the module docstring);
    a :class:`~tsm.errors.SubmissionError` for a role whose image has no :data:`SHELL`."""
    for name, (role, image, names) in volumes(req).items():
        labels = {LABEL_SCHEDULER: "docker", LABEL_APP: req.app_id, LABEL_SESSION: req.session,
                  LABEL_OWNER: req.owner or client.owner, LABEL_ROLE: role}
        client.create_volume(name, labels)
        filler = {LABEL_FILLER: name, LABEL_APP: req.app_id, LABEL_OWNER: labels[LABEL_OWNER]}
        if not client.fill_volume(name, image, SECRETS_DIR, tar_of({n: values[n].encode() for n in names}),
                                  filler, needs=SHELL):
            raise SubmissionError(
                f"role '{role}': image {image} has no {SHELL}; on Docker a role's secrets become its environment "
                f"through {SHELL} in the image (it reads them from files before the program starts): use an image "
                "with a shell, or run this role without secrets"
            )


def drop(client: DockerClient, app_id: str, req: DockerRequest | None) -> None:
    """Remove the secrets volumes of an app whose containers are gone (and a filler a crash left); nothing
    to ask Docker for an app whose request (``req``) has no secrets."""
    if req is None or req.secrets:
        client.remove_secrets(app_id)


def drop_orphans(client: DockerClient, in_use: set[str], session: str | None = None) -> None:
    """Remove the secrets volumes of this owner's apps that have no container left (a launcher that
    crashed), except those made in the last :data:`ORPHAN_AGE` seconds (an app being submitted)."""
    apps: set[str] = set()
    for vol in client.volumes():
        labels = vol.get("Labels") or {}
        app = labels.get(LABEL_APP)
        if not app or app in in_use or (session is not None and labels.get(LABEL_SESSION) not in (None, session)):
            continue
        made = _when(str(vol.get("CreatedAt", "")))
        if made is not None and time.time() - made >= ORPHAN_AGE:
            apps.add(app)
    for app in sorted(apps):
        client.remove_secrets(app)


def _when(text: str) -> float | None:
    """Docker's time of a volume (RFC 3339, ``Z`` or an offset) as epoch seconds; None when unreadable."""
    when = parse_time(text)
    if when is not None:
        return when
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None
