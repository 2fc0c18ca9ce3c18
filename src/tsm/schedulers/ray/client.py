"""The only module that talks to Ray: the job API and the State API over the dashboard's HTTP address.

``ray`` is imported here, inside methods (``import_client``), so ``import tsm`` never loads it. Every Ray
failure leaves as a :mod:`tsm.errors` class: a cluster that does not answer is
:class:`SchedulerUnavailableError` saying how to start one.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from tsm.errors import SchedulerError, SchedulerUnavailableError
from tsm.schedulers.common.optional import import_client

DEFAULT_ADDRESS = "http://127.0.0.1:8265"
_START = "start one with `make ray-up` (scripts/ray-up) or set RAY_ADDRESS / -c address=..."


def resolve_address(option: str) -> str:
    """The dashboard address: the run option, else ``$RAY_ADDRESS``, else :data:`DEFAULT_ADDRESS`."""
    addr = option or os.environ.get("RAY_ADDRESS", "") or DEFAULT_ADDRESS
    if "://" not in addr:
        addr = "http://" + addr
    return addr


class RayClient:
    """A Ray cluster's job and state APIs (one per address)."""

    def __init__(self, address: str) -> None:
        self.address = address
        self._jobs: Any = None
        self._lock = threading.Lock()
        #: calls made to the cluster, by name ("list_jobs", "job", "read", ...), for tests and benchmarks
        self.calls: dict[str, int] = {}

    def _count(self, name: str) -> None:
        with self._lock:
            self.calls[name] = self.calls.get(name, 0) + 1

    @property
    def jobs(self) -> Any:
        if self._jobs is None:
            mod = import_client("ray.job_submission", extra="ray", backend="ray")
            try:
                self._jobs = mod.JobSubmissionClient(self.address)
            except (ConnectionError, RuntimeError, ValueError) as e:
                raise SchedulerUnavailableError(f"no Ray cluster answers at {self.address}: {_short(e)}; {_START}") from e
        return self._jobs

    def _call(self, what: str, fn: Any, *args: Any, **kw: Any) -> Any:
        try:
            return fn(*args, **kw)
        except ConnectionError as e:
            raise SchedulerUnavailableError(f"Ray at {self.address}: {what}: {_short(e)}; {_START}") from e
        except (RuntimeError, ValueError) as e:
            raise SchedulerError(f"Ray at {self.address}: {what}: {_short(e)}") from e

    def submit(self, **kw: Any) -> str:
        self._count("submit")
        return str(self._call("submit job", self.jobs.submit_job, **kw))

    def list_jobs(self) -> list[Any]:
        """Every job of the cluster (one call to the job API)."""
        self._count("list_jobs")
        return list(self._call("list jobs", self.jobs.list_jobs))

    def job(self, app_id: str) -> Any | None:
        """The job's details, or None when the cluster has no such job."""
        self._count("job")
        try:
            return self.jobs.get_job_info(app_id)
        except RuntimeError as e:
            if "does not exist" in str(e) or "404" in str(e):
                return None
            raise SchedulerError(f"Ray at {self.address}: job info of {app_id}: {_short(e)}") from e
        except ConnectionError as e:
            raise SchedulerUnavailableError(f"Ray at {self.address}: {_short(e)}; {_START}") from e

    def stop(self, app_id: str) -> None:
        self._count("stop")
        self._call("stop job", self.jobs.stop_job, app_id)

    def nodes(self) -> list[dict[str, float]]:
        """The total resources of each alive node."""
        state = import_client("ray.util.state", extra="ray", backend="ray")
        self._count("nodes")
        nodes = self._call("list nodes", state.list_nodes, address=self.address, detail=True)
        return [dict(n.resources_total) for n in nodes if n.state == "ALIVE"]

    def actors(self, app_id: str) -> list[Any]:
        """The alive actors of an app (named ``<app_id>/...`` in namespace ``tsm``)."""
        state = import_client("ray.util.state", extra="ray", backend="ray")
        self._count("actors")
        found = self._call("list actors", state.list_actors, address=self.address,
                           filters=[("state", "=", "ALIVE")], detail=True, limit=10000)
        return [a for a in found if (a.name or "").startswith(app_id + "/")]

    def read(self, node_id: str, filename: str) -> bytes | None:
        """A file under the node's Ray log directory (the dashboard's log API), or None when it is not there."""
        if not node_id:
            return None
        self._count("read")
        import urllib.error
        import urllib.parse
        import urllib.request

        query = urllib.parse.urlencode({"node_id": node_id, "filename": filename, "lines": -1, "timeout": 30,
                                        "media_type": "file"})
        try:
            with urllib.request.urlopen(f"{self.address}/api/v0/logs/file?{query}", timeout=60) as r:
                data: bytes = r.read()
                return data
        except urllib.error.HTTPError:
            return None  # the file is not (yet) there
        except OSError as e:
            raise SchedulerUnavailableError(f"Ray at {self.address}: read {filename}: {_short(e)}; {_START}") from e


def _short(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return text[:300] + ("..." if len(text) > 300 else "")
