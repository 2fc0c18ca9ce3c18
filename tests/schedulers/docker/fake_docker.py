"""A fake Docker engine in memory, behind the real :class:`DockerClient`: the fast suite's Docker.

:class:`FakeDockerEngine` answers the calls the ``docker`` SDK's low-level client would make (the same
method names and arguments, the same JSON shapes, ``docker.errors`` with HTTP statuses), so everything of
tsm above the SDK runs as on a real engine: label filters, the error mapping, the inspect cache, the
scheduler's controller. A container is a local process (:class:`~schedulers.common.fake_process.FakeProcess`:
the image is ignored); Docker's restart policy ``on-failure:N``, stop with a grace period and SIGKILL,
``RestartCount``, exit codes 128+signal, logs kept per stream with timestamps, networks with endpoints.

Volumes (the secrets' ones, :mod:`tsm.schedulers.docker.secrets`) are host folders: a container mounting one
runs with the mount's target in its command replaced by the folder (a process has no mount namespace), and
the archive API extracts into it.

Scripted behaviour: :attr:`FakeDockerEngine.unstartable` images fail at start (as a missing entrypoint does);
:meth:`FakeDockerEngine.daemon_restart` ends containers as a stopping dockerd does (SIGTERM) and moves the
daemon's start (the ``Created`` of its default ``bridge`` network) to now.
Every call is recorded in :attr:`FakeDockerEngine.calls` (name, args) for tests that check what was asked.

    engine = FakeDockerEngine()
    sched = DockerScheduler("t", client=fake_client(engine), images=FakeImages())
"""

from __future__ import annotations

import io
import os
import re
import secrets
import shutil
import signal
import signal as _signal
import tarfile
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import docker.errors
import requests

from schedulers.common.fake_process import FakeProcess, rfc3339, stamp
from tsm.schedulers.common.errors import ClientBase
from tsm.schedulers.docker.client import DockerClient
from tsm.workspace.image import ImageEngine


class _Response:
    def __init__(self, status: int) -> None:
        self.status_code = status
        self.reason = {404: "Not Found", 409: "Conflict", 500: "Server Error"}.get(status, "")


def api_error(status: int, message: str) -> docker.errors.APIError:
    cls = docker.errors.NotFound if status == 404 else docker.errors.APIError
    return cls(message, response=_Response(status), explanation=message)  # type: ignore[no-untyped-call]


@dataclass
class FakeContainer:
    id: str
    name: str
    labels: dict[str, str]
    command: list[str]
    env: dict[str, str]
    restart_max: int
    created: float
    state: str = "created"
    restarts: int = 0
    stopped_by_hand: bool = False
    runs: list[FakeProcess] = field(default_factory=list)
    error: str = ""
    networks: list[str] = field(default_factory=list)
    #: mount target -> the name of the volume mounted there
    volumes: dict[str, str] = field(default_factory=dict)

    @property
    def current(self) -> FakeProcess | None:
        return self.runs[-1] if self.runs else None


class _Network:
    def __init__(self, attrs: dict[str, Any]) -> None:
        self.attrs = attrs
        self.name = attrs["Name"]


