"""The only module that talks to Docker (through the official ``docker`` SDK, extra ``tsm[docker]``).

Every Docker failure leaves as a :mod:`tsm.errors` class: an unreachable daemon is
:class:`SchedulerUnavailableError` saying how to start one; any other API error is :class:`SchedulerError`
with Docker's own words. One :meth:`DockerClient.list_containers` per status refresh serves every app; an
ended container is inspected once (its exit code, OOM flag and restart count) and cached by id.
"""

from __future__ import annotations

import contextlib
import io
import os
import threading
from collections.abc import Iterator
from typing import Any

from tsm.errors import SchedulerError, SchedulerUnavailableError
from tsm.schedulers.common.optional import import_client
from tsm.schedulers.docker.request import LABEL_APP, LABEL_SCHEDULER, ContainerSpec
from tsm.schedulers.docker.status import Observed, complete, from_summary

START_HINT = (
    "start Docker: `sudo scripts/docker-up` (or `sudo dockerd &`), or point DOCKER_HOST at a running engine"
)


class DockerClient:
    """A thin, typed wrapper of ``docker.DockerClient`` with tsm's error mapping and the inspect cache."""

    def __init__(self, timeout: float = 120.0) -> None:
        self._docker = import_client("docker", extra="docker", backend="docker")
        self._errors = import_client("docker.errors", extra="docker", backend="docker")
        self._timeout = timeout
        self._client: Any = None
        self._lock = threading.Lock()
        self._final: dict[str, Observed] = {}
        #: calls made, by name ("list", "inspect", "build", ...), for tests and benchmarks
        self.calls: dict[str, int] = {}

    # -- plumbing ---------------------------------------------------------------------------------------
    def _count(self, name: str) -> None:
        with self._lock:
            self.calls[name] = self.calls.get(name, 0) + 1

    @property
    def api(self) -> Any:
        """The connected low-level client; connecting errors say how to start Docker."""
        if self._client is None:
            try:
                client = self._docker.from_env(timeout=int(self._timeout))
                client.ping()
            except Exception as e:  # noqa: BLE001 (the SDK raises DockerException, requests' errors, OSError)
                raise SchedulerUnavailableError(f"cannot reach the Docker engine ({_short(e)}); {START_HINT}") from e
            self._client = client
        return self._client

    @contextlib.contextmanager
    def mapped(self, what: str) -> Iterator[None]:
        """Docker's exceptions as tsm's: connection problems -> unavailable, API errors -> SchedulerError."""
        try:
            yield
        except (SchedulerError, SchedulerUnavailableError):
            raise
        except self._errors.NotFound:
            raise
        except self._errors.APIError as e:
            raise SchedulerError(f"{what} failed: {_api_message(e)}") from e
        except (self._errors.DockerException, ConnectionError, OSError) as e:
            raise SchedulerUnavailableError(f"{what}: cannot reach the Docker engine ({_short(e)}); {START_HINT}") from e

    @property
    def NotFound(self) -> type[Exception]:  # noqa: N802 (the SDK's name)
        return self._errors.NotFound  # type: ignore[no-any-return]

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    # -- status -------------------------------------------------------------------------------------------
    def list_containers(self, app_id: str | None = None) -> list[Observed]:
        """Every tsm container (or one app's): one list call; ended ones completed by a cached inspect."""
        labels = [f"{LABEL_SCHEDULER}=docker"] + ([f"{LABEL_APP}={app_id}"] if app_id else [])
        self._count("list")
        with self.mapped("list containers"):
            summaries = self.api.api.containers(all=True, filters={"label": labels})
        out = []
        for s in summaries:
            obs = from_summary(s)
            cached = self._final.get(obs.id)
            if cached is not None:
                out.append(cached)
                continue
            if obs.state in ("exited", "dead"):
                try:
                    self._count("inspect")
                    with self.mapped("inspect container"):
                        attrs = self.api.api.inspect_container(obs.id)
                except self.NotFound:
                    continue  # removed between the list and the inspect
                complete(obs, attrs)
                if obs.final:
                    self._final[obs.id] = obs
            out.append(obs)
        return out

    def stats(self, container_id: str) -> dict[str, Any]:
        """One ``one_shot`` stats answer of a container (no second sample waited for), for the views' usage.

        Not mapped to tsm's errors: the caller treats any failure as "no figure", and reads the engine's
        own message to tell an engine too old for ``one_shot`` (API < 1.41).
        """
        self._count("stats")
        return dict(self.api.api.stats(container_id, stream=False, one_shot=True))

    def networks(self, app_id: str | None = None) -> list[Any]:
        labels = [f"{LABEL_SCHEDULER}=docker"] + ([f"{LABEL_APP}={app_id}"] if app_id else [])
        with self.mapped("list networks"):
            return list(self.api.networks.list(filters={"label": labels}))

    # -- images ---------------------------------------------------------------------------------------------
    def image_id(self, image: str) -> str | None:
        """The local id of ``image``, or None when it is not present here."""
        self._count("image_inspect")
        try:
            with self.mapped(f"inspect image {image}"):
                return str(self.api.images.get(image).id)
        except self.NotFound:
            return None

    def ensure_image(self, image: str, policy: str) -> str:
        """Make ``image`` present per ``policy``; returns "" when it is, else the reason it is not."""
        present = self.image_id(image) is not None
        if policy == "never" or (policy == "missing" and present):
            return "" if present else f"image {image!r} is not present locally and pull=never"
        repo, tag = _split_tag(image)
        self._count("pull")
        try:
            with self.mapped(f"pull {image}"):
                self.api.images.pull(repo, tag=tag)
        except (SchedulerError, SchedulerUnavailableError, self.NotFound) as e:
            # pull=always means "run what the registry has now": a local copy is not silently used instead
            return f"pulling image {image!r} failed (pull={policy}): {e}"
        return ""

    def build(self, context_tar: bytes, tag: str, labels: dict[str, str], dockerfile: str = "Dockerfile") -> str:
        """Build an image from a tar build context; returns its id. Failures carry the build's log tail."""
        self._count("build")
        with self.mapped(f"build {tag}"):
            try:
                image, _ = self.api.images.build(
                    fileobj=io.BytesIO(context_tar), custom_context=True, tag=tag, labels=labels, rm=True,
                    forcerm=True, dockerfile=dockerfile,
                )
            except self._errors.BuildError as e:
                tail = "".join(str(x.get("stream", x.get("error", ""))) for x in list(e.build_log)[-10:])
                raise SchedulerError(f"building the workspace image {tag} failed: {e.msg}\n{tail}") from e
        return str(image.id)

    # -- apps --------------------------------------------------------------------------------------------------
    def create_network(self, name: str, labels: dict[str, str]) -> None:
        with self.mapped(f"create network {name}"):
            self.api.networks.create(name, driver="bridge", labels=labels, check_duplicate=True)

    def run(self, c: ContainerSpec, network: str) -> None:
        """Create and start one replica's container on ``network`` (alias ``c.hostname``)."""
        docker = self._docker
        api = self.api.api
        host_config: dict[str, Any] = {
            "network_mode": network,
            "log_config": {"Type": "local", "Config": {}},
            "init": True,
        }
        if c.nano_cpus:
            host_config["nano_cpus"] = c.nano_cpus
        if c.mem_limit:
            host_config["mem_limit"] = c.mem_limit
            host_config["memswap_limit"] = c.mem_limit  # no swap: over the limit is OOM, not a crawl
        if c.shm_size:
            host_config["shm_size"] = c.shm_size
        if c.gpus:
            host_config["device_requests"] = [docker.types.DeviceRequest(count=c.gpus, capabilities=[["gpu"]])]
        if c.mounts:
            host_config["mounts"] = [
                docker.types.Mount(m["target"], m["source"], type=m["type"], read_only=m["read_only"]) for m in c.mounts
            ]
        if c.devices:
            host_config["devices"] = list(c.devices)
        if c.restart_max:
            host_config["restart_policy"] = {"Name": "on-failure", "MaximumRetryCount": c.restart_max}
        self._count("create")
        with self.mapped(f"create container {c.name}"):
            hc = api.create_host_config(**host_config)
            net = api.create_networking_config({network: api.create_endpoint_config(aliases=[c.hostname])})
            created = api.create_container(
                c.image, command=c.command[1:], entrypoint=[c.command[0]], environment=dict(c.env),
                hostname=c.hostname, labels=dict(c.labels), name=c.name, host_config=hc, networking_config=net,
                stop_timeout=int(round(c.stop_grace)), detach=True,
            )
            api.start(created["Id"])

    def stop(self, container_id: str, grace: float) -> None:
        """SIGTERM, then SIGKILL after ``grace`` seconds; a container already gone is fine."""
        self._count("stop")
        with contextlib.suppress(self.NotFound), self.mapped("stop container"):
            self.api.api.stop(container_id, timeout=int(round(grace)))

    def kill(self, container_id: str) -> None:
        """Stop at once (SIGKILL) as a manual stop, so Docker's restart policy does not start it again."""
        with contextlib.suppress(self.NotFound, SchedulerError), self.mapped("kill container"):
            self.api.api.stop(container_id, timeout=0)

    def remove_container(self, container_id: str) -> None:
        self._count("remove")
        with contextlib.suppress(self.NotFound), self.mapped("remove container"):
            self.api.api.remove_container(container_id, force=True, v=True)
        self._final.pop(container_id, None)

    def remove_network(self, name: str) -> None:
        """Remove a network; endpoints dockerd has not released yet (just-removed containers) are
        disconnected and the removal retried for a few seconds."""
        import time

        for attempt in range(20):
            try:
                with self.mapped(f"remove network {name}"):
                    self.api.api.remove_network(name)
                return
            except self.NotFound:
                return
            except SchedulerError as e:
                if "active endpoints" not in str(e) or attempt == 19:
                    raise
            with contextlib.suppress(Exception):
                info = self.api.api.inspect_network(name)
                for cid in info.get("Containers") or {}:
                    self.api.api.disconnect_container_from_network(cid, name, force=True)
            time.sleep(0.25)

    # -- logs ------------------------------------------------------------------------------------------------
    def logs(self, container: str, stdout: bool, stderr: bool, *, timestamps: bool = False,
             since: float | None = None, until: float | None = None) -> bytes:
        """What the container wrote to the chosen streams (Docker keeps their order when both are asked)."""
        kw: dict[str, Any] = {"stdout": stdout, "stderr": stderr, "timestamps": timestamps}
        if since is not None:
            kw["since"] = since
        if until is not None:
            kw["until"] = until
        self._count("logs")
        with self.mapped("read logs"):
            return bytes(self.api.api.logs(container, **kw))

    def follow(self, container: str, stdout: bool, stderr: bool, since: float | None = None) -> Iterator[bytes]:
        """Chunks of the container's output as they come, ending when the container stops."""
        kw: dict[str, Any] = {"stdout": stdout, "stderr": stderr, "stream": True, "follow": True}
        if since is not None:
            kw["since"] = since
        with self.mapped("follow logs"):
            stream = self.api.api.logs(container, **kw)
        yield from stream


def _split_tag(image: str) -> tuple[str, str | None]:
    if "@" in image:
        return image, None
    repo, sep, tag = image.rpartition(":")
    if not sep or "/" in tag:
        return image, "latest"
    return repo, tag


def _short(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0][:300] if text else type(e).__name__


def _api_message(e: Any) -> str:
    explanation = getattr(e, "explanation", None)
    return str(explanation or e).strip()[:500]


def docker_host_hint() -> str:
    """Where the SDK will connect (``DOCKER_HOST`` or the default socket), for messages."""
    return os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
