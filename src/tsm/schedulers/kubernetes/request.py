"""Pure: an AppDef and :class:`KubernetesOptions` -> :class:`KubernetesRequest`, the exact manifests to create.

No API call happens here (a dry run needs no cluster). :func:`~.dryrun.format_request` prints the manifests
as the YAML documents ``schedule`` creates, in order: the app's headless Service first (the *anchor*: every other
object gets an ``ownerReference`` to it, filled with its ``uid`` once it exists, so one delete removes all),
the app's Secret (the roles' env values: a Job spec names them, never holds them), then one ``batch/v1`` Job
per replica. What a look changes in them later (the owner's uid, rank 0's IP, a retry's Job) is
:mod:`.manifests`.

Naming, per app ``<app_id>`` (``<name>-<8 hex>``, a DNS-1035 label):

* Service ``<app_id>``; pod ``hostname: <role>-<k>``, ``subdomain: <app_id>``, so replica ``k`` of ``role``
  is ``<role>-<k>.<app_id>`` in the cluster's DNS; ``TSM_RANK0_HOST`` (``${rank0_env}``) is role 0's
  replica 0. On a cluster without DNS, ``schedule`` starts rank 0 first and hands its pod IP to the others.
* Job ``<app_id>-<role>-<k>`` (``-a<n>`` appended for the n-th ROLE/APPLICATION retry); every name longer
  than Kubernetes allows is cut and ends with a stable hash of the whole name (:func:`short_name`).
* labels ``tsm/*`` on every object and pod, the owner's among them (:data:`LABEL_OWNER`); the role's real
  name (which a label may not hold) and the app's shape are annotations;
* a container port per ``port_map`` entry, named from its key as Kubernetes wants a port name (at most 15 of
  ``[a-z0-9-]``, a letter, no ``--``): :func:`port_name`; two keys that give one name are refused at dry run.

Kubernetes expands ``$(VAR)`` in ``command``, ``args`` and env values; every ``$`` is written ``$$`` so the
replica receives exactly the bytes given (:func:`escape`).
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import re
import secrets
from dataclasses import asdict, dataclass, field
from typing import Any

from tsm.env.options import EnvOptions
from tsm.errors import InvalidAppError, InvalidRunOptionError
from tsm.schedulers.common.container_request import LifecycleFields, lifecycle_fields
from tsm.schedulers.common.lifecycle_opts import LifecycleOptions
from tsm.schedulers.common.options import option
from tsm.schedulers.common.warn import handlers_script
from tsm.specs.api import AppDef, RetryPolicy, Role, is_null_resource, macros
from tsm.specs.mounts import BindMount, DeviceMount, VolumeMount

LABEL_SCHEDULER = "tsm/scheduler"
LABEL_APP = "tsm/app-id"
LABEL_SESSION = "tsm/session"
LABEL_ROLE = "tsm/role"
LABEL_REPLICA = "tsm/replica-id"
LABEL_ATTEMPT = "tsm/attempt"
LABEL_OWNER = "tsm/owner"
#: annotations: the role's own name, the app's shape ``[[role, replicas, max_retries, policy], ...]``, creation
ANN_ROLE = "tsm/role-name"
ANN_ROLES = "tsm/roles"
ANN_CREATED = "tsm/created"
#: annotation: rank 0's name in the Service's DNS, ``<role0>-0.<app_id>``
ANN_RANK0 = "tsm/rank0"
#: the role metadata key holding a dict deep-merged into each replica's pod spec
OVERLAY_KEY = "kubernetes"
CONTAINER = "main"
RANK0_VAR = "TSM_RANK0_HOST"
TORCHX_RANK0_VAR = "TORCHX_RANK0_HOST"
#: the cluster's DNS domain as kubelets default it (``--cluster-domain``); used for rank 0's full name only
CLUSTER_DOMAIN = "cluster.local"

PULL_POLICIES = ("IfNotPresent", "Always", "Never")
DNS_MODES = ("auto", "yes", "no")
_LABEL_MAX = 63
_DNS_BAD = re.compile(r"[^a-z0-9-]+")
_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")


#: seconds past ``time_limit`` a pod's ``activeDeadlineSeconds`` is put with ``requeue_on_time_limit``: tsm's
#: look requeues the app at the limit; the kubelet's deadline only ends an app no process looked at
REQUEUE_BACKSTOP = 60
#: the node label a node anti-affinity term (``exclude_nodes``) selects on
HOSTNAME_LABEL = "kubernetes.io/hostname"


@dataclass(frozen=True)
class KubernetesOptions(LifecycleOptions, EnvOptions):
    """Run options of the ``kubernetes`` scheduler, with the long-run ones it carries out: ``time_limit``
    (each pod's ``activeDeadlineSeconds``, and tsm's looks for the app as a whole), ``warn_signal`` and
    ``warn_before`` (a ``preStop`` hook that signals the container's PID 1, inside a termination grace
    period lengthened by ``warn_before``), ``max_preemptions`` (evicted pods and pods lost with their node
    are restarted by tsm's controller on that budget), ``requeue_on_time_limit`` (tsm's look restarts the
    app at the limit; the pods' deadline becomes a backstop :data:`REQUEUE_BACKSTOP` s later),
    ``exclude_nodes`` (a required node anti-affinity term: :func:`with_excluded_nodes`) and ``stall_timeout``
    with ``on_stall`` (checked by tsm when it looks at the app: :mod:`tsm.schedulers.kubernetes.stall`)."""

    namespace: str = option("namespace the app's objects are created in", "default")
    service_account: str | None = option("service account the pods run as; default: the namespace's default")
    priority_class: str | None = option("priorityClassName of the pods")
    image_pull_policy: str = option("imagePullPolicy: IfNotPresent (locally built images work), Always, Never",
                                    "IfNotPresent")
    gang_timeout: float = option(
        "seconds every replica has to be Running; past it the app is deleted and FAILED with Kubernetes' reason", 300.0
    )
    grace_period: int = option("seconds between SIGTERM and SIGKILL when a pod is deleted", 10)
    request_fraction: float = option(
        "requests = this fraction of the limits (cpu, memory); 1 = guaranteed, lower leaves headroom", 1.0
    )
    shm_fraction: float = option("/dev/shm (a memory emptyDir) as a fraction of the role's memMB; 0 = none", 0.5)
    dns: str = option("rank 0 by cluster DNS: auto (detect), yes, no (rank 0's pod IP is handed to the others)",
                      "auto")
    kubeconfig: str | None = option("kubeconfig file; default: $KUBECONFIG, ~/.kube/config, or in-cluster "
                                    "(its exec plugins run commands: not taken from a project's config file)",
                                    trusted=True)
    context: str | None = option("kubeconfig context; default: its current-context")

    def check(self) -> None:
        super().check()
        if self.image_pull_policy not in PULL_POLICIES:
            raise InvalidRunOptionError(
                f"image_pull_policy must be one of {', '.join(PULL_POLICIES)}, not {self.image_pull_policy!r}"
            )
        if self.dns not in DNS_MODES:
            raise InvalidRunOptionError(f"dns must be one of {', '.join(DNS_MODES)}, not {self.dns!r}")
        if self.gang_timeout <= 0:
            raise InvalidRunOptionError(f"gang_timeout must be > 0 seconds, not {self.gang_timeout}")
        if self.grace_period < 0:
            raise InvalidRunOptionError(f"grace_period must be >= 0, not {self.grace_period}")
        if not 0 < self.request_fraction <= 1:
            raise InvalidRunOptionError(f"request_fraction must be in (0, 1], not {self.request_fraction}")
        if not 0 <= self.shm_fraction <= 1:
            raise InvalidRunOptionError(f"shm_fraction must be in [0, 1], not {self.shm_fraction}")
        if not _is_dns_label(self.namespace):
            raise InvalidRunOptionError(f"namespace must be a DNS label ([a-z0-9-], <= 63), not {self.namespace!r}")


@dataclass
class Need:
    """What one replica requests, for the gang check against node allocatable."""

    role: str
    cpu_milli: int
    mem_bytes: int
    gpus: int


@dataclass
class KubernetesRequest(LifecycleFields):
    """What ``schedule`` creates: ``service`` then ``jobs`` (manifests as the API takes them); the long-run
    fields are the kit's (:class:`~tsm.schedulers.common.container_request.LifecycleFields`)."""

    app_id: str
    app_name: str
    session: str
    namespace: str
    service: dict[str, Any]
    jobs: list[dict[str, Any]]
    #: ``[[role, replicas, max_retries, policy], ...]``
    roles: list[list[Any]]
    needs: list[Need]
    dns: str
    gang_timeout: float
    grace_period: int
    app_dir: str
    spec: dict[str, Any] = field(default_factory=dict)
    kubeconfig: str | None = None
    context: str | None = None
    #: workspace images (:class:`tsm.workspace.image.ImagePlan` as dicts) built on the local engine at schedule
    builds: list[dict[str, Any]] = field(default_factory=list)
    #: the app's Secret: the roles' env values, which the Jobs reference by key
    secret: dict[str, Any] = field(default_factory=dict)
    #: ``exclude_nodes``: nodes no pod of the app may run on (each Job carries the term already)
    exclude_nodes: list[str] = field(default_factory=list)
    #: the app's declared secrets (``str`` of each :class:`~tsm.specs.secrets.SecretRef`; never a value: read at
    #: ``schedule``), set with their env entries by :func:`.secrets.with_secrets`
    secrets: list[str] = field(default_factory=list)

    def to_json(self) -> str:
        """The request as JSON (saved beside the app; read back to recreate Jobs on ROLE/APPLICATION retries)."""
        return json.dumps(asdict(self), indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> KubernetesRequest:
        data = json.loads(text)
        data["needs"] = [Need(**n) for n in data["needs"]]
        return cls(**data)


def _is_dns_label(s: str) -> bool:
    return bool(re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", s)) and len(s) <= _LABEL_MAX


def short_name(name: str, limit: int = _LABEL_MAX) -> str:
    """``name`` when it fits in ``limit`` characters, else cut and ended by ``-`` + 8 hex of its sha256.

    Stable: the same long name always gives the same short one, and two long names sharing a prefix differ.
    """
    if len(name) <= limit:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{name[: limit - 9].rstrip('-.')}-{digest}"


def dns_part(text: str) -> str:
    """``text`` as a DNS label part: lower case, ``[a-z0-9-]`` (``Trainer_A`` -> ``trainer-a``)."""
    return _DNS_BAD.sub("-", text.lower()).strip("-") or "x"


def host_name(role: str, replica_id: int) -> str:
    """The pod hostname of replica ``replica_id`` of ``role``: ``<role>-<k>`` (a DNS label, shortened)."""
    return short_name(f"{dns_part(role)}-{replica_id}")


def label_value(text: str) -> str:
    """``text`` as a label value (<= 63 of ``[A-Za-z0-9-_.]``, alphanumeric at both ends)."""
    v = re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-._")
    return short_name(v).strip("-._") or "x"


def job_name(app_id: str, role: str, replica_id: int, attempt: int = 0) -> str:
    """The Job of one replica; ``-a<n>`` for the n-th ROLE/APPLICATION retry (a new object, new pods)."""
    suffix = f"-a{attempt}" if attempt else ""
    return short_name(f"{app_id}-{dns_part(role)}-{replica_id}{suffix}")


def new_app_id(app_name: str) -> str:
    """``<name>-<8 hex>``, a DNS-1035 label (it names the Service): starts with a letter, <= 63 characters."""
    base = dns_part(app_name)
    if not base[0].isalpha():
        base = "app-" + base
    return f"{base[:40].rstrip('-')}-{secrets.token_hex(4)}"


_PORT_BAD = re.compile(r"[^a-z0-9]+")


def port_name(key: str) -> str:
    """A ``port_map`` key as a Kubernetes port name (IANA service name): lower case, runs of other characters
    as one ``-``, no ``-`` at either end, at most 15 characters, and a letter (``8080`` -> ``p8080``)."""
    name = _PORT_BAD.sub("-", key.lower()).strip("-")[:15].strip("-")
    if not re.search(r"[a-z]", name):
        name = ("p" + name)[:15].strip("-")
    return name


def secret_key(value: str) -> str:
    """The key of an env value in the app's Secret: ``v-`` and a hash of the value, so a value that many
    replicas share (the usual case: a role's env is the same for each) is stored once."""
    return "v-" + hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:32]


#: Kubernetes refuses a Secret over 1 MiB (its data, keys included); refused at dry run with the cause instead.
SECRET_LIMIT = 1 << 20


def escape(value: str) -> str:
    """``value`` with every ``$`` doubled, so Kubernetes' ``$(VAR)`` expansion gives back ``value`` exactly."""
    return value.replace("$", "$$")


def _utf8(value: str, what: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InvalidAppError(
            f"{what} holds bytes that are not UTF-8 ({value[e.start:e.end]!r}); Kubernetes' API carries text only: "
            "pass such data in a file (a mount) instead"
        ) from e
    return value


def validate(app: AppDef) -> None:
    """Refuse what the kubernetes scheduler cannot run (raises :class:`InvalidAppError`)."""
    hosts: dict[str, str] = {}
    for role in app.roles:
        if not role.image:
            raise InvalidAppError(f"role '{role.name}' has no image: the kubernetes scheduler runs a container image")
        if role.max_retries < 0:
            raise InvalidAppError(f"role '{role.name}': max_retries must be >= 0, not {role.max_retries}")
        _utf8(role.entrypoint, f"role '{role.name}' entrypoint")
        for i, a in enumerate(role.args):
            _utf8(a, f"role '{role.name}' argument {i}")
        for k, v in role.env.items():
            _utf8(v, f"role '{role.name}' env {k}")
            if not _ENV_NAME.match(k):
                raise InvalidAppError(
                    f"role '{role.name}': env name {k!r} is refused by Kubernetes "
                    "(it must match [-._a-zA-Z][-._a-zA-Z0-9]*)"
                )
        overlay = role.metadata.get(OVERLAY_KEY)
        if overlay is not None and not isinstance(overlay, dict):
            raise InvalidAppError(f"role '{role.name}': metadata['{OVERLAY_KEY}'] must be a dict merged into the pod spec")
        ports: dict[str, str] = {}
        for key in role.port_map:
            name = port_name(key)
            if name in ports:
                raise InvalidAppError(
                    f"role '{role.name}': port_map keys {ports[name]!r} and {key!r} both give the port name {name!r}; "
                    "Kubernetes port names are at most 15 of [a-z0-9-] with a letter: rename one")
            ports[name] = key
        h = host_name(role.name, 0)
        if h in hosts:
            raise InvalidAppError(f"roles '{hosts[h]}' and '{role.name}' map to the same pod host names ({h})")
        hosts[h] = role.name


def with_pod_overlay(pod_spec: dict[str, Any], overlay: dict[str, Any]) -> dict[str, Any]:
    """The pod spec patched by a TorchX ``V1Pod`` overlay (its ``spec`` part; PUT/JOIN/DEL as :mod:`tsm.specs.overlays`)."""
    from tsm.specs.overlays import apply_overlay

    pod = {"spec": copy.deepcopy(pod_spec)}
    apply_overlay(pod, overlay)
    return pod["spec"]  # type: ignore[no-any-return]


def deep_merge(base: dict[str, Any], overlay: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``overlay`` merged in: dicts merge key by key, lists of containers by ``name``, else replaced."""
    out = copy.deepcopy(base)
    for k, v in overlay.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        elif k == "containers" and isinstance(v, list) and isinstance(out.get(k), list):
            byname = {c.get("name"): i for i, c in enumerate(out[k])}
            for c in v:
                i = byname.get(c.get("name")) if isinstance(c, dict) else None
                if i is None:
                    out[k].append(copy.deepcopy(c))
                else:
                    out[k][i] = deep_merge(out[k][i], c)
        else:
            out[k] = copy.deepcopy(v)
    return out


def _volumes(role: Role, shm_mb: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(volumes, volumeMounts)``: bind -> hostPath, volume -> PVC, device -> hostPath (CharDevice), /dev/shm."""
    vols: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    for i, m in enumerate(role.mounts):
        name = f"m{i}"
        if isinstance(m, BindMount):
            vols.append({"name": name, "hostPath": {"path": m.src_path}})
            mounts.append({"name": name, "mountPath": m.dst_path, "readOnly": m.read_only})
        elif isinstance(m, VolumeMount):
            vols.append({"name": name, "persistentVolumeClaim": {"claimName": m.src, "readOnly": m.read_only}})
            mounts.append({"name": name, "mountPath": m.dst_path, "readOnly": m.read_only})
        elif isinstance(m, DeviceMount):
            vols.append({"name": name, "hostPath": {"path": m.src_path, "type": "CharDevice"}})
            mounts.append({"name": name, "mountPath": m.dst_path, "readOnly": "w" not in m.permissions})
    if shm_mb > 0:
        vols.append({"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": mem_quantity(shm_mb)}})
        mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
    return vols, mounts


def cpu_quantity(milli: int) -> str:
    """Millicores in the API server's canonical form (``1000`` -> ``1``, ``1500`` -> ``1500m``)."""
    return str(milli // 1000) if milli % 1000 == 0 else f"{milli}m"


def mem_quantity(mib: int) -> str:
    """MiB in the API server's canonical form (``200`` -> ``200Mi``, ``2048`` -> ``2Gi``)."""
    for unit in ("Ti", "Gi"):
        size = 1024 ** (2 if unit == "Ti" else 1)
        if mib % size == 0 and mib >= size:
            return f"{mib // size}{unit}"
    return f"{mib}Mi"


def _resources(role: Role, fraction: float) -> tuple[dict[str, Any], Need]:
    res = role.resource
    if is_null_resource(res):
        return {}, Need(role.name, 0, 0, 0)
    limits: dict[str, str] = {}
    requests: dict[str, str] = {}
    cpu_milli = mem = 0
    if res.cpu > 0:
        cpu_milli = max(1, int(res.cpu * 1000 * fraction))
        limits["cpu"] = cpu_quantity(int(res.cpu * 1000))
        requests["cpu"] = cpu_quantity(cpu_milli)
    if res.memMB > 0:
        mem = max(1, int(res.memMB * fraction)) * 1024 * 1024
        limits["memory"] = mem_quantity(res.memMB)
        requests["memory"] = mem_quantity(max(1, int(res.memMB * fraction)))
    if res.gpu > 0:
        limits["nvidia.com/gpu"] = requests["nvidia.com/gpu"] = str(res.gpu)
    for dev, n in res.devices.items():
        limits[dev] = requests[dev] = str(n)
    return {"requests": requests, "limits": limits}, Need(role.name, cpu_milli, mem, max(res.gpu, 0))


@dataclass
class _App:
    """What the manifests of every replica of an app share (the working state of :func:`build_request`)."""

    app_id: str
    opts: KubernetesOptions
    shape: list[list[Any]]
    created: float
    rank0: str
    warn_sig: str
    warn_s: int
    labels: dict[str, str]
    excluded: list[str]
    #: the Secret's data: each distinct env value of the roles under its key (:func:`secret_key`)
    secret_data: dict[str, str] = field(default_factory=dict)


def build_request(app: AppDef, opts: KubernetesOptions, session: str, app_dir_root: str, created: float,
                  owner: str = "x") -> KubernetesRequest:
    """The manifests for ``app`` (labelled with ``owner``); pure but for a fresh random app id."""
    app_id = new_app_id(app.name)
    ns = opts.namespace
    shape = [[r.name, r.num_replicas, r.max_retries, r.retry_policy.value] for r in app.roles]
    sig = opts.warn_signum
    warn_sig = sig.name.removeprefix("SIG") if sig is not None else ""
    given: Any = opts.exclude_nodes or []  # a list; "n1,n2" from a cfg dict given in Python
    a = _App(app_id=app_id, opts=opts, shape=shape, created=created, rank0=f"{host_name(app.roles[0].name, 0)}.{app_id}",
             warn_sig=warn_sig, warn_s=math.ceil(opts.warn_before_s) if warn_sig else 0,
             labels={LABEL_SCHEDULER: "kubernetes", LABEL_APP: app_id, LABEL_SESSION: label_value(session),
                     LABEL_OWNER: label_value(owner)},
             excluded=[n for n in (given.split(",") if isinstance(given, str) else given) if n])
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": app_id, "namespace": ns, "labels": dict(a.labels),
                     "annotations": {ANN_ROLES: json.dumps(shape), ANN_CREATED: f"{created:.3f}"}},
        "spec": {"clusterIP": "None", "publishNotReadyAddresses": True, "selector": {LABEL_APP: app_id},
                 "ports": [{"name": "tsm", "port": 29500}]},
    }
    jobs: list[dict[str, Any]] = []
    needs: list[Need] = []
    for role in app.roles:
        resources, need = _resources(role, opts.request_fraction)
        shm = int(role.resource.memMB * opts.shm_fraction) if not is_null_resource(role.resource) else 0
        vols, vmounts = _volumes(role, shm)
        for i in range(role.num_replicas):
            needs.append(need)
            r = macros.Values(img_root="", app_id=app_id, replica_id=str(i)).apply(role)
            container: dict[str, Any] = {
                "name": CONTAINER,
                "image": role.image,
                "imagePullPolicy": opts.image_pull_policy,
                "command": [escape(r.entrypoint)],
                "args": [escape(x) for x in r.args],
                "env": _env(a, role, r, i),
            }
            if resources:
                container["resources"] = resources
            if vmounts:
                container["volumeMounts"] = vmounts
            jobs.append(_job(a, role, i, _pod(a, role, r, i, container, vols)))
    size = sum(len(k) + len(v.encode("utf-8", "surrogatepass")) for k, v in a.secret_data.items())
    if size > SECRET_LIMIT - 4096:  # room for the metadata
        raise InvalidAppError(
            f"the roles' distinct env values take {size:,} bytes, over the {SECRET_LIMIT:,} bytes Kubernetes takes "
            "in the app's Secret: pass large values as files (a mount) instead of env"
        )
    secret = {
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": {"name": app_id, "namespace": ns, "labels": dict(a.labels)},
        "stringData": a.secret_data,
    }
    return KubernetesRequest(
        app_id=app_id, app_name=app.name, session=session, namespace=ns, service=service, jobs=jobs, roles=shape,
        needs=needs, dns=opts.dns, gang_timeout=opts.gang_timeout, grace_period=opts.grace_period + a.warn_s,
        app_dir=f"{app_dir_root}/{app_id}", spec=app.to_dict(), kubeconfig=opts.kubeconfig, context=opts.context,
        secret=secret, exclude_nodes=a.excluded, **lifecycle_fields(opts),
    )


def _env(a: _App, role: Role, r: Role, i: int) -> list[dict[str, Any]]:
    """Replica ``i``'s env: the role's values by reference to the app's Secret (kept in ``a.secret_data``),
    then tsm's own (plain)."""
    own = {
        "TSM_APP_ID": a.app_id, "TSM_ROLE_NAME": role.name, "TSM_REPLICA_ID": str(i),
        "TSM_NUM_REPLICAS": str(role.num_replicas), RANK0_VAR: a.rank0, "PYTHONUNBUFFERED": "1",
        **attempt_env(0, 0, ""),
    }
    if a.warn_sig:
        own["TSM_WARN_SIGNAL"] = a.warn_sig
    if "TORCHX_JOB_ID" in r.env:  # the runner sets TorchX's names unless torchx_env=false
        own[TORCHX_RANK0_VAR] = a.rank0
    env_spec: list[dict[str, Any]] = []
    for k, v in r.env.items():  # the role's values live in the Secret; the Job names them
        if k in own:
            continue
        key = secret_key(v)
        a.secret_data[key] = v
        env_spec.append({"name": k, "valueFrom": {"secretKeyRef": {"name": a.app_id, "key": key}}})
    return env_spec + [env_var(k, v) for k, v in own.items()]


def _pod(a: _App, role: Role, r: Role, i: int, container: dict[str, Any],
         vols: list[dict[str, Any]]) -> dict[str, Any]:
    """Replica ``i``'s pod spec around ``container``: its warning, deadline, placement and overlay."""
    opts = a.opts
    if a.warn_sig:  # the warning: each process that handles it, then warn_before, then SIGTERM (lifecycle_hook)
        container["lifecycle"] = lifecycle_hook(a.warn_sig, a.warn_s)
    if role.port_map:
        container["ports"] = [{"name": port_name(k), "containerPort": p} for k, p in role.port_map.items()]
    pod: dict[str, Any] = {
        "restartPolicy": "Never",
        "hostname": host_name(role.name, i),
        "subdomain": a.app_id,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": opts.grace_period + a.warn_s,
        "containers": [container],
    }
    limit = opts.time_limit_s
    if limit is not None and opts.requeue_on_time_limit:  # tsm requeues at the limit; this is a backstop
        pod["activeDeadlineSeconds"] = math.ceil(limit) + REQUEUE_BACKSTOP
    elif limit is not None:  # the kubelet ends the pod there (reason DeadlineExceeded), warning first
        pod["activeDeadlineSeconds"] = max(1, math.ceil(limit) - a.warn_s)
    if vols:
        pod["volumes"] = vols
    selector = {str(k): str(v) for k, v in role.resource.capabilities.items()}
    if selector:
        pod["nodeSelector"] = selector
    if opts.service_account:
        pod["serviceAccountName"] = opts.service_account
    if opts.priority_class:
        pod["priorityClassName"] = opts.priority_class
    overlay = r.metadata.get(OVERLAY_KEY)
    if isinstance(overlay, dict) and isinstance(overlay.get("V1Pod"), dict):  # TorchX's set_overlay(role, "kubernetes", "V1Pod", ...)
        pod = with_pod_overlay(pod, overlay["V1Pod"])
    elif isinstance(overlay, dict):
        pod = deep_merge(pod, overlay)
    return with_excluded_nodes(pod, a.excluded) if a.excluded else pod


def _job(a: _App, role: Role, i: int, pod: dict[str, Any]) -> dict[str, Any]:
    """Replica ``i``'s Job (its labels and annotations on the pod template too)."""
    labels = {**a.labels, LABEL_ROLE: label_value(role.name), LABEL_REPLICA: str(i), LABEL_ATTEMPT: "0"}
    annotations = {ANN_ROLE: role.name, ANN_ROLES: json.dumps(a.shape), ANN_CREATED: f"{a.created:.3f}",
                   ANN_RANK0: a.rank0}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": job_name(a.app_id, role.name, i), "namespace": a.opts.namespace, "labels": labels,
                     "annotations": annotations},
        "spec": {
            "backoffLimit": role.max_retries if role.retry_policy == RetryPolicy.REPLICA else 0,
            "completions": 1,
            "parallelism": 1,
            "template": {"metadata": {"labels": dict(labels), "annotations": dict(annotations)}, "spec": pod},
        },
    }