class FakeDockerEngine:
    """The engine (see the module docstring); ``api`` is what ``docker.DockerClient.api`` would be."""

    def __init__(self) -> None:
        self.by_id: dict[str, FakeContainer] = {}
        self.nets: dict[str, dict[str, Any]] = {}
        #: name -> {"Name", "Labels", "CreatedAt", "dir"}: its files are the host folder ``dir``
        self.vols: dict[str, dict[str, Any]] = {}
        self.unstartable: set[str] = set()
        self.calls: list[tuple[str, Any]] = []
        self.execs: dict[str, tuple[FakeProcess, list[str]]] = {}
        self.exec_codes: dict[str, int | None] = {}
        #: False: the containers' images have no /bin/sh (an exec fails with 126, as runc's does)
        self.shell = True
        self.lock = threading.RLock()
        self.api = self  # docker.DockerClient().api: the low-level client
        self.networks = _Networks(self)
        #: when the daemon last started (its default bridge's ``Created``); None: it has no default bridge
        self.daemon_started: float | None = None

    # -- lookup -------------------------------------------------------------------------------------------
    def _get(self, ref: str) -> FakeContainer:
        with self.lock:
            c = self.by_id.get(ref) or next((c for c in self.by_id.values() if c.name == ref), None)
        if c is None:
            raise api_error(404, f"No such container: {ref}")
        return c

    @staticmethod
    def _matches(labels: dict[str, str], filters: dict[str, Any] | None) -> bool:
        for sel in (filters or {}).get("label", []):
            k, eq, v = sel.partition("=")
            if (eq and labels.get(k) != v) or (not eq and k not in labels):
                return False
        return True

    # -- containers -----------------------------------------------------------------------------------------
    def containers(self, all: bool = False, filters: dict[str, Any] | None = None) -> list[dict[str, Any]]:  # noqa: A002
        self.calls.append(("containers", filters))
        with self.lock:
            found = [c for c in self.by_id.values() if self._matches(c.labels, filters)]
        out = []
        for c in found:
            p = c.current
            status = f"Exited ({p.returncode}) 1 second ago" if c.state == "exited" and p else c.state.capitalize()
            out.append({"Id": c.id, "Names": ["/" + c.name], "State": c.state, "Status": status,
                        "Labels": dict(c.labels), "Created": int(c.created)})
        return out

    def inspect_container(self, ref: str) -> dict[str, Any]:
        self.calls.append(("inspect_container", ref))
        c = self._get(ref)
        p = c.current
        return {"Id": c.id, "Name": "/" + c.name, "RestartCount": c.restarts, "State": {
            "Status": c.state, "ExitCode": (p.returncode or 0) if p else 0, "OOMKilled": False, "Error": c.error,
            "Restarting": c.state == "restarting", "StartedAt": rfc3339(c.runs[0].started) if c.runs and c.runs[0].started else "0001-01-01T00:00:00Z",
            "FinishedAt": rfc3339(p.finished) if p and p.finished else "0001-01-01T00:00:00Z",
        }}

    def create_host_config(self, **kw: Any) -> dict[str, Any]:
        return dict(kw)

    def create_networking_config(self, endpoints: dict[str, Any]) -> dict[str, Any]:
        return {"EndpointsConfig": endpoints}

    def create_endpoint_config(self, **kw: Any) -> dict[str, Any]:
        return dict(kw)

    def create_container(self, image: str, command: list[str], entrypoint: list[str],
                         environment: dict[str, str] | None = None, hostname: str = "",
                         labels: dict[str, str] | None = None, name: str = "",
                         host_config: dict[str, Any] | None = None, networking_config: dict[str, Any] | None = None,
                         stop_timeout: int = 10, detach: bool = True, network_disabled: bool = False) -> dict[str, str]:
        labels, host_config = labels or {}, host_config or {}
        self.calls.append(("create_container", {"name": name, "hostname": hostname, "labels": labels, "image": image}))
        if len(hostname) > 63:  # what runc answers for a host name Linux refuses
            raise api_error(500, f"OCI runtime create failed: sethostname: invalid argument ({hostname!r})")
        with self.lock:
            name = name or f"fake-{secrets.token_hex(4)}"
            if any(c.name == name for c in self.by_id.values()):
                raise api_error(409, f'Conflict. The container name "/{name}" is already in use')
            mounted = {str(m["Target"]): str(m["Source"]) for m in host_config.get("mounts") or [] if m["Type"] == "volume"}
            missing = [v for v in mounted.values() if v not in self.vols]
            if missing:  # Docker would make it; tsm always makes its volumes first
                raise api_error(404, f"fake engine: no volume {missing[0]}")
            argv = [*entrypoint, *command]
            for target, vol in mounted.items():
                argv = [a.replace(target, self.vols[vol]["dir"]) for a in argv]
            policy = host_config.get("restart_policy") or {}
            c = FakeContainer(secrets.token_hex(32), name, dict(labels), argv, dict(environment or {}),
                              int(policy.get("MaximumRetryCount", 0)), time.time())
            c.networks = list((networking_config or {}).get("EndpointsConfig") or [])
            c.volumes = mounted
            c.labels["image"] = image
            self.by_id[c.id] = c
        return {"Id": c.id}

    def start(self, ref: str) -> None:
        self.calls.append(("start", ref))
        c = self._get(ref)
        if c.labels.get("image") in self.unstartable:
            c.state, c.error = "created", "exec: no such file"
            raise api_error(500, f"OCI runtime create failed: exec: {c.command[0]!r}: no such file or directory")
        self._run(c)

    def _run(self, c: FakeContainer) -> None:
        p = FakeProcess(c.command, c.env)
        c.runs.append(p)
        if not p.start():
            c.state, c.error = "created", p.error
            raise api_error(500, f"OCI runtime create failed: {p.error}")
        c.state = "running"
        threading.Thread(target=self._watch, args=(c, p), daemon=True).start()

    def _watch(self, c: FakeContainer, p: FakeProcess) -> None:
        rc = p.wait()
        with self.lock:
            if rc != 0 and not c.stopped_by_hand and c.restarts < c.restart_max and c.id in self.by_id:
                c.state = "restarting"
                c.restarts += 1
            else:
                c.state = "exited"
                return
        time.sleep(0.05)
        with self.lock:
            if c.id in self.by_id and not c.stopped_by_hand:
                self._run(c)
            else:
                c.state = "exited"

    def stop(self, ref: str, timeout: int = 10) -> None:
        self.calls.append(("stop", ref))
        c = self._get(ref)
        c.stopped_by_hand = True
        p = c.current
        if p is not None and p.running:
            p.stop(float(timeout))
            while c.state == "running":
                time.sleep(0.01)
        if c.state == "restarting":
            c.state = "exited"

    def wait(self, ref: str, timeout: int | None = None, condition: str | None = None) -> dict[str, Any]:
        """Docker's wait (``condition=not-running``): until the container is not running; the SDK's read
        timeout (``requests``' ReadTimeout) after ``timeout`` seconds."""
        self.calls.append(("wait", ref))
        c = self._get(ref)
        deadline = time.monotonic() + (timeout if timeout is not None else 1e9)
        while c.state in ("running", "restarting"):
            if time.monotonic() > deadline:
                raise requests.exceptions.ReadTimeout("read timed out")
            time.sleep(0.01)
        p = c.current
        return {"StatusCode": p.returncode if p is not None else 0}

    def daemon_restart(self, ids: list[str] | None = None) -> None:
        """What a dockerd restart does to the running containers ``ids`` (default: every running one): each
        is ended by SIGTERM, as a stopping daemon does, and not restarted; then the daemon "starts" again
        (:attr:`daemon_started` is now, after every end)."""
        with self.lock:
            chosen = [c for c in self.by_id.values() if (ids is None or c.id in ids) and c.state == "running"]
        for c in chosen:
            c.stopped_by_hand = True
            p = c.current
            if p is not None and p.running:
                p.signal(_signal.SIGTERM)
            while c.state == "running":  # the watcher records the end
                time.sleep(0.01)
        self.daemon_started = time.time()

    def kill(self, ref: str, signal: str = "SIGKILL") -> None:
        """Docker's kill: send ``signal`` (a name such as ``SIGUSR1``) to the running process; 409 if none."""
        self.calls.append(("kill", ref, signal))
        c = self._get(ref)
        p = c.current
        if p is None or not p.running:
            raise api_error(409, f"Container {ref} is not running")
        p.signal(int(_signal.Signals[signal]))

    def exec_create(self, ref: str, cmd: list[str], stdout: bool = True, stderr: bool = True) -> dict[str, Any]:
        """Docker's exec, for the one command tsm runs in a container: the warning's script
        (:func:`tsm.schedulers.common.warn.handlers_script`), played on the container's processes; 409 when
        the container is not running."""
        self.calls.append(("exec_create", ref, cmd))
        c = self._get(ref)
        p = c.current
        if p is None or not p.running:
            raise api_error(409, f"Container {ref} is not running")
        exec_id = secrets.token_hex(8)
        self.execs[exec_id] = (p, cmd)
        return {"Id": exec_id}

    def exec_start(self, exec_id: str) -> bytes:
        p, cmd = self.execs[exec_id]
        if not self.shell:
            self.exec_codes[exec_id] = 126
            return b'OCI runtime exec failed: exec failed: unable to start container process: exec: "/bin/sh": no such file\n'
        sig = re.search(r"kill -s ([A-Z0-9]+) ", cmd[-1])
        if sig is None:
            self.exec_codes[exec_id] = 127
            return b"fake engine: only the warning's script runs in a container\n"
        self.exec_codes[exec_id] = 0 if p.signal_handlers(int(_signal.Signals["SIG" + sig.group(1)])) else 1
        return b""

    def exec_inspect(self, exec_id: str) -> dict[str, Any]:
        return {"ExitCode": self.exec_codes.get(exec_id), "Running": False}

    def warnings(self) -> list[str]:
        """The warning signals sent, in order: each exec of the warning's script (its signal's name)."""
        return [m.group(1) for c in self.calls if c[0] == "exec_create"
                for m in [re.search(r"kill -s ([A-Z0-9]+) ", c[2][-1])] if m is not None]

    def remove_container(self, ref: str, force: bool = False, v: bool = False) -> None:
        self.calls.append(("remove_container", ref))
        c = self._get(ref)
        c.stopped_by_hand = True
        p = c.current
        if p is not None and p.running:
            p.signal(signal.SIGKILL)
            p.wait()
        with self.lock:
            self.by_id.pop(c.id, None)

    def stats(self, ref: str, stream: bool = False, one_shot: bool = True) -> dict[str, Any]:
        self._get(ref)
        return {"cpu_stats": {"cpu_usage": {"total_usage": 0}}, "memory_stats": {"usage": 0, "stats": {}}}

    # -- logs ---------------------------------------------------------------------------------------------
    def logs(self, ref: str, stdout: bool = True, stderr: bool = True, timestamps: bool = False, stream: bool = False,
             follow: bool = False, since: float | None = None, until: float | None = None,
             tail: int | None = None) -> Any:
        self.calls.append(("logs", {"ref": ref, "stream": stream, "follow": follow}))
        c = self._get(ref)
        streams = tuple(n for n, on in (("stdout", stdout), ("stderr", stderr)) if on)
        if follow:
            return self._follow(c, streams, since)
        if stream:  # Docker's frames, one at a time
            return (piece for p in c.runs for piece in p.output_pieces(streams, since, until, timestamps))
        if timestamps:  # Docker stamps whole lines (a line written in pieces gets one stamp: its first piece's)
            out = b"".join(_stamped_lines(p, streams, since, until) for p in c.runs)
        else:
            out = b"".join(p.output(streams, since, until) for p in c.runs)
        if tail is not None:  # its last lines only
            out = b"".join(out.splitlines(keepends=True)[-tail:]) if tail > 0 else b""
        return out

    def _follow(self, c: FakeContainer, streams: tuple[str, ...], since: float | None) -> Any:
        for p in c.runs[:-1]:
            yield p.output(streams, since)
        if c.current is not None:
            yield from c.current.follow(streams, since)

    # -- volumes and the archive API ------------------------------------------------------------------------
    def create_volume(self, name: str, driver: str = "local", labels: dict[str, str] | None = None) -> dict[str, Any]:
        self.calls.append(("create_volume", {"name": name, "labels": labels}))
        with self.lock:
            if name not in self.vols:
                self.vols[name] = {"Name": name, "Labels": dict(labels or {}), "dir": tempfile.mkdtemp(prefix="fakevol-"),
                                   "CreatedAt": rfc3339(time.time() - 3600)}
            return {k: v for k, v in self.vols[name].items() if k != "dir"}

    def volumes(self, filters: dict[str, Any] | None = None) -> dict[str, Any]:
        with self.lock:
            return {"Volumes": [{k: v for k, v in vol.items() if k != "dir"} for vol in self.vols.values()
                                if self._matches(vol["Labels"], filters)]}

    def remove_volume(self, name: str, force: bool = False) -> None:
        self.calls.append(("remove_volume", name))
        with self.lock:
            if name not in self.vols:
                raise api_error(404, f"get {name}: no such volume")
            if any(name in c.volumes.values() for c in self.by_id.values()):
                raise api_error(409, f"remove {name}: volume is in use")
            shutil.rmtree(self.vols.pop(name)["dir"], ignore_errors=True)

    def files(self, volume: str) -> dict[str, bytes]:
        """What the volume holds (for tests): name -> content."""
        root = self.vols[volume]["dir"]
        out = {}
        for f in sorted(os.listdir(root)):
            with open(os.path.join(root, f), "rb") as fh:
                out[f] = fh.read()
        return out

    def get_archive(self, ref: str, path: str) -> tuple[Any, dict[str, Any]]:
        """A path of the container's image: the images have /bin/sh unless :attr:`shell` is False."""
        self.calls.append(("get_archive", ref, path))
        self._get(ref)
        if path != "/bin/sh" or not self.shell:
            raise api_error(404, f"Could not find the file {path} in container {ref}")
        return iter([b"fake"]), {"name": "sh", "linkTarget": "/bin/busybox"}

    def put_archive(self, ref: str, path: str, data: bytes) -> bool:
        """Extract the tar ``data`` at ``path``: into a volume mounted there (the only place tsm writes)."""
        self.calls.append(("put_archive", ref, path))
        c = self._get(ref)
        vol = c.volumes.get(path)
        if vol is None:
            raise api_error(500, f"fake engine: no volume mounted at {path}")
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            for m in tar.getmembers():
                target = os.path.join(self.vols[vol]["dir"], os.path.basename(m.name))
                src = tar.extractfile(m)
                assert m.isfile() and src is not None, m
                with open(target, "wb") as f:
                    f.write(src.read())
                os.chmod(target, m.mode)
        return True

    # -- networks -------------------------------------------------------------------------------------------
    def remove_network(self, name: str) -> None:
        self.calls.append(("remove_network", name))
        with self.lock:
            if name not in self.nets:
                raise api_error(404, f"network {name} not found")
            if any(name in c.networks for c in self.by_id.values()):
                raise api_error(403, f"error while removing network: network {name} has active endpoints")
            del self.nets[name]

    def inspect_network(self, name: str) -> dict[str, Any]:
        if name == "bridge" and self.daemon_started is not None:  # the default bridge: made at the daemon's start
            return {"Name": "bridge", "Created": rfc3339(self.daemon_started), "Containers": {},
                    "Options": {"com.docker.network.bridge.default_bridge": "true"}}
        with self.lock:
            return {"Containers": {c.id: {} for c in self.by_id.values() if name in c.networks}}

    def disconnect_container_from_network(self, cid: str, name: str, force: bool = False) -> None:
        c = self._get(cid)
        if name in c.networks:
            c.networks.remove(name)

    def close(self) -> None:
        pass


