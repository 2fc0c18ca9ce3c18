"""The only module that talks to Ray: the dashboard's job, state, log and package HTTP APIs.

Every call is one HTTP request to the address this client was made for, with a timeout
(:data:`TIMEOUT`; a head that accepts the connection and never answers fails the call instead of hanging
``status``, ``cancel`` or the dashboard's refresh). Ray's Python SDK is not used for the calls because it
replaces any address it is given by ``$RAY_ADDRESS`` (so ``-c address=`` would lose, and a bad
``$RAY_ADDRESS`` would break a good ``-c address``), has no timeouts, and logs an INFO line per package
it did not need to upload. Only Ray's packaging helpers (content-hashed zips of ``working_dir`` and
``py_modules``) are borrowed, imported inside :meth:`RayClient.submit` so ``import tsm`` never loads Ray.

Every failure leaves as a :mod:`tsm.errors` class in one line: a head that does not answer, or an address
that is not a Ray dashboard, is :class:`SchedulerUnavailableError` saying how to start one or which
address to give.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tsm.errors import SchedulerError, SchedulerUnavailableError

DEFAULT_ADDRESS = "http://127.0.0.1:8265"
#: Seconds any one call to the cluster may take (uploads: :data:`UPLOAD_TIMEOUT`).
TIMEOUT = 30.0
UPLOAD_TIMEOUT = 300.0
_START = "start one with `make ray-up` (scripts/ray-up), or give its dashboard address with -c address=http://HOST:8265"


def resolve_address(option: str) -> str:
    """The dashboard address: the run option, else ``$RAY_ADDRESS``, else :data:`DEFAULT_ADDRESS`."""
    addr = option or os.environ.get("RAY_ADDRESS", "") or DEFAULT_ADDRESS
    if addr.startswith("ray://"):
        addr = "http://" + addr[len("ray://"):]
    if "://" not in addr:
        addr = "http://" + addr
    return addr.rstrip("/")


@dataclass
class RayJob:
    """A Ray job as the job API describes it (the fields tsm reads)."""

    submission_id: str
    status: str
    message: str = ""
    metadata: dict[str, str] = field(default_factory=dict)
    driver_node_id: str = ""
    start_time: int | None = None
    end_time: int | None = None
    entrypoint: str = ""

    @classmethod
    def of(cls, d: dict[str, Any]) -> RayJob:
        return cls(submission_id=str(d.get("submission_id") or ""), status=str(d.get("status") or ""),
                   message=str(d.get("message") or ""), metadata=dict(d.get("metadata") or {}),
                   driver_node_id=str(d.get("driver_node_id") or ""), start_time=d.get("start_time"),
                   end_time=d.get("end_time"), entrypoint=str(d.get("entrypoint") or ""))


class RayClient:
    """A Ray cluster's dashboard APIs (one client per address); see the module doc."""

    def __init__(self, address: str, timeout: float = TIMEOUT) -> None:
        self.address = address
        self.timeout = timeout
        self._lock = threading.Lock()
        #: calls made to the cluster, by name ("list_jobs", "job", "read", ...), for tests and benchmarks
        self.calls: dict[str, int] = {}

    def _count(self, name: str) -> None:
        with self._lock:
            self.calls[name] = self.calls.get(name, 0) + 1

    # -- HTTP ---------------------------------------------------------------------------------------------
    def _open(self, what: str, method: str, path: str, body: bytes | None = None, *,
              content_type: str = "application/json", timeout: float | None = None) -> Any:
        """One request; the open response (the caller closes it). HTTP errors are returned, not raised."""
        req = urllib.request.Request(self.address + path, data=body, method=method)
        token = _auth_token()
        if token:
            req.add_header("Authorization", "Bearer " + token)
        if body is not None:
            req.add_header("Content-Type", content_type)
        try:
            return urllib.request.urlopen(req, timeout=timeout or self.timeout)
        except urllib.error.HTTPError as e:
            return e
        except TimeoutError as e:
            raise SchedulerUnavailableError(
                f"Ray at {self.address} did not answer {what} within {timeout or self.timeout:g}s; is the head "
                f"overloaded or is this not a Ray dashboard? {_START}") from e
        except (urllib.error.URLError, OSError, ValueError) as e:
            reason = getattr(e, "reason", e)
            raise SchedulerUnavailableError(
                f"no Ray cluster answers at {self.address} ({what}: {_short(reason)}); {_START}") from e

    def _json(self, what: str, method: str, path: str, payload: Any = None, *, missing_ok: bool = False) -> Any:
        body = json.dumps(payload).encode() if payload is not None else None
        resp = self._open(what, method, path, body)
        with resp:
            try:
                raw = resp.read()
            except (TimeoutError, OSError) as e:
                raise SchedulerUnavailableError(f"Ray at {self.address}: {what}: {_short(e)}; {_START}") from e
            code = _code(resp)
        if code == 404 and missing_ok:
            return None
        if code >= 400:
            raise SchedulerError(f"Ray at {self.address}: {what}: HTTP {code}: {_short(raw.decode(errors='replace'))}")
        try:
            return json.loads(raw) if raw else None
        except ValueError as e:
            raise SchedulerUnavailableError(
                f"{self.address} answered {what} with something that is not Ray's job API; give the Ray "
                f"dashboard's address (-c address=http://HOST:8265)") from e

    def _state(self, what: str, resource: str, **params: Any) -> list[dict[str, Any]]:
        """A list from the State API (``/api/v0/<resource>``)."""
        data = self._json(what, "GET", f"/api/v0/{resource}?" + urllib.parse.urlencode(params, doseq=True))
        try:
            return list(data["data"]["result"]["result"])
        except (KeyError, TypeError) as e:
            raise SchedulerError(f"Ray at {self.address}: {what}: unexpected answer {_short(data)}") from e

    # -- jobs ---------------------------------------------------------------------------------------------
    def submit(self, *, entrypoint: str, submission_id: str, metadata: dict[str, str],
               runtime_env: dict[str, Any], entrypoint_num_cpus: float = 0,
               packages: Mapping[str, bytes] | None = None) -> str:
        """Upload the runtime env's local directories (content-hashed: only when the cluster lacks them),
        then put ``packages`` (``{uri: bytes}``, named by nothing in the job: see :mod:`.secrets`), and
        submit the job; returns its submission id."""
        runtime_env = self._upload(dict(runtime_env))
        for uri, data in (packages or {}).items():
            self.put_package(uri, data)
        self._count("submit")
        data = self._json("submit job", "POST", "/api/jobs/", {
            "entrypoint": entrypoint, "submission_id": submission_id, "metadata": metadata,
            "runtime_env": runtime_env, "entrypoint_num_cpus": entrypoint_num_cpus,
        })
        return str((data or {}).get("submission_id") or submission_id)

    def _upload(self, runtime_env: dict[str, Any]) -> dict[str, Any]:
        """``runtime_env`` with its local ``working_dir`` and ``py_modules`` directories replaced by the
        content-hashed packages they are on the cluster, each uploaded only when the cluster lacks it.

        The URI written into the job is the one computed for the upload (never recomputed), so a file edited
        during the launch cannot leave the job naming a package that was never uploaded.
        """
        import logging

        from tsm.schedulers.common.optional import import_client

        packaging: Any = import_client("ray._private.runtime_env.packaging", extra="ray", backend="ray")
        create_package, get_uri_for_directory = packaging.create_package, packaging.get_uri_for_directory

        # Ray's packaging logs INFO lines (per package, per .gitignore it honours); tsm prints its own launch line
        logging.getLogger("ray._private.runtime_env.packaging").setLevel(logging.WARNING)
        quiet = logging.getLogger("tsm.schedulers.ray.packaging")
        quiet.setLevel(logging.WARNING)
        quiet.propagate = False
        excludes = list(runtime_env.pop("excludes", None) or [])

        def ship(path: str, include_parent_dir: bool) -> str:
            if "://" in path:
                return path  # already a package URI
            uri: str = get_uri_for_directory(path, include_gitignore=True, excludes=excludes)
            protocol, _, name = uri.partition("://")
            endpoint = f"/api/packages/{protocol}/{name}"
            self._count("package")
            head = self._open("check a package", "GET", endpoint)
            with head:
                if _code(head) == 200:
                    return uri  # already on the cluster
            with tempfile.TemporaryDirectory() as tmp:
                zipped = Path(tmp) / name
                create_package(path, zipped, include_gitignore=True, include_parent_dir=include_parent_dir,
                               excludes=excludes, logger=quiet)
                self._count("upload")
                resp = self._open(f"upload {path}", "PUT", endpoint, zipped.read_bytes(),
                                  content_type="application/octet-stream", timeout=UPLOAD_TIMEOUT)
                with resp:
                    if _code(resp) != 200:
                        raise SchedulerError(f"Ray at {self.address}: upload of {path} refused: HTTP {_code(resp)}")
            return uri

        try:
            if runtime_env.get("working_dir"):
                runtime_env["working_dir"] = ship(str(runtime_env["working_dir"]), False)
            if runtime_env.get("py_modules"):
                runtime_env["py_modules"] = [ship(str(m), True) for m in runtime_env["py_modules"]]
        except (ValueError, RuntimeError, OSError) as e:  # Ray's size limit, a missing directory
            raise SchedulerError(
                f"Ray cannot ship the job's files ({_short(e)}): list what to leave out in .gitignore, give "
                "--workspace DIR with only what the job needs, or -c ship_cwd=False with absolute paths") from e
        return runtime_env

    def put_package(self, uri: str, data: bytes) -> None:
        """Store ``data`` under the ``gcs://`` ``uri`` in the cluster (overwriting it), then pin it: the
        dashboard's pin keeps an unreferenced package for a while (ten minutes by default), then Ray
        deletes it. What the head answers a refused put is not repeated (Ray's traceback quotes the data)."""
        endpoint = _package_endpoint(uri)
        self._count("upload")
        resp = self._open("put a package", "PUT", endpoint, data, content_type="application/octet-stream",
                          timeout=UPLOAD_TIMEOUT)
        with resp:
            if _code(resp) != 200:
                raise SchedulerError(f"Ray at {self.address}: storing {uri} refused: HTTP {_code(resp)}")
        if not self.package_exists(uri):
            raise SchedulerError(f"Ray at {self.address}: {uri} is not there after it was stored")

    def package_exists(self, uri: str) -> bool:
        """Whether the cluster holds the ``gcs://`` package ``uri`` (the dashboard pins it as it answers)."""
        self._count("package")
        resp = self._open("check a package", "GET", _package_endpoint(uri))
        with resp:
            return _code(resp) == 200

    def list_jobs(self) -> list[RayJob]:
        """Every job of the cluster (one call to the job API)."""
        self._count("list_jobs")
        return [RayJob.of(j) for j in self._json("list jobs", "GET", "/api/jobs/") or []]

    def job(self, app_id: str) -> RayJob | None:
        """The job's details, or None when the cluster has no such job."""
        self._count("job")
        data = self._json(f"job info of {app_id}", "GET", f"/api/jobs/{urllib.parse.quote(app_id, safe='')}",
                          missing_ok=True)
        return RayJob.of(data) if isinstance(data, dict) else None

    def stop(self, app_id: str) -> None:
        self._count("stop")
        self._json(f"stop job {app_id}", "POST", f"/api/jobs/{urllib.parse.quote(app_id, safe='')}/stop",
                   missing_ok=True)

    # -- state --------------------------------------------------------------------------------------------
    def nodes(self) -> list[dict[str, float]]:
        """The total resources of each alive node."""
        self._count("nodes")
        found = self._state("list nodes", "nodes", detail=1, limit=10000)
        return [dict(n.get("resources_total") or {}) for n in found if n.get("state") == "ALIVE"]

    def node_details(self) -> list[dict[str, Any]]:
        """Every node the cluster knows (alive or dead): ``node_id``, ``node_ip``, ``node_name``, ``state``,
        ``resources_total``."""
        self._count("nodes")
        return self._state("list nodes", "nodes", detail=1, limit=10000)

    def actors(self, app_id: str) -> list[dict[str, Any]]:
        """The alive actors of an app (named ``<app_id>/...`` in namespace ``tsm``)."""
        self._count("actors")
        found = self._state("list actors", "actors", detail=1, limit=10000, filter_keys="state",
                            filter_predicates="=", filter_values="ALIVE")
        return [a for a in found if str(a.get("name") or "").startswith(app_id + "/")]

    # -- logs ---------------------------------------------------------------------------------------------
    def _log_query(self, node_id: str, filename: str, **extra: Any) -> str:
        return urllib.parse.urlencode({"node_id": node_id, "filename": filename, "lines": -1, **extra})

    def read(self, node_id: str, filename: str) -> bytes | None:
        """A file under the node's Ray log directory (the dashboard's log API), or None when it is not there."""
        if not node_id:
            return None
        self._count("read")
        q = self._log_query(node_id, filename, timeout=int(self.timeout), media_type="file")
        resp = self._open(f"read {filename}", "GET", f"/api/v0/logs/file?{q}")
        with resp:
            code = _code(resp)
            if code != 200:
                return None  # the file is not (yet) there
            try:
                data: bytes = resp.read()
            except (TimeoutError, OSError) as e:
                raise SchedulerUnavailableError(f"Ray at {self.address}: read {filename}: {_short(e)}; {_START}") from e
            return data

    def stream(self, node_id: str, filename: str, interval: float = 0.5) -> Iterator[bytes] | None:
        """The file's bytes as they are written (the log API's stream: the whole file once, then each addition);
        None when it is not there. Each chunk waits at most the client's timeout (then the iterator raises
        :class:`SchedulerUnavailableError`); closing the iterator closes the connection."""
        if not node_id:
            return None
        self._count("stream")
        q = self._log_query(node_id, filename, interval=interval, media_type="stream")
        resp = self._open(f"follow {filename}", "GET", f"/api/v0/logs/stream?{q}")
        code = _code(resp)
        if code != 200:
            resp.close()
            return None

        def chunks() -> Iterator[bytes]:
            with resp:
                while True:
                    try:
                        data = resp.read1(65536)
                    except (TimeoutError, OSError) as e:
                        raise SchedulerUnavailableError(f"Ray at {self.address}: follow {filename}: {_short(e)}") from e
                    if not data:
                        return
                    yield data

        return chunks()


def _auth_token() -> str:
    """Ray's token (``RAY_AUTH_MODE=token``): ``$RAY_AUTH_TOKEN``, else the file ``$RAY_AUTH_TOKEN_PATH`` or
    ``~/.ray/auth_token``, where Ray's own clients look; "" when token authentication is off."""
    if os.environ.get("RAY_AUTH_MODE", "").lower() != "token":
        return ""
    token = os.environ.get("RAY_AUTH_TOKEN", "")
    if not token:
        path = os.environ.get("RAY_AUTH_TOKEN_PATH") or os.path.expanduser("~/.ray/auth_token")
        try:
            token = Path(path).read_text().strip()
        except OSError:
            return ""
    return token


def _package_endpoint(uri: str) -> str:
    """The dashboard's path of a ``protocol://name`` package."""
    protocol, _, name = uri.partition("://")
    return f"/api/packages/{protocol}/{urllib.parse.quote(name, safe='')}"


def _code(resp: Any) -> int:
    """The HTTP status of a response or of an HTTPError."""
    return int(getattr(resp, "status", None) or resp.code)


def _short(e: object) -> str:
    text = " ".join(str(e).split())
    return text[:300] + ("..." if len(text) > 300 else "")