def with_excluded_nodes(pod: dict[str, Any], nodes: list[str]) -> dict[str, Any]:
    """``pod`` (a pod spec) kept off ``nodes``: a ``NotIn`` expression on ``kubernetes.io/hostname`` added to
    every required node-selector term (one term when there is none: terms are ORed, so each must carry it).
    The scheduler then never places it there (``exclude_nodes``, and the nodes a replica was lost with)."""
    if not nodes:
        return pod
    out = copy.deepcopy(pod)
    required = (out.setdefault("affinity", {}).setdefault("nodeAffinity", {})
                .setdefault("requiredDuringSchedulingIgnoredDuringExecution", {}))
    terms = required.setdefault("nodeSelectorTerms", [])
    if not terms:
        terms.append({})
    for term in terms:
        exprs = term.setdefault("matchExpressions", [])
        mine = next((e for e in exprs if e.get("key") == HOSTNAME_LABEL and e.get("operator") == "NotIn"), None)
        if mine is None:
            exprs.append({"key": HOSTNAME_LABEL, "operator": "NotIn", "values": sorted(set(nodes))})
        else:
            mine["values"] = sorted({*mine.get("values", []), *nodes})
    return out


def attempt_env(attempt: int, restart_count: int, last_exit: str) -> dict[str, str]:
    """What an attempt of a replica is told (:mod:`tsm.lifecycle`): ``TSM_ATTEMPT``, ``TSM_RESTART_COUNT``
    and ``TSM_LAST_EXIT`` (``failed:<code>`` ...; empty on the first)."""
    return {"TSM_ATTEMPT": str(attempt), "TSM_RESTART_COUNT": str(restart_count), "TSM_LAST_EXIT": last_exit}


