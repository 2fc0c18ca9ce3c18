"""A fake Kubernetes cluster in memory, behind the real :class:`KubeClient`: the fast suite's Kubernetes.

:class:`FakeCluster` answers the calls the official client's ``CoreV1Api``/``BatchV1Api``/``CustomObjectsApi``
would make (same method names, keyword arguments, raw JSON answers, ``ApiException`` with HTTP statuses), so
everything of tsm above the client library runs as on a cluster: label selectors, the error mapping, the
controller (retries, gang timeout, deletion of ended apps), log snapshots. It plays the API server, the Job
controller (a new pod per failure up to ``backoffLimit``) and a kubelet whose containers are local processes
(:class:`~schedulers.common.fake_process.FakeProcess`, stdout and stderr in one log, the image ignored;
``$$`` unescaped and ``secretKeyRef``/``fieldRef`` env resolved as Kubernetes does).

Scripted phases: a pod whose image is in :attr:`FakeCluster.unschedulable` stays Pending with the scheduler's
``Unschedulable`` condition (a gang that never starts); one in :attr:`FakeCluster.bad_images` waits in
``ErrImagePull``. Every pod runs on ``node-1``. The cluster's own decisions: :meth:`FakeCluster.evict` (the
eviction API: the pod is deleted with its grace period, and its Job makes a replacement, as 1.20's does for a
pod deleted under it) and :meth:`FakeCluster.lose_node` (the node is deleted and the taint manager marks its
pods deleted; their kubelet no longer answers, so they stay). :attr:`FakeCluster.log_lag`: the number of non-follow log reads of an ended container
that come back empty (the runtime's log copier behind the container's exit). :attr:`FakeCluster.metrics`:
the ``metrics.k8s.io`` pod metrics (cores per pod), not served when None (the default). A follow of a pod deleted under it ends with the kubelet's ``rpc error: ... No such
container`` line, as dockershim's does. Every call is recorded (:attr:`FakeCluster.calls`: name and
keywords), so a test can check that each one carried ``_request_timeout``.
"""

from __future__ import annotations

import copy
import json
import re
import secrets
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

from kubernetes.client import ApiException

from schedulers.common.fake_process import FakeProcess, stamp
from tsm.schedulers.common.errors import ClientBase
from tsm.schedulers.common.owner import owner
from tsm.schedulers.kubernetes.client import KubeClient

Obj = dict[str, Any]


def now_rfc3339(when: float | None = None) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() if when is None else when))


def api_exception(status: int, message: str) -> ApiException:
    e = ApiException(status=status, reason=message)
    e.body = json.dumps({"kind": "Status", "message": message, "code": status})
    return e


class _Resp:
    """What ``_preload_content=False`` gives: ``.data``, or a stream."""

    def __init__(self, data: bytes = b"", chunks: Iterator[bytes] | None = None) -> None:
        self.data = data
        self._chunks = chunks
        self.chunked = False

    def stream(self, amt: int = 4096) -> Iterator[bytes]:
        if self._chunks is not None:
            yield from self._chunks
            return
        for i in range(0, len(self.data), amt):
            yield self.data[i:i + amt]

    def release_conn(self) -> None:
        pass


def _json(obj: Any) -> _Resp:
    return _Resp(json.dumps(obj).encode())


def _selects(labels: dict[str, str], selector: str | None) -> bool:
    """A label selector (``k=v``, ``k in (a,b)``) over ``labels``."""
    if not selector:
        return True
    parts, depth, cur = [], 0, ""
    for ch in selector:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    for p in parts:
        p = p.strip()
        if " in (" in p:
            k, _, vals = p.partition(" in (")
            if labels.get(k.strip()) not in {v.strip() for v in vals.rstrip(")").split(",")}:
                return False
        else:
            k, _, v = p.partition("=")
            if labels.get(k) != v:
                return False
    return True


