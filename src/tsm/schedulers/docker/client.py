"""The only module that talks to Docker's containers (through the official ``docker`` SDK, extra ``tsm[docker]``).

Every Docker failure leaves as a :mod:`tsm.errors` class (the kit's :class:`~tsm.schedulers.common.errors.ClientBase`):
an unreachable daemon is :class:`SchedulerUnavailableError` saying how to start one; an API answer is
:class:`~tsm.schedulers.common.errors.ApiError` with Docker's words and its HTTP status (404: gone). One
:meth:`DockerClient.list_containers` per status refresh serves every app, selected by the scheduler and owner
labels (another user's containers on the same engine are never seen); an ended container is inspected once
(its exit code, OOM flag, restart count, start and end) and cached by id; one that ended by a signal is
checked against the daemon's start (:meth:`DockerClient.daemon_started`: a preemption by a daemon restart). Images are
:class:`tsm.workspace.image.ImageEngine`'s, shared with the Kubernetes backend.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

from tsm.errors import SchedulerError, TsmError
from tsm.schedulers.common.errors import ApiError, is_status
from tsm.schedulers.common.owner import owner
from tsm.schedulers.common.warn import handlers_script
from tsm.schedulers.docker.request import LABEL_APP, LABEL_FILLER, LABEL_OWNER, LABEL_SCHEDULER, ContainerSpec
from tsm.schedulers.docker.status import (
    DAEMON_EXITS,
    Observed,
    complete,
    ended_by_daemon_restart,
    from_summary,
    parse_time,
)
from tsm.workspace.image import DockerEngine

#: bytes per chunk when a container's log is streamed to a file
LOG_CHUNK = 1 << 16


class DockerClient(DockerEngine):
    """A thin, typed wrapper of ``docker.DockerClient`` (containers and networks) with the inspect cache;
    connecting is :class:`~tsm.workspace.image.DockerEngine`'s (shared with the images)."""

    def __init__(self, timeout: float = 120.0) -> None:
        super().__init__(timeout)
        self._final: dict[str, Observed] = {}
        #: the owner label value every object made gets and every list selects (tsm.schedulers.common.owner)
        self.owner = owner()

    def _labels(self, app_id: str | None) -> list[str]:
        return [f"{LABEL_SCHEDULER}=docker", f"{LABEL_OWNER}={self.owner}"] + ([f"{LABEL_APP}={app_id}"] if app_id else [])

    # -- status -------------------------------------------------------------------------------------------
    def list_containers(self, app_id: str | None = None) -> list[Observed]:
        """Every tsm container (or one app's): one list call; ended ones completed by a cached inspect."""
        with self.call("list"):
            summaries = self.api.api.containers(all=True, filters={"label": self._labels(app_id)})
        out = []
        started: list[float | None] = []  # the daemon's start, asked at most once per list
        for s in summaries:
            obs = from_summary(s)
            cached = self._final.get(obs.id)
            if cached is not None:
                out.append(cached)
                continue
            if obs.state in ("exited", "dead"):
                try:
                    with self.call("inspect"):
                        attrs = self.api.api.inspect_container(obs.id)
                except ApiError as e:
                    if e.status == 404:
                        continue  # removed between the list and the inspect
                    raise
                complete(obs, attrs)
                if obs.final and obs.exit_code in DAEMON_EXITS and not obs.oom_killed:
                    if not started:
                        started.append(self.daemon_started())
                    obs.preempted = ended_by_daemon_restart(obs, started[0])
                if obs.final:
                    self._final[obs.id] = obs
            out.append(obs)
        return out

    def daemon_started(self) -> float | None:
        """When the daemon answering now started (epoch seconds): the ``Created`` of its default ``bridge``
        network, which dockerd makes again at every start; None without one (``--bridge=none``) or on error.
        See :mod:`tsm.schedulers.docker.status` for what it tells."""
        try:
            with self.call("inspect network"):
                info = self.api.api.inspect_network("bridge")
        except (ApiError, SchedulerError):
            return None
        opts = info.get("Options") or {}
        if opts.get("com.docker.network.bridge.default_bridge") != "true":
            return None
        return parse_time(str(info.get("Created", "")))

    def restart_count(self, container_id: str) -> int:
        """How many times Docker's restart policy restarted a container (``RestartCount``: the list does not
        say it for a running one); 0 for a container gone."""
        try:
            with self.call("inspect"):
                return int(self.api.api.inspect_container(container_id).get("RestartCount", 0))
        except ApiError as e:
            if e.status != 404:
                raise
            return 0

    def stats(self, container_id: str) -> dict[str, Any]:
        """One ``one_shot`` stats answer of a container (no second sample waited for), for the views' usage.

        Not mapped to tsm's errors: the caller treats any failure as "no figure", and reads the engine's
        own message to tell an engine too old for ``one_shot`` (API < 1.41).
        """
        self.count("stats")
        return dict(self.api.api.stats(container_id, stream=False, one_shot=True))

    def networks(self, app_id: str | None = None) -> list[dict[str, Any]]:
        """``[{"Name", "Labels", "Created"}, ...]`` of this owner's tsm networks (or one app's)."""
        with self.call("list networks"):
            return [dict(n.attrs) for n in self.api.networks.list(filters={"label": self._labels(app_id)})]

    # -- apps --------------------------------------------------------------------------------------------------
    def create_network(self, name: str, labels: dict[str, str]) -> None:
        """Create the app's bridge network (labels: scheduler, app, session, owner)."""
        with self.call(f"create network {name}"):
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
        with self.call("create"):
            hc = api.create_host_config(**host_config)
            net = api.create_networking_config({network: api.create_endpoint_config(aliases=[c.hostname])})
            created = api.create_container(
                c.image, command=c.command[1:], entrypoint=[c.command[0]], environment=dict(c.env),
                hostname=c.hostname, labels=dict(c.labels), name=c.name, host_config=hc, networking_config=net,
                stop_timeout=int(round(c.stop_grace)), detach=True,
            )
            api.start(created["Id"])

    # -- secrets' volumes (tsm.schedulers.docker.secrets) ------------------------------------------------------
    def create_volume(self, name: str, labels: dict[str, str]) -> None:
        """Create a named volume (Docker's ``local`` driver) with ``labels``."""
        with self.call(f"create volume {name}"):
            self.api.api.create_volume(name, driver="local", labels=labels)

    def fill_volume(self, volume: str, image: str, target: str, tar: bytes, labels: dict[str, str], needs: str) -> bool:
        """Extract the archive ``tar`` into ``volume`` through a container of ``image`` that mounts it at
        ``target``, is never started and is removed at once (``labels``: what names it, should a crash leave
        it); False, with nothing written, when ``image`` has no file ``needs``."""
        api = self.api.api
        mount = self._docker.types.Mount(target, volume, type="volume")
        with self.call("create"):
            created = api.create_container(image, command=[], entrypoint=[needs], labels=dict(labels),
                                           host_config=api.create_host_config(mounts=[mount]),
                                           network_disabled=True, detach=True)
        try:
            try:
                with self.call("archive"):
                    stream, _stat = api.get_archive(created["Id"], needs)
                    for _chunk in stream:  # read whole: the connection goes back to the pool
                        pass
            except ApiError as e:
                if e.status == 404:
                    return False
                raise
            with self.call("archive"):
                api.put_archive(created["Id"], target, tar)
            return True
        finally:
            self.remove_container(created["Id"])

    def volumes(self, app_id: str | None = None) -> list[dict[str, Any]]:
        """``[{"Name", "Labels", "CreatedAt"}, ...]`` of this owner's tsm volumes (or one app's)."""
        with self.call("list volumes"):
            found = self.api.api.volumes(filters={"label": self._labels(app_id)})
        return [dict(v) for v in (found or {}).get("Volumes") or []]

    def remove_secrets(self, app_id: str) -> None:
        """Remove an app's secrets volumes, and first any container that was filling one (a crash left it);
        one already gone is fine."""
        with self.call("list"):
            fillers = self.api.api.containers(all=True, filters={"label": [
                LABEL_FILLER, f"{LABEL_OWNER}={self.owner}", f"{LABEL_APP}={app_id}"]})
        for f in fillers:
            self.remove_container(str(f["Id"]))
        for vol in self.volumes(app_id):
            try:
                with self.call("remove volume"):
                    self.api.api.remove_volume(str(vol["Name"]))
            except ApiError as e:
                if e.status != 404:
                    raise

    def stop(self, container_id: str, grace: float) -> None:
        """SIGTERM, then SIGKILL after ``grace`` seconds; a container already gone is fine."""
        try:
            with self.call("stop"):
                self.api.api.stop(container_id, timeout=int(round(grace)))
        except ApiError as e:
            if e.status != 404:
                raise

    def wait_ended(self, container_id: str, timeout: float) -> bool:
        """Block until the container is not running (Docker's ``wait``, ``condition=not-running``) or
        ``timeout`` seconds pass; True when it ended (or is gone), False on the timeout or an error."""
        try:
            with self.call("wait"):
                self.api.api.wait(container_id, timeout=max(1, int(round(timeout))), condition="not-running")
            return True
        except ApiError as e:
            return e.status == 404
        except Exception:  # noqa: BLE001 (the timeout: requests' ReadTimeout, however the SDK wraps it)
            return False

    def signal(self, container_id: str, signame: str) -> None:
        """Send the warning ``signame`` (``USR1``) to every process of the container that handles
        it (:func:`~tsm.schedulers.common.warn.handlers_script`, run with ``exec``): a launcher over the
        program (``torchrun``, a ``bash -c`` wrapper) ends at a signal it does not handle. An image without
        ``/bin/sh`` gets it in its main process, as Docker's ``kill`` sends it. A container already ended or
        gone is fine."""
        try:
            with self.call("exec"):
                # attached (stdout): exec_start returns once the script has ended, so its exit code is known
                run = self.api.api.exec_create(container_id, ["/bin/sh", "-c", handlers_script(signame)],
                                               stdout=True, stderr=True)
                self.api.api.exec_start(run["Id"])
                info = self.api.api.exec_inspect(run["Id"])
                deadline = time.monotonic() + 10.0
                while info.get("Running") and time.monotonic() < deadline:
                    time.sleep(0.05)
                    info = self.api.api.exec_inspect(run["Id"])
            if info.get("ExitCode") not in (126, 127):  # sent, or no process handles it (spared); never twice
                return
        except ApiError as e:
            if e.status in (404, 409):  # gone, or not running
                return
        try:  # the image has no /bin/sh: its main process, as `docker kill --signal`
            with self.call("kill"):
                self.api.api.kill(container_id, signal="SIG" + signame.removeprefix("SIG"))
        except ApiError as e:
            if e.status not in (404, 409):  # gone, or not running
                raise

    def kill(self, container_id: str) -> None:
        """Stop at once (SIGKILL) as a manual stop, so Docker's restart policy does not start it again."""
        with contextlib.suppress(SchedulerError), self.call("kill"):
            self.api.api.stop(container_id, timeout=0)

    def remove_container(self, container_id: str) -> None:
        """Remove a container (force: a running one is killed); one already gone is fine."""
        try:
            with self.call("remove"):
                self.api.api.remove_container(container_id, force=True, v=True)
        except ApiError as e:
            if e.status != 404:
                raise
        self._final.pop(container_id, None)

    def remove_network(self, name: str) -> bool:
        """Remove a network; True when it is gone. False while dockerd still holds endpoints of just-removed
        containers (they are disconnected here: the caller polls again); a missing network is gone."""
        try:
            with self.call("remove network"):
                self.api.api.remove_network(name)
            return True
        except ApiError as e:
            if e.status == 404:
                return True
            if "active endpoints" not in str(e):
                raise
        with contextlib.suppress(TsmError), self.call("disconnect"):
            info = self.api.api.inspect_network(name)
            for cid in info.get("Containers") or {}:
                self.api.api.disconnect_container_from_network(cid, name, force=True)
        return False

    # -- logs ------------------------------------------------------------------------------------------------
    def logs(self, container: str, stdout: bool, stderr: bool, *, timestamps: bool = False,
             since: float | None = None, until: float | None = None, tail: int | None = None) -> bytes:
        """What the container wrote to the chosen streams (Docker keeps their order when both are asked);
        ``tail``: only its last lines."""
        kw: dict[str, Any] = {"stdout": stdout, "stderr": stderr, "timestamps": timestamps}
        if tail is not None:
            kw["tail"] = tail
        if since is not None:
            kw["since"] = since
        if until is not None:
            kw["until"] = until
        with self.call("logs"):
            return bytes(self.api.api.logs(container, **kw))

    def log_chunks(self, container: str, stdout: bool, stderr: bool, *, timestamps: bool = False) -> Iterator[bytes]:
        """What the container wrote so far, in chunks as Docker sends them (never held whole in memory)."""
        with self.call("logs"):
            stream = self.api.api.logs(container, stdout=stdout, stderr=stderr, timestamps=timestamps,
                                       stream=True, follow=False)
        try:
            with self.call("logs", count=False):
                yield from stream
        finally:
            with contextlib.suppress(Exception):
                stream.close()

    def follow(self, container: str, stdout: bool, stderr: bool, since: float | None = None) -> Iterator[bytes]:
        """Chunks of the container's output as they come, ending when the container stops."""
        kw: dict[str, Any] = {"stdout": stdout, "stderr": stderr, "stream": True, "follow": True}
        if since is not None:
            kw["since"] = since
        with self.call("follow logs"):
            stream = self.api.api.logs(container, **kw)
        with self.call("follow logs", count=False):
            yield from stream



def docker_host_hint() -> str:
    """Where the SDK will connect (``DOCKER_HOST`` or the default socket), for messages."""
    import os

    return os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")


__all__ = ["LOG_CHUNK", "DockerClient", "is_status"]