def lifecycle_hook(signame: str, warn_before: int) -> dict[str, Any]:
    """The container's ``preStop`` hook that warns it: Kubernetes runs it before SIGTERM whenever the pod
    ends by a decision (deleted by a cancel, its ``activeDeadlineSeconds`` reached, evicted), within the
    termination grace period (lengthened by ``warn_before`` for it). It sends ``signame`` to every process of
    the container that handles it (:func:`~tsm.schedulers.common.warn.handlers_script`: the workers under
    ``torchrun``, the program under a ``bash -c`` wrapper; a launcher without a handler would end at it) and
    waits ``warn_before`` seconds, or less once PID 1 (the replica's entrypoint: tsm sets ``command``) has
    ended. Needs ``/bin/sh`` and ``kill`` in the image.

    Sent once: a kubelet may run the hook more than once for one end (1.20 does at ``activeDeadlineSeconds``),
    so the hook marks ``/tmp/.tsm-warned`` and a later run only waits (where ``/tmp`` is not writable the
    warning may come twice; :func:`tsm.lifecycle.on_warning` runs its callback once anyway)."""
    script = (f"if [ ! -d /tmp/.tsm-warned ]; then mkdir /tmp/.tsm-warned 2>/dev/null; {handlers_script(signame)}; fi; "
              f"i=0; while [ $i -lt {warn_before} ] && kill -0 1 2>/dev/null; do sleep 1; i=$((i+1)); done")
    return {"preStop": {"exec": {"command": ["/bin/sh", "-c", script]}}}


def env_var(name: str, value: str) -> dict[str, str]:
    """One plain env entry of a container. An empty value is left out, as the API server stores it (``value``
    is omitted when empty), so the dry run is exactly what the server holds."""
    return {"name": name, "value": escape(value)} if value else {"name": name}
