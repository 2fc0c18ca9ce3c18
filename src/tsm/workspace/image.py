"""A workspace as a container image on the local Docker engine, for every container backend.

Two steps, split the way the schedulers need them (the plan at dry run, the build at ``schedule``):

* :func:`plan_image` -- snapshot the workspace (:class:`~tsm.workspace.dir.DirWorkspace`, the exact bytes
  that are hashed), choose the Dockerfile (``Dockerfile.tsm`` in the workspace when present, else
  ``FROM <role image>`` + ``WORKDIR /workspace`` + ``COPY . /workspace``), and tag the result with
  :func:`~tsm.workspace.api.image_tag` of the snapshot's digest and the base image's *id* plus the
  Dockerfile: the same content on the same base gives the same tag. The role is pointed at the tag and its
  metadata (:data:`~tsm.workspace.api.METADATA_KEY`) records the plan, so the dry run shows it.
* :func:`build_image` -- build the plan's image unless its tag is already on the engine (then nothing is
  built: an unchanged workspace costs one image inspect), from a deterministic build context
  (:func:`~tsm.workspace.dir.write_context_tar`) filtered by the workspace's ``.dockerignore``.

The Docker backend runs the image on that engine; the Kubernetes backend relies on the kubelet using the
same engine (dockershim on the node that runs tsm, as ``scripts/k8s-up`` sets up) with
``imagePullPolicy: IfNotPresent``, so no registry is involved. The Docker client is the docker backend's
:class:`~tsm.schedulers.docker.client.DockerClient` (the ``docker`` package, imported on first use).
"""

from __future__ import annotations

import io
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tsm.errors import SubmissionError
from tsm.specs.api import Role
from tsm.workspace.api import METADATA_KEY, image_tag

if TYPE_CHECKING:
    from tsm.schedulers.docker.client import DockerClient

#: the name the generated Dockerfile has in the build context (the engine leaves it out of the image)
BUILD_DOCKERFILE = ".tsm-build.Dockerfile"
#: a Dockerfile the user keeps in the workspace to replace the generated one
CUSTOM_DOCKERFILE = "Dockerfile.tsm"
#: labels every workspace image carries
LABEL_WORKSPACE = "tsm.workspace"
LABEL_BASE_ID = "tsm.base-image-id"


@dataclass(frozen=True)
class ImagePlan:
    """One role's workspace image: what it is built from and the tag it gets (``build``: not present yet)."""

    role: str
    snapshot: str
    base_image: str
    base_image_id: str
    tag: str
    dockerfile: str
    build: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_metadata(cls, role: Role) -> ImagePlan | None:
        """The plan :func:`plan_image` recorded in ``role``'s metadata, if the role still runs its tag."""
        ws = role.metadata.get(METADATA_KEY)
        if not isinstance(ws, dict) or ws.get("docker_tag") != role.image:
            return None
        try:
            return cls(role=role.name, snapshot=str(ws["snapshot"]), base_image=str(ws["base_image"]),
                       base_image_id=str(ws["base_image_id"]), tag=str(ws["docker_tag"]),
                       dockerfile=str(ws["dockerfile"]), build=bool(ws["build"]))
        except KeyError:
            return None


def docker_client() -> DockerClient:
    """The local engine's client (the ``docker`` package is imported here, on first use)."""
    from tsm.schedulers.docker.client import DockerClient

    return DockerClient()


def plan_image(role: Role, workspace: str, client: DockerClient, pull: str = "missing") -> ImagePlan:
    """Snapshot ``workspace`` and point ``role`` at the tag of its image on ``role.image`` (built later).

    The base image is pulled per ``pull`` (``missing``/``always``/``never``) when it is not present, since
    its id is part of the tag. Raises :class:`SubmissionError` when the base image cannot be had.
    """
    from tsm.workspace.dir import DirWorkspace

    report = DirWorkspace().build(workspace)
    base = role.image
    base_id = client.image_id(base)
    if base_id is None:
        why = client.ensure_image(base, pull)
        base_id = client.image_id(base)
        if base_id is None:
            raise SubmissionError(f"workspace image: base image of role '{role.name}': {why or repr(base) + ' not found'}")
    custom = Path(report.snapshot) / CUSTOM_DOCKERFILE
    dockerfile = custom.read_text() if custom.is_file() else f"FROM {base}\nWORKDIR /workspace\nCOPY . /workspace\n"
    tag = image_tag(report.digest, base_id + "\0" + dockerfile)
    plan = ImagePlan(role=role.name, snapshot=report.snapshot, base_image=base, base_image_id=base_id, tag=tag,
                     dockerfile=dockerfile, build=client.image_id(tag) is None)
    role.image = tag
    role.metadata[METADATA_KEY] = {
        "workspace": os.path.abspath(workspace), "digest": report.digest, "snapshot": report.snapshot,
        "files": report.files, "bytes": report.bytes, "base_image": base, "base_image_id": base_id,
        "docker_tag": tag, "dockerfile": dockerfile, "build": plan.build,
    }
    return plan


def context_tar(snapshot: str, dockerfile: str) -> bytes:
    """The build context: the snapshot (less what its ``.dockerignore`` excludes) plus the Dockerfile."""
    from tsm.schedulers.docker.dockerignore import filter_tar
    from tsm.workspace.dir import write_context_tar

    try:
        user_ignore = (Path(snapshot) / ".dockerignore").read_text()
    except OSError:
        user_ignore = ""
    # The engine does not apply .dockerignore to a context (the docker CLI does): the context is filtered
    # here by the user's rules. The engine then drops the generated Dockerfile and the ignore file from the
    # image, because the ignore file it receives names them.
    ignore = f"{user_ignore}\n{BUILD_DOCKERFILE}\n.dockerignore\n"
    buf = io.BytesIO()
    write_context_tar(snapshot, buf, extra={BUILD_DOCKERFILE: dockerfile.encode(), ".dockerignore": ignore.encode()})
    return filter_tar(buf.getvalue(), f"{user_ignore}\n!{BUILD_DOCKERFILE}\n!.dockerignore\n")


def build_image(plan: ImagePlan, client: DockerClient) -> bool:
    """Build ``plan``'s image unless its tag is on the engine already; True when it built one."""
    if client.image_id(plan.tag) is not None:
        return False
    client.build(context_tar(plan.snapshot, plan.dockerfile), plan.tag,
                 {LABEL_WORKSPACE: "1", LABEL_BASE_ID: plan.base_image_id}, dockerfile=BUILD_DOCKERFILE)
    return True


def pull_policy(cfg: Mapping[str, Any]) -> str:
    """The Docker pull policy a scheduler's ``cfg`` asks for (``pull``), default ``missing``."""
    return str(cfg.get("pull") or "missing")


__all__ = ["BUILD_DOCKERFILE", "ImagePlan", "build_image", "context_tar", "docker_client", "plan_image", "pull_policy"]
