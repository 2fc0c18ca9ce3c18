"""The only module that talks to the API server, through the official ``kubernetes`` client (imported here).

Reads ask for raw JSON (``_preload_content=False``): the manifests and pods stay in the API's own
camelCase form, exactly what :mod:`~tsm.schedulers.kubernetes.request` writes and
:mod:`~tsm.schedulers.kubernetes.status` reads. Every call is counted (:attr:`KubeClient.calls`) so the
benchmark can show API calls per status refresh. Errors leave as :mod:`tsm.errors` classes: an
unreachable API server is :class:`SchedulerUnavailableError` saying how to start one.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections import Counter
from collections.abc import Iterator
from typing import Any

from tsm.errors import SchedulerError, SchedulerUnavailableError
from tsm.schedulers.common.optional import import_client
from tsm.schedulers.kubernetes.request import LABEL_APP, LABEL_REPLICA, LABEL_ROLE, LABEL_SCHEDULER
from tsm.schedulers.kubernetes.status import quantity as _quantity

#: app ids up to which a pod list selects them by label (``tsm/app-id in (...)``); more: the namespace's tsm pods
MAX_SELECTOR_IDS = 100
#: seconds before asking again for pod metrics after the cluster said it serves none
METRICS_RETRY = 300.0
HINT = "start one with `sudo scripts/k8s-up` (then KUBECONFIG=/var/lib/tsm-k8s/kubeconfig), or set kubeconfig/context"


class KubeClient:
    """A namespace-bound handle on one cluster."""

    def __init__(self, namespace: str = "default", kubeconfig: str | None = None, context: str | None = None) -> None:
        import_client("kubernetes", extra="kubernetes", backend="kubernetes")
        # the client's own annotations are partial: it is used through ``Any`` at this one boundary
        client: Any = import_client("kubernetes.client", extra="kubernetes", backend="kubernetes")
        config: Any = import_client("kubernetes.config", extra="kubernetes", backend="kubernetes")

        self.namespace = namespace
        self.calls: Counter[str] = Counter()
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
        self.api: Any = api
        self.core: Any = client.CoreV1Api(api)
        self.batch: Any = client.BatchV1Api(api)
        self.custom: Any = client.CustomObjectsApi(api)
        self._no_metrics_until = 0.0
        self.ApiException: type[Exception] = client.ApiException

    @contextlib.contextmanager
    def _call(self, what: str) -> Iterator[None]:
        import urllib3

        self.calls[what] += 1
        try:
            yield
        except self.ApiException as e:
            err: Any = e
            reason = err.reason
            with contextlib.suppress(ValueError, TypeError, AttributeError):
                reason = json.loads(err.body).get("message", reason)
            raise SchedulerError(f"Kubernetes {what} failed ({err.status}): {reason}") from e
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise SchedulerUnavailableError(f"the Kubernetes API server cannot be reached ({e}); {HINT}") from e

    def _json(self, resp: Any) -> dict[str, Any]:
        out: dict[str, Any] = json.loads(resp.data)
        return out

    def _items(self, resp: Any) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = self._json(resp)["items"]
        return out

    # -- create -------------------------------------------------------------------------------------------
    def create_service(self, manifest: dict[str, Any]) -> dict[str, Any]:
        with self._call("create service"):
            return self._json(self.core.create_namespaced_service(self.namespace, manifest, _preload_content=False))

    def create_job(self, manifest: dict[str, Any]) -> dict[str, Any]:
        with self._call("create job"):
            return self._json(self.batch.create_namespaced_job(self.namespace, manifest, _preload_content=False))

    # -- read ---------------------------------------------------------------------------------------------
    def list_pods(self, app_id: str | None = None) -> list[dict[str, Any]]:
        """Every tsm pod of the namespace (or of one app): one call."""
        sel = f"{LABEL_SCHEDULER}=kubernetes" + (f",{LABEL_APP}={app_id}" if app_id else "")
        with self._call("list pods"):
            return self._items(self.core.list_namespaced_pod(self.namespace, label_selector=sel,
                                                            _preload_content=False))

    def list_pods_of(self, app_ids: list[str]) -> list[dict[str, Any]]:
        """The pods of every app in ``app_ids``: one call (a set-based label selector; past
        :data:`MAX_SELECTOR_IDS` ids, every tsm pod of the namespace, filtered here)."""
        sel = f"{LABEL_SCHEDULER}=kubernetes"
        if len(app_ids) <= MAX_SELECTOR_IDS:
            sel += f",{LABEL_APP} in ({','.join(sorted(set(app_ids)))})"
        with self._call("list pods"):
            items = self._items(self.core.list_namespaced_pod(self.namespace, label_selector=sel,
                                                             _preload_content=False))
        wanted = set(app_ids)
        return [p for p in items if ((p.get("metadata") or {}).get("labels") or {}).get(LABEL_APP) in wanted]

    def pod_metrics(self, app_ids: list[str]) -> dict[str, tuple[float, float]] | None:
        """``{pod: (cores, bytes)}`` in use, summed over containers, from metrics-server's ``metrics.k8s.io``
        (one call), or None when the cluster does not serve that API (asked again after :data:`METRICS_RETRY` s)."""
        import time

        if time.monotonic() < self._no_metrics_until:
            return None
        sel = f"{LABEL_SCHEDULER}=kubernetes"
        if len(app_ids) <= MAX_SELECTOR_IDS:
            sel += f",{LABEL_APP} in ({','.join(sorted(set(app_ids)))})"
        try:
            with self._call("list pod metrics"):
                resp = self.custom.list_namespaced_custom_object("metrics.k8s.io", "v1beta1", self.namespace, "pods",
                                                                 label_selector=sel, _preload_content=False)
        except SchedulerError as e:
            if "(404)" in str(e) or "(503)" in str(e) or "(403)" in str(e):  # not served (no metrics-server)
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

    def list_jobs(self, app_id: str | None = None) -> list[dict[str, Any]]:
        sel = f"{LABEL_SCHEDULER}=kubernetes" + (f",{LABEL_APP}={app_id}" if app_id else "")
        with self._call("list jobs"):
            return self._items(self.batch.list_namespaced_job(self.namespace, label_selector=sel,
                                                             _preload_content=False))

    def list_services(self, app_id: str | None = None) -> list[dict[str, Any]]:
        sel = f"{LABEL_SCHEDULER}=kubernetes" + (f",{LABEL_APP}={app_id}" if app_id else "")
        with self._call("list services"):
            return self._items(self.core.list_namespaced_service(self.namespace, label_selector=sel,
                                                                _preload_content=False))

    def get_job(self, name: str) -> dict[str, Any] | None:
        try:
            with self._call("read job"):
                return self._json(self.batch.read_namespaced_job(name, self.namespace, _preload_content=False))
        except SchedulerError as e:
            if "(404)" in str(e):
                return None
            raise

    def allocatable(self) -> list[dict[str, float]]:
        """Per schedulable node: ``{"cpu": cores, "memory": bytes, "nvidia.com/gpu": n, ...}``."""
        with self._call("list nodes"):
            nodes = self._json(self.core.list_node(_preload_content=False))["items"]
        out = []
        for n in nodes:
            if (n.get("spec") or {}).get("unschedulable"):
                continue
            alloc = (n.get("status") or {}).get("allocatable") or {}
            out.append({k: _quantity(str(v)) for k, v in alloc.items()})
        return out

    def has_dns(self) -> bool:
        """True when the cluster runs a DNS service (``kube-dns`` in ``kube-system``, CoreDNS's usual name)."""
        with self._call("list services"):
            svcs = self._json(self.core.list_namespaced_service("kube-system", _preload_content=False))["items"]
        return any(s["metadata"]["name"] in ("kube-dns", "coredns") for s in svcs)

    def log(self, pod: str, *, since: int | None = None, timestamps: bool = False) -> bytes:
        """A pod's log (stdout and stderr together, as the kubelet keeps them); b"" when it has none yet."""
        kw: dict[str, Any] = {"timestamps": timestamps, "_preload_content": False}
        if since is not None:
            kw["since_seconds"] = max(1, since)
        try:
            with self._call("read log"):
                return bytes(self.core.read_namespaced_pod_log(pod, self.namespace, **kw).data)
        except SchedulerError as e:
            if "(400)" in str(e) or "(404)" in str(e):  # not started yet / gone
                return b""
            raise

    def follow(self, pod: str, *, since: int | None = None) -> Iterator[bytes]:
        """A pod's log as it is written, until the container ends."""
        kw: dict[str, Any] = {"follow": True, "_preload_content": False}
        if since is not None:
            kw["since_seconds"] = max(1, since)
        with self._call("follow log"):
            resp = self.core.read_namespaced_pod_log(pod, self.namespace, **kw)
        try:
            if getattr(resp, "chunked", False) and resp.supports_chunked_reads():
                yield from resp.read_chunked(decode_content=False)  # each chunk as the kubelet sends it
            else:
                yield from resp.stream(4096)
        finally:
            resp.release_conn()

    # -- delete -------------------------------------------------------------------------------------------
    def delete_app(self, app_id: str, grace: int | None = None) -> None:
        """Delete the app's Jobs (their pods with them) and its Service; a missing object is fine."""
        body: dict[str, Any] = {"propagationPolicy": "Background"}
        if grace is not None:
            body["gracePeriodSeconds"] = grace
        sel = f"{LABEL_APP}={app_id}"
        with self._call("delete jobs"):
            self.batch.delete_collection_namespaced_job(self.namespace, label_selector=sel, body=body,
                                                        _preload_content=False)
        with self._call("delete pods"):
            self.core.delete_collection_namespaced_pod(self.namespace, label_selector=sel,
                                                       grace_period_seconds=grace, _preload_content=False)
        with self._call("delete service"), contextlib.suppress(self.ApiException):
            self.core.delete_namespaced_service(app_id, self.namespace, body=body, _preload_content=False)

    def delete_job_of(self, app_id: str, role_label: str, replica: str) -> None:
        """Delete every Job (any try) of one replica and its pods, at once."""
        sel = f"{LABEL_APP}={app_id},{LABEL_ROLE}={role_label},{LABEL_REPLICA}={replica}"
        with self._call("delete jobs"):
            self.batch.delete_collection_namespaced_job(self.namespace, label_selector=sel, _preload_content=False,
                                                        body={"propagationPolicy": "Background", "gracePeriodSeconds": 0})
        with self._call("delete pods"):
            self.core.delete_collection_namespaced_pod(self.namespace, label_selector=sel, grace_period_seconds=0,
                                                       _preload_content=False)

    def close(self) -> None:
        self.api.close()
