"""The ``kubernetes`` scheduler: every replica a ``batch/v1`` Job behind one headless Service; no Volcano, no CRD.

Usage::

    pip install 'tsm[kubernetes]'              # the official kubernetes client, imported only by this backend
    tsm run -s kubernetes utils.echo --image tsm-test/python:3 --msg hello
    tsm run -s kubernetes -c namespace=ml,gang_timeout=120 dist.ddp -j 2x1 --image my/torch:cpu --script train.py

What it does (works on any cluster >= 1.20, built-in objects only):

* **Objects**: per app one headless Service ``<app_id>`` (``clusterIP: None``, ``publishNotReadyAddresses``)
  and one Job per replica whose pod has ``hostname: <role>-<k>``, ``subdomain: <app_id>``, ``tsm/*`` labels,
  and an ``ownerReference`` to the Service: deleting the Service deletes everything. ``tsm run --dryrun``
  prints the manifests as YAML exactly as they are created (names cut to 63 characters with a stable hash;
  every string quoted, so kubectl's YAML 1.1 reader keeps ``yes``/``On``/``Null`` strings).
* **Secrets and owners**: the roles' env values go in one Secret per app (owned by the Service, deleted
  with it); the Jobs name them (``secretKeyRef``), never hold them. So do declared secrets (``-c secrets=``),
  read at submit into that Secret, or a Secret of the user's the pods reference (``NAME:k8s:SECRET/KEY``):
  :mod:`.secrets`. Every object carries the owner label
  (``tsm/owner``, the login name or ``$TSM_OWNER``) and every list, cancel and cleanup selects by it.
* **Bounded calls**: every API call has a ``_request_timeout``: an API server that never answers makes
  ``status``/``cancel``/a view's refresh fail with one line within it, never hang.
* **Rank 0**: ``TSM_RANK0_HOST`` (``${rank0_env}``) is ``<role0>-0.<app_id>``, the Service's DNS name. On a
  cluster without DNS (run option ``dns=auto`` detects it; ``yes``/``no`` force it) rank 0 is created first
  and reads its own pod IP (downward API); the others get that IP (again for a retried role/app) and
  ``hostAliases`` mapping rank 0's names to it, since torch's c10d rendezvous advertises rank 0's FQDN.
* **Gang start**: ``schedule`` refuses an app whose requests exceed a node's or the cluster's allocatable
  (it could never run); after creation, if not every replica is Running within ``gang_timeout`` seconds,
  the app is deleted and FAILED with Kubernetes' reason (``ErrImagePull``, ``Unschedulable``, ...).
* **Retries**: ``REPLICA`` -> the Job's ``backoffLimit`` (a new pod per try; its failed pods are the
  replica's restarts); ``ROLE``/``APPLICATION`` -> tsm deletes the role's (app's) Jobs and creates new ones
  labelled ``tsm/attempt=<n>`` when a status refresh sees the failure (so something must be watching:
  ``tsm run`` attached, ``tsm wait``); the attempt count lives on the objects, ``num_restarts`` from it.
* **Preemptions**: a pod evicted (reason ``Evicted``, condition ``DisruptionTarget``, deleted by
  anyone but tsm: the eviction API, a drain) or lost with its node makes its replica ``preempted``; a look
  restarts its scope as a new attempt on ``max_preemptions`` (never ``max_retries``), once the old pods have
  ended, with ``TSM_LAST_EXIT=preempted``; a lost node is excluded from the new Jobs (a required node
  anti-affinity term, as ``exclude_nodes`` writes), and so is the node of a pod ``OOMKilled`` with no memory
  limit of its own (the node ran out: a failure, retried on ``max_retries``). ``requeue_on_time_limit``: a
  look at the limit restarts the app the same way (``TSM_LAST_EXIT=time_limit``; the limit counts again).
* **Stalls** (``stall_timeout``/``on_stall``, :mod:`.stall`): a look checks, once a tick, each
  running pod's last log line (``tailLines=1``, timestamps) and, where ``metrics.k8s.io`` answers, its CPU
  (without a metrics API the log alone decides); a stalled replica is FAILED "stalled for X, last line: ..."
  and retried as its own failure (``TSM_LAST_EXIT=stalled``) or fails the app, its pods warned by the
  ``preStop`` hook first. Every look of an app holds its directory's ``lock`` (one process acts at a time).
* **Resources**: ``cpu``/``memMB`` -> limits, requests = ``request_fraction`` of them (default 1: guaranteed);
  ``gpu`` -> ``nvidia.com/gpu``; ``devices`` -> extended resources; ``/dev/shm`` a memory emptyDir of
  ``shm_fraction`` x memMB; ``capabilities`` -> ``nodeSelector``; mounts: bind -> hostPath, volume -> PVC,
  device -> hostPath CharDevice. Role metadata ``kubernetes`` (a dict) is deep-merged into the pod spec
  (tolerations, imagePullSecrets, affinity, ...). ``imagePullPolicy`` defaults to ``IfNotPresent``.
* **Status**: one label-selected pod list per refresh for every app of the namespace (the kit's
  ``StatusWatcher``): API calls per refresh do not grow with replicas. Replica messages carry the pod's
  reason (ErrImagePull, OOMKilled, Unschedulable, Evicted).
* **Logs**: Kubernetes keeps stdout and stderr in one log, so only the combined stream is served (asking for
  one stream is refused with a clear error); ``since``/``until``/regex, follow, every try of a retried
  replica. Before tsm deletes a pod its log is copied into ``$TSM_HOME/kubernetes/<app_id>/logs`` (never
  replaced by a shorter copy; a pod stopped with a grace period is followed to its end, so the lines it
  writes after the warning are kept too).
* **Lifetime**: an app that ends is deleted from the cluster at once (its logs and final status kept
  locally: ``describe``, ``logs`` and ``list`` keep working; 1.20 has no Job TTL controller); ``cancel``
  deletes every object (cascading, with ``grace_period``). What nothing saw end (a killed launcher, a
  detached run, another machine's apps) goes with ``tsm rm`` or ``python -m tsm.schedulers.kubernetes
  cleanup --older-than SECONDS`` (:meth:`KubernetesScheduler.cleanup`; from cron: finished apps kept for a time).
* **Workspaces**: ``--workspace`` builds an image of it on the first role's image with the local Docker
  engine (:mod:`tsm.workspace.image`: content-hash tag, reused while unchanged); the kubelet runs it with
  ``IfNotPresent`` and no registry when its runtime is that engine (dockershim, as ``scripts/k8s-up``).
* **Views**: ``view_snapshot`` gives ``tsm top``/``tsm serve`` every app from one pod list (plus one
  ``metrics.k8s.io`` list for usage where metrics-server runs; n/a elsewhere).

Kubernetes expands ``$(VAR)`` in commands and env values: tsm writes every ``$`` as ``$$`` so arguments
arrive byte for byte. Values that are not UTF-8 and env names Kubernetes refuses are refused at dry run.
Run options ``kubeconfig``/``context``/``namespace`` pick the cluster per app; the scheduler's own
(``create_scheduler(..., namespace=, kubeconfig=, context=)``, default ``$KUBECONFIG``) serves ``list``.

Modules: :mod:`.scheduler` (each look: observe, decide, act; on the kit's
:class:`~tsm.schedulers.common.container.ContainerScheduler`), :mod:`.request` (pure: AppDef -> manifests),
:mod:`.dryrun` (their YAML text), :mod:`.manifests` (what a look changes in them), :mod:`.tries` (making Jobs,
a new try), :mod:`.nodes` (the gang fit, pods the cluster took, nodes a retry avoids), :mod:`.status` (pods ->
states), :mod:`.stall`, :mod:`.logs`, :mod:`.secrets` (declared secrets), :mod:`.client` (the API, bounded calls) and
:mod:`.view` (the views' hook).
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from tsm.schedulers.kubernetes.scheduler import KubernetesScheduler


def create_scheduler(session_name: str, **kwargs: object) -> KubernetesScheduler:
    """The kubernetes scheduler for ``session_name`` (the client is imported on first use, not here).

    ``namespace``, ``kubeconfig`` and ``context`` keyword arguments choose the cluster ``list`` reads.
    """
    from tsm.schedulers.common.factory import scheduler_params
    from tsm.schedulers.kubernetes.scheduler import KubernetesScheduler

    kwargs = scheduler_params("kubernetes", kwargs, ("namespace", "kubeconfig", "context"))
    ns = kwargs.get("namespace")
    kc = kwargs.get("kubeconfig")
    ctx = kwargs.get("context")
    return KubernetesScheduler(
        session_name, namespace=str(ns) if ns else "default", kubeconfig=str(kc) if kc else None,
        context=str(ctx) if ctx else None,
    )