def _stamped_lines(p: FakeProcess, streams: tuple[str, ...], since: float | None, until: float | None) -> bytes:
    """A run's output as Docker gives it with ``timestamps``: each line once, after the time it began."""
    out, line, began = [], b"", 0.0
    for piece in list(p.pieces):
        if piece.stream not in streams or (since is not None and piece.when < since) or (
                until is not None and piece.when > until):
            continue
        if not line:
            began = piece.when
        line += piece.data
        while b"\n" in line:
            head, _, line = line.partition(b"\n")
            out.append(stamp(began) + b" " + head + b"\n")
            began = piece.when
    if line:
        out.append(stamp(began) + b" " + line)
    return b"".join(out)


class _Networks:
    def __init__(self, engine: FakeDockerEngine) -> None:
        self.engine = engine

    def create(self, name: str, driver: str = "bridge", labels: dict[str, str] | None = None,
               check_duplicate: bool = True) -> None:
        self.engine.calls.append(("network_create", {"name": name, "labels": labels}))
        with self.engine.lock:
            if name in self.engine.nets:
                raise api_error(409, f"network with name {name} already exists")
            self.engine.nets[name] = {"Name": name, "Labels": dict(labels or {}), "Created": rfc3339(time.time() - 3600)}

    def list(self, filters: dict[str, Any] | None = None) -> list[_Network]:
        with self.engine.lock:
            return [_Network(dict(n)) for n in self.engine.nets.values()
                    if FakeDockerEngine._matches(n["Labels"], filters)]


def fake_client(engine: FakeDockerEngine, as_owner: str | None = None) -> DockerClient:
    """A real :class:`DockerClient` connected to ``engine`` (``as_owner``: another user's client)."""
    c = DockerClient()
    c._client = engine
    if as_owner is not None:
        c.owner = as_owner
    return c


class FakeImages(ImageEngine):
    """Images for the fakes: every image is present (its id is its name), nothing is pulled or built."""

    def __init__(self) -> None:
        ClientBase.__init__(self)
        self._client = None

    def image_id(self, image: str) -> str | None:
        self.count("image_inspect")
        return "sha256:" + image

    def ensure_image(self, image: str, policy: str) -> str:
        self.count("image_inspect")
        return ""

    def close(self) -> None:
        pass


__all__ = ["FakeDockerEngine", "FakeImages", "api_error", "fake_client"]
