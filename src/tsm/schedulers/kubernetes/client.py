"""The only module that talks to the API server, through the official ``kubernetes`` client (imported here).

Reads ask for raw JSON (``_preload_content=False``): the manifests and pods stay in the API's own
camelCase form, exactly what :mod:`~tsm.schedulers.kubernetes.request` writes and
:mod:`~tsm.schedulers.kubernetes.status` reads. Built on the kit's
:class:`~tsm.schedulers.common.errors.ClientBase`: every call is counted (:attr:`KubeClient.calls`) so the
benchmark can show API calls per status refresh, and errors leave as :mod:`tsm.errors` classes: an API
answer is :class:`~tsm.schedulers.common.errors.ApiError` with its HTTP status (``e.status == 404``), an
unreachable API server is :class:`SchedulerUnavailableError` saying how to start one.

**Bounded in time.** Every call passes ``_request_timeout`` (:data:`CONNECT_TIMEOUT`, :data:`REQUEST_TIMEOUT`)
and read timeouts are not retried, so an API server that accepts and never answers makes ``status``,
``cancel`` and a view's refresh fail within that time with :class:`SchedulerError` ("did not answer"),
never hang. Only a log follow waits longer for its next bytes (:data:`FOLLOW_READ_TIMEOUT`: a quiet replica is
not an error).

**Scoped to the owner.** Every object tsm makes carries the owner label (:mod:`tsm.schedulers.common.owner`)
and every list and delete selects by it: another user's apps in the namespace are never seen or removed.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from typing import Any

from tsm.errors import SchedulerError, SchedulerUnavailableError, TsmError
from tsm.schedulers.common.errors import ApiError, ClientBase
from tsm.schedulers.common.optional import import_client
from tsm.schedulers.common.owner import owner
from tsm.schedulers.kubernetes.request import (
    LABEL_APP,
    LABEL_OWNER,
    LABEL_REPLICA,
    LABEL_ROLE,
    LABEL_SCHEDULER,
)
from tsm.schedulers.kubernetes.status import quantity as _quantity

#: app ids up to which a pod list selects them by label (``tsm/app-id in (...)``); more: the namespace's tsm pods
MAX_SELECTOR_IDS = 100
#: seconds before asking again for pod metrics after the cluster said it serves none
METRICS_RETRY = 300.0
#: seconds to connect to the API server, and for it to answer a call
CONNECT_TIMEOUT = 10.0
REQUEST_TIMEOUT = 30.0
#: seconds a log follow waits for the next bytes of a quiet replica (the client takes no "none")
FOLLOW_READ_TIMEOUT = 86400.0
HINT = "start one with `sudo scripts/k8s-up` (then KUBECONFIG=/var/lib/tsm-k8s/kubeconfig), or set kubeconfig/context"


class KubeClient(ClientBase):
    """A namespace-bound handle on one cluster, scoped to this owner's objects."""

    def __init__(self, namespace: str = "default", kubeconfig: str | None = None, context: str | None = None) -> None:
        super().__init__()
        import_client("kubernetes", extra="kubernetes", backend="kubernetes")
        # the client's own annotations are partial: it is used through ``Any`` at this one boundary
        client: Any = import_client("kubernetes.client", extra="kubernetes", backend="kubernetes")
        config: Any = import_client("kubernetes.config", extra="kubernetes", backend="kubernetes")

        self.namespace = namespace
        #: the owner label value of every object made, and of every list and delete's selector
        self.owner = owner()
        if kubeconfig is None:  # the client reads $KUBECONFIG once, at import: read it now
            paths = [p for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p and os.path.exists(p)]
            kubeconfig = paths[0] if paths else None
        try:
            try:
                api = config.new_client_from_config(config_file=kubeconfig, context=context)
            except config.ConfigException:
                if kubeconfig or context:
                    raise
                config.load_incluster_config()
                api = client.ApiClient()
        except (config.ConfigException, OSError, TypeError) as e:
            raise SchedulerUnavailableError(f"no usable kubeconfig ({e}); {HINT}") from e
        if not api.configuration.verify_ssl:
            # the kubeconfig asked for insecure-skip-tls-verify: do not warn on every request
            import urllib3

            urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
        import urllib3

        # a read that timed out is not retried (it would multiply the bound); a refused connect is, once
        api.rest_client.pool_manager.connection_pool_kw["retries"] = urllib3.Retry(total=2, connect=1, read=0,
                                                                                  redirect=0)
        self.api: Any = api
        self.core: Any = client.CoreV1Api(api)
        self.batch: Any = client.BatchV1Api(api)
        self.custom: Any = client.CustomObjectsApi(api)
        self._no_metrics_until = 0.0
        self.ApiException: type[Exception] = client.ApiException

    def translate(self, what: str, e: BaseException) -> TsmError | None:
        import urllib3

        if isinstance(e, self.ApiException):
            err: Any = e
            reason = err.reason
            with contextlib.suppress(ValueError, TypeError, AttributeError):
                reason = json.loads(err.body).get("message", reason)
            return ApiError(f"Kubernetes {what} failed ({err.status}): {reason}", int(err.status or 0) or None)
        timed_out = isinstance(e, (urllib3.exceptions.TimeoutError, TimeoutError)) or isinstance(
            getattr(e, "reason", None), urllib3.exceptions.TimeoutError)
        if timed_out:
            return SchedulerError(f"Kubernetes {what}: the API server did not answer within {self.timeout[1]:g}s "
                                  f"({self.api.configuration.host}); check that it is up and not overloaded")
        if isinstance(e, (urllib3.exceptions.HTTPError, OSError)):
            return SchedulerUnavailableError(f"the Kubernetes API server cannot be reached ({e}); {HINT}")
        return None

    @property
    def timeout(self) -> tuple[float, float]:
        """``(connect, answer)`` seconds every call is bounded by (``_request_timeout``)."""
        return (CONNECT_TIMEOUT, REQUEST_TIMEOUT)

    def _kw(self, **kw: Any) -> dict[str, Any]:
        """A call's keywords: raw JSON back, and the time bound."""
        return {"_preload_content": False, "_request_timeout": self.timeout, **kw}

    def _sel(self, app_id: str | None = None, extra: str = "") -> str:
        """The label selector of this owner's tsm objects (of one app, plus ``extra``)."""
        sel = f"{LABEL_SCHEDULER}=kubernetes,{LABEL_OWNER}={self.owner}"
        return sel + (f",{LABEL_APP}={app_id}" if app_id else "") + (f",{extra}" if extra else "")

    def _json(self, resp: Any) -> dict[str, Any]:
        out: dict[str, Any] = json.loads(resp.data)
        return out

    def _items(self, resp: Any) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = self._json(resp)["items"]
        return out

    # -- create -------------------------------------------------------------------------------------------
    def create_service(self, manifest: dict[str, Any]) -> dict[str, Any]:
        with self.call("create service"):
            return self._json(self.core.create_namespaced_service(self.namespace, manifest, **self._kw()))

    def create_secret(self, manifest: dict[str, Any]) -> dict[str, Any]:
        with self.call("create secret"):
            return self._json(self.core.create_namespaced_secret(self.namespace, manifest, **self._kw()))

    def create_job(self, manifest: dict[str, Any]) -> dict[str, Any]:
        with self.call("create job"):
            return self._json(self.batch.create_namespaced_job(self.namespace, manifest, **self._kw()))

    # -- read ---------------------------------------------------------------------------------------------
    def list_pods(self, app_id: str | None = None) -> list[dict[str, Any]]:
        """Every tsm pod of this owner in the namespace (or of one app): one call."""
        with self.call("list pods"):
            return self._items(self.core.list_namespaced_pod(self.namespace, **self._kw(label_selector=self._sel(app_id))))

    def _ids_selector(self, app_ids: list[str]) -> str:
        if len(app_ids) <= MAX_SELECTOR_IDS:
            return self._sel(extra=f"{LABEL_APP} in ({','.join(sorted(set(app_ids)))})")
        return self._sel()

    def list_pods_of(self, app_ids: list[str]) -> list[dict[str, Any]]:
        """The pods of every app in ``app_ids``: one call (a set-based label selector; past
        :data:`MAX_SELECTOR_IDS` ids, every tsm pod of this owner, filtered here)."""
        with self.call("list pods"):
            items = self._items(self.core.list_namespaced_pod(
                self.namespace, **self._kw(label_selector=self._ids_selector(app_ids))))
        wanted = set(app_ids)
        return [p for p in items if ((p.get("metadata") or {}).get("labels") or {}).get(LABEL_APP) in wanted]

    def pod_metrics(self, app_ids: list[str]) -> dict[str, tuple[float, float]] | None:
        """``{pod: (cores, bytes)}`` in use, summed over containers, from metrics-server's ``metrics.k8s.io``
        (one call), or None when the cluster does not serve that API (asked again after :data:`METRICS_RETRY` s)."""
        if time.monotonic() < self._no_metrics_until:
            return None
        try:
            with self.call("list pod metrics"):
                resp = self.custom.list_namespaced_custom_object(
                    "metrics.k8s.io", "v1beta1", self.namespace, "pods", **self._kw(label_selector=self._ids_selector(app_ids)))
        except ApiError as e:
            if e.status in (403, 404, 503):  # not served (no metrics-server), or not for us
                self._no_metrics_until = time.monotonic() + METRICS_RETRY
                return None
            raise
        out: dict[str, tuple[float, float]] = {}
        for item in self._items(resp):
            cpu = mem = 0.0
            for c in item.get("containers") or []:
                usage = c.get("usage") or {}
                cpu += _quantity(str(usage.get("cpu", "0")))
                mem += _quantity(str(usage.get("memory", "0")))
            out[item["metadata"]["name"]] = (cpu, mem)
        return out

    def list_services(self, app_id: str | None = None) -> list[dict[str, Any]]:
        with self.call("list services"):
            return self._items(self.core.list_namespaced_service(self.namespace, **self._kw(label_selector=self._sel(app_id))))

    def allocatable(self) -> list[dict[str, float]]:
        """Per schedulable node: ``{"cpu": cores, "memory": bytes, "nvidia.com/gpu": n, ...}``."""
        with self.call("list nodes"):
            nodes = self._json(self.core.list_node(**self._kw()))["items"]
        out = []
        for n in nodes:
            if (n.get("spec") or {}).get("unschedulable"):
                continue
            alloc = (n.get("status") or {}).get("allocatable") or {}
            out.append({k: _quantity(str(v)) for k, v in alloc.items()})
        return out

    def node_ready(self) -> dict[str, bool]:
        """``{node: Ready}`` of the cluster's nodes (one call): a pod's node that is not there is gone."""
        with self.call("list nodes"):
            nodes = self._json(self.core.list_node(**self._kw()))["items"]
        return {str((n.get("metadata") or {}).get("name", "")): any(
            c.get("type") == "Ready" and c.get("status") == "True" for c in (n.get("status") or {}).get("conditions") or [])
            for n in nodes}

    def gpus_withdrawn(self) -> dict[str, tuple[int, int]]:
        """``{node: (withdrawn, capacity)}`` for each node with fewer allocatable ``nvidia.com/gpu`` than it
        has (one call): NVIDIA's device plugin takes a GPU out of ``allocatable`` when it turns unhealthy (an
        XID error: fallen off the bus, uncorrectable ECC errors), while ``capacity`` keeps counting it."""
        with self.call("list nodes"):
            nodes = self._json(self.core.list_node(**self._kw()))["items"]
        out = {}
        for n in nodes:
            status = n.get("status") or {}
            try:
                cap = int((status.get("capacity") or {}).get("nvidia.com/gpu", 0))
                alloc = int((status.get("allocatable") or {}).get("nvidia.com/gpu", cap))
            except (TypeError, ValueError):
                continue
            if alloc < cap:
                out[str((n.get("metadata") or {}).get("name", ""))] = (cap - alloc, cap)
        return out

    def has_dns(self) -> bool:
        """True when the cluster runs a DNS service (``kube-dns`` in ``kube-system``, CoreDNS's usual name)."""
        with self.call("list services"):
            svcs = self._json(self.core.list_namespaced_service("kube-system", **self._kw()))["items"]
        return any(s["metadata"]["name"] in ("kube-dns", "coredns") for s in svcs)

    def log(self, pod: str, *, since: int | None = None, timestamps: bool = False, tail: int | None = None) -> bytes:
        """A pod's log (stdout and stderr together, as the kubelet keeps them); b"" when it has none yet.
        ``tail``: only its last lines (``tailLines``: the stall check reads one)."""
        kw = self._kw(timestamps=timestamps)
        if since is not None:
            kw["since_seconds"] = max(1, since)
        if tail is not None:
            kw["tail_lines"] = tail
        try:
            with self.call("read log"):
                return bytes(self.core.read_namespaced_pod_log(pod, self.namespace, **kw).data)
        except ApiError as e:
            if e.status in (400, 404):  # not started yet / gone
                return b""
            raise

    def log_chunks(self, pod: str, *, timestamps: bool = False) -> Iterator[bytes]:
        """A pod's log so far, in chunks as they come (never held whole in memory); none when its container
        has not started. A pod that is gone raises :class:`ApiError` 404: "no log" and "no pod any more"
        differ to a caller that keeps logs (another process may have kept this one before deleting it)."""
        try:
            with self.call("read log"):
                resp = self.core.read_namespaced_pod_log(pod, self.namespace, **self._kw(timestamps=timestamps))
        except ApiError as e:
            if e.status == 400:
                return
            raise
        try:
            with self.call("read log", count=False):
                yield from resp.stream(1 << 16)
        finally:
            resp.release_conn()

    def follow(self, pod: str, *, since: int | None = None) -> Iterator[bytes]:
        """A pod's log as it is written, until the container ends (a quiet replica is not an error: the read
        timeout is :data:`FOLLOW_READ_TIMEOUT`)."""
        kw = self._kw(follow=True, _request_timeout=(CONNECT_TIMEOUT, FOLLOW_READ_TIMEOUT))
        if since is not None:
            kw["since_seconds"] = max(1, since)
        with self.call("follow log"):
            resp = self.core.read_namespaced_pod_log(pod, self.namespace, **kw)
        yield from self._followed(resp)

    def follow_open(self, pod: str, read_timeout: float, timestamps: bool = False) -> Iterator[bytes]:
        """Like :meth:`follow` from the log's start, but the request is made now (the follow is open when
        this returns: what the container writes from here on is in it), waiting at most ``read_timeout``
        seconds for each next bytes; with ``timestamps``, each line stamped by the kubelet."""
        with self.call("follow log"):
            resp = self.core.read_namespaced_pod_log(pod, self.namespace, **self._kw(
                follow=True, timestamps=timestamps, _request_timeout=(CONNECT_TIMEOUT, read_timeout)))
        return self._followed(resp)

    def _followed(self, resp: Any) -> Iterator[bytes]:
        try:
            with self.call("follow log", count=False):
                if getattr(resp, "chunked", False) and resp.supports_chunked_reads():
                    yield from resp.read_chunked(decode_content=False)  # each chunk as the kubelet sends it
                else:
                    yield from resp.stream(4096)
        finally:
            resp.release_conn()

    # -- delete -------------------------------------------------------------------------------------------
    def delete_app(self, app_id: str, grace: int | None = None) -> None:
        """Delete the app's Jobs (their pods with them), its Secret and its Service; a missing object is fine."""
        body: dict[str, Any] = {"propagationPolicy": "Background"}
        if grace is not None:
            body["gracePeriodSeconds"] = grace
        sel = self._sel(app_id)
        with self.call("delete jobs"):
            self.batch.delete_collection_namespaced_job(self.namespace, **self._kw(label_selector=sel, body=body))
        with self.call("delete pods"):
            self.core.delete_collection_namespaced_pod(self.namespace, **self._kw(label_selector=sel,
                                                                                  grace_period_seconds=grace))
        with self.call("delete secrets"):
            self.core.delete_collection_namespaced_secret(self.namespace, **self._kw(label_selector=sel))
        for svc in self.list_services(app_id):  # by owner: another user's Service of that name stays
            try:
                with self.call("delete service"):
                    self.core.delete_namespaced_service(svc["metadata"]["name"], self.namespace, **self._kw(body=body))
            except ApiError as e:
                if e.status != 404:
                    raise

    def delete_job_of(self, app_id: str, role_label: str, replica: str, grace: int = 0) -> None:
        """Delete every Job (any try) of one replica and its pods: at once, or with ``grace`` seconds after
        SIGTERM (the warning hook runs first: a preemption's restart)."""
        sel = self._sel(app_id, f"{LABEL_ROLE}={role_label},{LABEL_REPLICA}={replica}")
        with self.call("delete jobs"):
            self.batch.delete_collection_namespaced_job(self.namespace, **self._kw(
                label_selector=sel, body={"propagationPolicy": "Background", "gracePeriodSeconds": grace}))
        with self.call("delete pods"):
            self.core.delete_collection_namespaced_pod(self.namespace, **self._kw(label_selector=sel,
                                                                                  grace_period_seconds=grace))

    def close(self) -> None:
        self.api.close()