def _lines(proc: FakeProcess, since: float | None, timestamps: bool) -> list[bytes]:
    """The process's stdout as whole lines (the last may be unterminated), each stamped with the time of its
    first piece when ``timestamps`` (a write may come in pieces: ``print`` unbuffered writes the line, then
    its newline)."""
    out: list[bytes] = []
    cur, first = b"", 0.0
    for piece in list(proc.pieces):
        if piece.stream != "stdout" or (since is not None and piece.when < since):
            continue
        for part in piece.data.splitlines(keepends=True):
            if not cur:
                first = piece.when
            cur += part
            if cur.endswith(b"\n"):
                out.append((stamp(first) + b" " if timestamps else b"") + cur)
                cur = b""
    if cur:
        out.append((stamp(first) + b" " if timestamps else b"") + cur)
    return out


class FakePod:
    def __init__(self, obj: Obj, job: str) -> None:
        self.obj = obj
        self.job = job
        self.proc: FakeProcess | None = None
        self.deleted = False
        self.deadline_exceeded = False
        self.oom_killed = False
        self.cid = secrets.token_hex(6)

    @property
    def name(self) -> str:
        return str(self.obj["metadata"]["name"])

    @property
    def phase(self) -> str:
        return str(self.obj["status"]["phase"])


class FakeCluster:
    """The cluster (see the module docstring). :meth:`client` gives a real :class:`KubeClient` bound to it."""

    def __init__(self, namespace: str = "default") -> None:
        self.namespace = namespace
        self.lock = threading.RLock()
        self.services: dict[str, Obj] = {}
        self.secrets: dict[str, Obj] = {}
        self.jobs: dict[str, Obj] = {}
        self.pods: dict[str, FakePod] = {}
        self.failures: dict[str, int] = {}
        self.unschedulable: set[str] = set()
        self.bad_images: set[str] = set()
        #: reads of each ended container's log that still come back empty (see the module doc)
        self.log_lag = 0
        self._lagged: dict[str, int] = {}
        self.calls: list[tuple[str, dict[str, Any]]] = []
        #: the metrics API: ``{pod name: cores in use}`` (0 for a pod not named); None: not served (404)
        self.metrics: dict[str, float] | None = None
        self.nodes = [{"metadata": {"name": "node-1"}, "spec": {},
                       "status": {"allocatable": {"cpu": "64", "memory": "256Gi", "pods": "110"},
                                  "conditions": [{"type": "Ready", "status": "True"}]}}]
        self.core = _Api(self)
        self.batch = self.core
        self.custom = self.core
        self._closed = False

    def client(self, as_owner: str | None = None) -> KubeClient:
        """A real :class:`KubeClient` whose API objects are this cluster (``as_owner``: another user's)."""
        c = KubeClient.__new__(KubeClient)
        ClientBase.__init__(c)
        c.namespace = self.namespace
        c.owner = as_owner or owner()
        c.core, c.batch, c.custom = self.core, self.batch, self.custom
        c.api = _ApiClient()
        c.ApiException = ApiException
        c._no_metrics_until = 0.0
        return c

    def close(self) -> None:
        """Kill every process left (a test that failed halfway)."""
        with self.lock:
            pods = list(self.pods.values())
        for p in pods:
            if p.proc is not None:
                p.proc.signal(signal.SIGKILL)

    # -- the cluster's decisions ---------------------------------------------------------------------------
    def evict(self, pod_name: str) -> None:
        """The eviction API (``POST .../pods/<name>/eviction``): see the module doc."""
        self.core.create_namespaced_pod_eviction(pod_name, self.namespace, {
            "apiVersion": "policy/v1beta1", "kind": "Eviction", "metadata": {"name": pod_name}})

    def oom_kill(self, pod_name: str) -> None:
        """The node's kernel OOM killer ends the pod's process (SIGKILL); the kubelet reports ``OOMKilled``."""
        with self.lock:
            pod = self.pods[pod_name]
            pod.oom_killed = True
            proc = pod.proc
        if proc is not None:
            proc.signal(signal.SIGKILL)

    def lose_node(self, node: str) -> None:
        """``node`` is gone: removed from the node list, its pods marked deleted (they keep running: their
        kubelet is unreachable, nothing confirms their end)."""
        with self.lock:
            self.nodes = [n for n in self.nodes if n["metadata"]["name"] != node]
            for p in self.pods.values():
                if p.obj["spec"].get("nodeName") == node:
                    p.obj["metadata"]["deletionTimestamp"] = now_rfc3339()

    # -- the Job controller and the kubelet -----------------------------------------------------------------
    def _make_pod(self, job: Obj) -> None:
        tmpl = copy.deepcopy(job["spec"]["template"])
        name = f"{job['metadata']['name'][:56]}-{secrets.token_hex(2)}"
        meta = {**tmpl["metadata"], "name": name, "namespace": self.namespace, "creationTimestamp": now_rfc3339(),
                "uid": secrets.token_hex(8)}
        meta["labels"] = {**meta.get("labels", {}), "job-name": job["metadata"]["name"]}
        pod = FakePod({"metadata": meta, "spec": {**tmpl["spec"], "nodeName": "node-1"}, "status": {"phase": "Pending"}},
                      job["metadata"]["name"])
        with self.lock:
            self.pods[name] = pod
        threading.Thread(target=self._kubelet, args=(pod,), daemon=True).start()

    def _env(self, c: Obj) -> dict[str, str]:
        env = {}
        for e in c.get("env", []):
            if "valueFrom" not in e:  # a plain value; the API server leaves an empty one out
                env[e["name"]] = e.get("value", "").replace("$$", "$")
            elif "secretKeyRef" in e.get("valueFrom", {}):
                ref = e["valueFrom"]["secretKeyRef"]
                secret = self.secrets.get(ref["name"])
                if secret is None:
                    raise KeyError(f'secret "{ref["name"]}" not found')
                if ref["key"] not in secret["stringData"]:  # the kubelet's words
                    raise KeyError(f"couldn't find key {ref['key']} in Secret {self.namespace}/{ref['name']}")
                env[e["name"]] = secret["stringData"][ref["key"]]
            elif "fieldRef" in e.get("valueFrom", {}):
                env[e["name"]] = "127.0.0.1"
        return env

    def _kubelet(self, pod: FakePod) -> None:
        spec = pod.obj["spec"]
        c = spec["containers"][0]
        status = pod.obj["status"]
        if c["image"] in self.unschedulable:
            status["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                     "message": "0/1 nodes are available: 1 Insufficient cpu."}]
            return
        if c["image"] in self.bad_images:
            status["containerStatuses"] = [{"restartCount": 0, "state": {"waiting": {
                "reason": "ErrImagePull", "message": f"pull access denied for {c['image']}"}}}]
            return
        time.sleep(0.02)  # scheduling and sandbox
        command = [a.replace("$$", "$") for a in c["command"] + c.get("args", [])]
        try:
            env = self._env(c)
        except KeyError as e:  # the Secret is gone (the app was deleted before its pod started), or never was
            status["containerStatuses"] = [{"restartCount": 0, "state": {"waiting": {
                "reason": "CreateContainerConfigError", "message": str(e.args[0])}}}]
            return
        proc = FakeProcess(command, env, combined=True)
        with self.lock:
            if pod.deleted:
                return
            pod.proc = proc
            ok = proc.start()
            if ok:
                status.update(phase="Running", podIP="127.0.0.1", containerStatuses=[
                    {"restartCount": 0, "state": {"running": {"startedAt": now_rfc3339(proc.started)}}}])
        deadline = spec.get("activeDeadlineSeconds")
        if ok and deadline is not None:  # the kubelet's activeDeadlineSeconds: preStop, SIGTERM, grace, SIGKILL
            timer = threading.Timer(float(deadline), self._deadline, args=(pod,))
            timer.daemon = True
            timer.start()
        rc = proc.wait()
        with self.lock:
            started = now_rfc3339(proc.started or time.time())
            status.update(phase="Succeeded" if rc == 0 else "Failed", containerStatuses=[{"restartCount": 0, "state": {
                "terminated": {"exitCode": rc, "reason": "OOMKilled" if pod.oom_killed else
                               "Completed" if rc == 0 else "Error",
                               "startedAt": started, "finishedAt": now_rfc3339(proc.finished)}}}])
            if pod.deadline_exceeded:
                status.update(reason="DeadlineExceeded", message="Pod was active on the node longer than the "
                                                                 "specified deadline")
            job = self.jobs.get(pod.job)
            if rc != 0 and job is not None and not pod.deleted:
                n = self.failures[pod.job] = self.failures.get(pod.job, 0) + 1
                if n <= int(job["spec"].get("backoffLimit", 6)):
                    self._make_pod(job)

    def _pre_stop(self, pod: FakePod) -> None:
        """Run the container's preStop hook as the kubelet would, for the hook tsm writes (``kill -s SIG`` to
        the container's processes that handle it: here the replica's process), then wait while it runs, at
        most the hook's seconds."""
        hook = pod.obj["spec"]["containers"][0].get("lifecycle", {}).get("preStop", {}).get("exec", {})
        script = " ".join(hook.get("command", []))
        sig, wait = re.search(r"kill -s ([A-Z0-9]+) ", script), re.search(r"-lt (\d+)", script)
        proc = pod.proc
        if sig is None or proc is None or not proc.running:
            return
        self.calls.append(("preStop", {"pod": pod.name, "signal": sig.group(1)}))
        proc.signal_handlers(int(signal.Signals["SIG" + sig.group(1)]))
        end = time.monotonic() + (float(wait.group(1)) if wait else 0.0)
        while proc.running and time.monotonic() < end:
            time.sleep(0.02)

    def _deadline(self, pod: FakePod) -> None:
        proc = pod.proc
        if pod.deleted or proc is None or not proc.running:
            return
        pod.deadline_exceeded = True
        self._pre_stop(pod)
        proc.stop(float(pod.obj["spec"].get("terminationGracePeriodSeconds", 30)))

    def _delete_pod(self, pod: FakePod, grace: float) -> None:
        with self.lock:
            if pod.deleted:
                return
            pod.deleted = True
            pod.obj["metadata"]["deletionTimestamp"] = now_rfc3339()

        def end() -> None:
            if pod.proc is not None and pod.proc.running:
                self._pre_stop(pod)
                pod.proc.stop(grace)
                pod.proc.wait()
            with self.lock:
                self.pods.pop(pod.name, None)

        threading.Thread(target=end, daemon=True).start()


class _ApiClient:
    class configuration:  # noqa: N801 (the client's attribute)
        host = "https://fake-cluster"

    def close(self) -> None:
        pass


class _Api:
    """CoreV1Api, BatchV1Api and CustomObjectsApi of the fake cluster, in one object."""

    def __init__(self, cluster: FakeCluster) -> None:
        self.c = cluster

    def _call(self, name: str, kw: dict[str, Any]) -> None:
        timeout = kw.get("_request_timeout")
        if timeout is not None:  # what the client's own validation takes: a number, or two (connect, read)
            parts = timeout if isinstance(timeout, tuple) else (timeout,)
            if len(parts) not in (1, 2) or not all(isinstance(t, (int, float)) and t > 0 for t in parts):
                raise TypeError(f"{name}: _request_timeout must be a positive number or two, not {timeout!r}")
        self.c.calls.append((name, dict(kw)))

    # -- create -------------------------------------------------------------------------------------------
    def create_namespaced_service(self, ns: str, body: Obj, **kw: Any) -> _Resp:
        self._call("create_namespaced_service", kw)
        with self.c.lock:
            name = body["metadata"]["name"]
            if name in self.c.services:
                raise api_exception(409, f'services "{name}" already exists')
            obj = copy.deepcopy(body)
            obj["metadata"].update(uid=secrets.token_hex(8), creationTimestamp=now_rfc3339())
            self.c.services[name] = obj
        return _json(obj)

    def create_namespaced_secret(self, ns: str, body: Obj, **kw: Any) -> _Resp:
        self._call("create_namespaced_secret", kw)
        with self.c.lock:
            self.c.secrets[body["metadata"]["name"]] = copy.deepcopy(body)
        return _json(body)

    def create_namespaced_job(self, ns: str, body: Obj, **kw: Any) -> _Resp:
        self._call("create_namespaced_job", kw)
        with self.c.lock:
            name = body["metadata"]["name"]
            if name in self.c.jobs:
                raise api_exception(409, f'jobs.batch "{name}" already exists')
            self.c.jobs[name] = copy.deepcopy(body)
            self.c._make_pod(self.c.jobs[name])
        return _json(body)

    def create_namespaced_pod_eviction(self, name: str, ns: str, body: Obj, **kw: Any) -> _Resp:
        self._call("create_namespaced_pod_eviction", kw)
        with self.c.lock:
            pod = self.c.pods.get(name)
            if pod is None:
                raise api_exception(404, f'pods "{name}" not found')
            job = self.c.jobs.get(pod.job)
        self.c._delete_pod(pod, float(pod.obj["spec"].get("terminationGracePeriodSeconds", 30)))
        if job is not None:  # 1.20's Job controller: its pod went away, so it makes another
            self.c._make_pod(job)
        return _json({"kind": "Status", "status": "Success", "code": 201})

    # -- read ---------------------------------------------------------------------------------------------
    def list_namespaced_pod(self, ns: str, label_selector: str = "", **kw: Any) -> _Resp:
        self._call("list_namespaced_pod", {**kw, "label_selector": label_selector})
        with self.c.lock:
            items = [copy.deepcopy(p.obj) for p in self.c.pods.values()
                     if _selects(p.obj["metadata"]["labels"], label_selector)]
        return _json({"items": items})

    def list_namespaced_service(self, ns: str, label_selector: str = "", **kw: Any) -> _Resp:
        self._call("list_namespaced_service", {**kw, "label_selector": label_selector})
        if ns == "kube-system":
            return _json({"items": [{"metadata": {"name": "kube-dns"}}]})
        with self.c.lock:
            items = [copy.deepcopy(s) for s in self.c.services.values()
                     if _selects(s["metadata"].get("labels", {}), label_selector)]
        return _json({"items": items})

    def list_node(self, **kw: Any) -> _Resp:
        self._call("list_node", kw)
        return _json({"items": self.c.nodes})

    def list_namespaced_custom_object(self, group: str, version: str, ns: str, plural: str, **kw: Any) -> _Resp:
        self._call("list_namespaced_custom_object", kw)
        if self.c.metrics is None:  # no metrics-server (as the test cluster)
            raise api_exception(404, "the server could not find the requested resource")
        with self.c.lock:
            pods = [p for p in self.c.pods.values() if _selects(p.obj["metadata"].get("labels", {}),
                                                                 kw.get("label_selector"))]
        return _json({"items": [{"metadata": {"name": p.name}, "containers": [{"name": "main", "usage": {
            "cpu": f"{int(self.c.metrics.get(p.name, 0.0) * 1e9)}n", "memory": "1Mi"}}]} for p in pods]})

    def read_namespaced_pod_log(self, name: str, ns: str, follow: bool = False, timestamps: bool = False,
                                since_seconds: int | None = None, tail_lines: int | None = None, **kw: Any) -> _Resp:
        self._call("read_namespaced_pod_log", {**kw, "follow": follow, "tail_lines": tail_lines})
        with self.c.lock:
            pod = self.c.pods.get(name)
        if pod is None:
            raise api_exception(404, f'pods "{name}" not found')
        if pod.proc is None:
            raise api_exception(400, f'container "main" in pod "{name}" is waiting to start: ContainerCreating')
        since = time.time() - since_seconds if since_seconds else None
        if not follow:
            if pod.phase in ("Succeeded", "Failed"):
                with self.c.lock:
                    n = self.c._lagged[name] = self.c._lagged.get(name, 0) + 1
                if n <= self.c.log_lag:
                    return _Resp(b"")
            data = pod.proc.output(("stdout",), since, timestamps=timestamps)
            if tail_lines is not None:  # its last lines only, each stamped once, as the kubelet does
                lines = _lines(pod.proc, since, timestamps)
                return _Resp(b"".join(lines[-tail_lines:]) if tail_lines > 0 else b"")
            return _Resp(data, chunks=iter(pod.proc.output_pieces(("stdout",), since, timestamps=timestamps)))

        def chunks() -> Iterator[bytes]:
            assert pod.proc is not None
            if timestamps:  # each line stamped (at its first byte) as the kubelet stamps lines, as they come
                given, start = 0, True
                while True:
                    done = not pod.proc.running
                    with pod.proc._lock:
                        new = pod.proc.pieces[given:]
                    given += len(new)
                    out = []
                    for p in new:
                        if p.stream != "stdout" or (since is not None and p.when < since):
                            continue
                        for part in p.data.splitlines(keepends=True):
                            out.append((stamp(p.when) + b" " if start else b"") + part)
                            start = part.endswith(b"\n")
                    data = b"".join(out)
                    if data:
                        yield data
                    if done:
                        break
                    time.sleep(0.02)
            else:
                yield from pod.proc.follow(("stdout",), since)
            if pod.deleted:  # what dockershim's kubelet writes when the container went away under a follow
                yield f"rpc error: code = Unknown desc = Error: No such container: {pod.cid}\n".encode()

        return _Resp(chunks=chunks())

    # -- delete -------------------------------------------------------------------------------------------
    def delete_collection_namespaced_job(self, ns: str, label_selector: str = "", body: Obj | None = None,
                                         **kw: Any) -> _Resp:
        self._call("delete_collection_namespaced_job", {**kw, "label_selector": label_selector})
        grace = float((body or {}).get("gracePeriodSeconds", 30) or 0)
        with self.c.lock:
            gone = [n for n, j in self.c.jobs.items() if _selects(j["metadata"]["labels"], label_selector)]
            for n in gone:
                del self.c.jobs[n]
            pods = [p for p in self.c.pods.values() if p.job in gone]
        for p in pods:
            self.c._delete_pod(p, grace)
        return _json({})

    def delete_collection_namespaced_pod(self, ns: str, label_selector: str = "",
                                         grace_period_seconds: int | None = None, **kw: Any) -> _Resp:
        self._call("delete_collection_namespaced_pod", {**kw, "label_selector": label_selector})
        with self.c.lock:
            pods = [p for p in self.c.pods.values() if _selects(p.obj["metadata"]["labels"], label_selector)]
        for p in pods:
            self.c._delete_pod(p, float(grace_period_seconds if grace_period_seconds is not None else 30))
        return _json({})

    def delete_collection_namespaced_secret(self, ns: str, label_selector: str = "", **kw: Any) -> _Resp:
        self._call("delete_collection_namespaced_secret", {**kw, "label_selector": label_selector})
        with self.c.lock:
            for n in [n for n, s in self.c.secrets.items() if _selects(s["metadata"]["labels"], label_selector)]:
                del self.c.secrets[n]
        return _json({})

    def delete_namespaced_service(self, name: str, ns: str, **kw: Any) -> _Resp:
        self._call("delete_namespaced_service", kw)
        with self.c.lock:
            if self.c.services.pop(name, None) is None:
                raise api_exception(404, f'services "{name}" not found')
        return _json({})


__all__ = ["FakeCluster", "api_exception"]
