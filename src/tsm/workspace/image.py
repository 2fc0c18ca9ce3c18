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
``imagePullPolicy: IfNotPresent``, so no registry is involved. Both talk to the engine's images through
:class:`ImageEngine` here (the ``docker`` package, imported on first use), so neither backend imports the
other; the Docker backend's own client handles containers only. Both that client and :class:`ImageEngine`
connect through :class:`DockerEngine` (connect, ping, error translation: written once).
"""

from __future__ import annotations

import io
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tsm.errors import SchedulerError, SchedulerUnavailableError, SubmissionError, TsmError
from tsm.schedulers.common.errors import ApiError, ClientBase
from tsm.specs.api import Role
from tsm.workspace.api import METADATA_KEY, image_tag

START_HINT = (
    "start Docker: `sudo scripts/docker-up` (or `sudo dockerd &`), or point DOCKER_HOST at a running engine"
)

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


def short_error(e: BaseException) -> str:
    """The first line of an exception's text (at most 300 characters), or its type's name."""
    text = str(e).strip().splitlines()
    return text[0][:300] if text else type(e).__name__


def docker_translate(what: str, e: BaseException, errors: Any) -> TsmError | None:
    """A ``docker`` SDK exception as tsm's: an HTTP answer is :class:`ApiError` (its status kept), a
    connection problem :class:`SchedulerUnavailableError` saying how to start Docker; others pass."""
    if isinstance(e, errors.APIError):
        status = getattr(getattr(e, "response", None), "status_code", None)
        text = str(getattr(e, "explanation", None) or e).strip()[:500]
        return ApiError(f"{what} failed: {text}", status)
    if isinstance(e, (errors.DockerException, ConnectionError, OSError)):
        return SchedulerUnavailableError(f"{what}: cannot reach the Docker engine ({short_error(e)}); {START_HINT}")
    return None


class DockerEngine(ClientBase):
    """One connection to the Docker engine (the ``docker`` package, imported on first use), counted and
    with its errors translated (:func:`docker_translate`): the base of :class:`ImageEngine` (images) and the
    Docker backend's ``DockerClient`` (containers and networks), so connecting is written once.

    :attr:`api` connects on first use and pings, so an engine that is not there is one
    :class:`SchedulerUnavailableError` saying how to start Docker, not an error of the first real call.
    """

    def __init__(self, timeout: float) -> None:
        super().__init__()
        from tsm.schedulers.common.optional import import_client

        self._docker = import_client("docker", extra="docker", backend="docker")
        self._errors = import_client("docker.errors", extra="docker", backend="docker")
        self._timeout = timeout
        self._client: Any = None

    @property
    def api(self) -> Any:
        """The connected ``docker.DockerClient``; connecting errors say how to start Docker."""
        if self._client is None:
            try:
                client = self._docker.from_env(timeout=int(self._timeout))
                client.ping()
            except Exception as e:  # noqa: BLE001 (the SDK raises DockerException, requests' errors, OSError)
                raise SchedulerUnavailableError(f"cannot reach the Docker engine ({short_error(e)}); {START_HINT}") from e
            self._client = client
        return self._client

    def translate(self, what: str, e: BaseException) -> TsmError | None:
        return docker_translate(what, e, self._errors)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


class ImageEngine(DockerEngine):
    """The images of the local Docker engine: look up, pull per a policy, build (calls counted)."""

    def __init__(self, timeout: float = 600.0) -> None:
        super().__init__(timeout)

    def image_id(self, image: str) -> str | None:
        """The local id of ``image``, or None when it is not present here."""
        try:
            with self.call("image_inspect"):
                return str(self.api.images.get(image).id)
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    def ensure_image(self, image: str, policy: str) -> str:
        """Make ``image`` present per ``policy``; returns "" when it is, else the reason it is not."""
        present = self.image_id(image) is not None
        if policy == "never" or (policy == "missing" and present):
            return "" if present else f"image {image!r} is not present locally and pull=never"
        repo, tag = _split_tag(image)
        try:
            with self.call("pull"):
                self.api.images.pull(repo, tag=tag)
        except (SchedulerError, SchedulerUnavailableError) as e:
            # pull=always means "run what the registry has now": a local copy is not silently used instead
            return f"pulling image {image!r} failed (pull={policy}): {e}"
        return ""

    def build(self, context: bytes, tag: str, labels: dict[str, str], dockerfile: str = "Dockerfile") -> str:
        """Build an image from a tar build context; returns its id. Failures carry the build's log tail."""
        try:
            with self.call("build"):
                image, _ = self.api.images.build(
                    fileobj=io.BytesIO(context), custom_context=True, tag=tag, labels=labels, rm=True,
                    forcerm=True, dockerfile=dockerfile,
                )
        except Exception as e:
            if isinstance(e, self._errors.BuildError):
                tail = "".join(str(x.get("stream", x.get("error", ""))) for x in list(e.build_log)[-10:])
                raise SchedulerError(f"building the workspace image {tag} failed: {e.msg}\n{tail}") from e
            raise
        return str(image.id)


def _split_tag(image: str) -> tuple[str, str | None]:
    if "@" in image:
        return image, None
    repo, sep, tag = image.rpartition(":")
    if not sep or "/" in tag:
        return image, "latest"
    return repo, tag


def docker_client() -> ImageEngine:
    """The local engine's images (the ``docker`` package is imported here, on first use)."""
    return ImageEngine()


def plan_image(role: Role, workspace: str, client: ImageEngine, pull: str = "missing") -> ImagePlan:
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
    from tsm.workspace.dir import write_context_tar
    from tsm.workspace.dockerignore import filter_tar

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


def build_image(plan: ImagePlan, client: ImageEngine) -> bool:
    """Build ``plan``'s image unless its tag is on the engine already; True when it built one."""
    if client.image_id(plan.tag) is not None:
        return False
    client.build(context_tar(plan.snapshot, plan.dockerfile), plan.tag,
                 {LABEL_WORKSPACE: "1", LABEL_BASE_ID: plan.base_image_id}, dockerfile=BUILD_DOCKERFILE)
    return True


def pull_policy(cfg: Mapping[str, Any]) -> str:
    """The Docker pull policy a scheduler's ``cfg`` asks for (``pull``), default ``missing``."""
    return str(cfg.get("pull") or "missing")


__all__ = ["BUILD_DOCKERFILE", "DockerEngine", "ImageEngine", "ImagePlan", "build_image", "context_tar", "docker_client",
           "docker_translate", "plan_image", "pull_policy", "short_error"]
