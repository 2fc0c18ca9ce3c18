"""The ``ray`` scheduler: an app is a Ray job whose driver runs one named actor per replica.

Usage::

    pip install 'tsm[ray]'                        # ray[default], imported only by this backend
    make ray-up                                   # a local head for trying it (scripts/ray-up)
    tsm run -s ray utils.echo --msg hello
    tsm run -s ray -c placement_strategy=PACK dist.ddp -j 2x1 --script train.py

What it does:

* **A Ray job per app** (``submission_id`` = the app id, ``metadata`` naming the app, its session and
  roles); the job's driver (:mod:`.driver`, 0 CPU) starts **one named actor per replica**,
  ``<app_id>/<role>/<k>`` in namespace ``tsm``, holding the role's ``cpu``/``gpu``/``memMB`` (a role without a
  resource: 1 CPU, no GPU, no memory reservation, as TorchX gave it; the dry run says so), which runs the
  replica's command as a subprocess with its args and env byte for byte.
* **Gang start**: one placement group for all replicas (run option ``placement_strategy``: ``SPREAD``
  default, ``PACK``); not placed within ``gang_timeout`` seconds -> FAILED with the reason. A replica no
  node could ever hold is refused at submit (:class:`~tsm.errors.InvalidAppError`).
* **Deterministic ranks**: role 0 replica 0's node address is every replica's ``TSM_RANK0_HOST``
  (``${rank0_env}``), so ``dist.ddp`` rendezvous works across actors.
* **Retries** ``REPLICA``, ``ROLE``, ``APPLICATION`` are run by the driver; ``num_restarts`` counts them.
* **Long runs** (issue 25, :mod:`.driver`): ``time_limit`` (warned, then stopped; or restarted as a
  preemption with ``requeue_on_time_limit``), a warning before a cancel, actors lost with their node
  restarted elsewhere as a **preemption** (budget ``max_preemptions``, never ``max_retries``; the node is
  excluded from later attempts by a ``ray.io/node-id`` label selector on the placement group), a replica
  the node's kernel OOM killer ended (a failure, ``max_retries``; its node excluded the same way),
  ``exclude_nodes`` (node ids, IPs or hostnames; refused at submit when it names no node or every alive
  node), ``stall_timeout``/``on_stall``.
* **Status**: one ``list_jobs`` per refresh for every app of the process (the kit's ``StatusWatcher``),
  plus, per running app, the driver's status record (per role and replica: state, node, pid, exit code).
* **Views**: ``tsm top``/``tsm serve`` see every Ray app of a tick through one ``list_jobs`` (:mod:`.view`);
  a driver's status record is read when its job changed state, else at most every 5 s; usage is n/a.
* **Logs** (a followed replica is streamed: each addition is sent once): each replica's stdout and stderr,
  apart or combined, with times (``since``/``until``), regex,
  follow; kept in the Ray log directory of the replica's node and read through Ray's log API.
* **Cancel**: ``ray job stop``; the driver stops each replica's process group (SIGTERM, SIGKILL after
  ``grace_period``) and kills the actors; a watchdog per replica kills its processes if its actor dies.
* **Address**: run option ``address``, else ``$RAY_ADDRESS``, else ``http://127.0.0.1:8265``; every later call
  about the app goes to the cluster it was submitted to (kept in its record). Calls are plain HTTP to the
  dashboard with a timeout each (Ray's SDK would let ``$RAY_ADDRESS`` override ``-c address=`` and has no
  timeouts); an unreachable head or a wrong address is one line saying what to do.
* **Working directory**: ``--workspace DIR`` ships a snapshot of DIR; without one, the launching directory
  is the job's ``working_dir`` (Ray zips it, honouring ``.gitignore`` and leaving out ``.git``, ``.venv``,
  ...), so ``--script train.py`` runs from it as it would locally; ``-c ship_cwd=False`` ships nothing.
* **Env values** travel only in the payload package (a content-hashed zip in the cluster's store), never in
  the job's entrypoint, metadata or ``runtime_env`` that ``ray job list`` and the dashboard show; the local
  copy is 0600 in a 0700 folder. Anyone who can reach the dashboard can fetch packages (and run code on the
  cluster): keep the dashboard private or enable Ray's token authentication.
* **Secrets** (``-c secrets=``, from env or a file; :mod:`.secrets`): put in the cluster's store under a key
  of their own, apart from the job (its definition holds names only), taken and deleted there by the driver
  as it starts, then in memory and each replica's environment at every attempt.

The cluster's Python needs ``ray``; tsm itself is shipped with each job (``py_modules``, content-hashed).
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from tsm.schedulers.ray.scheduler import RayScheduler


def create_scheduler(session_name: str, **kwargs: object) -> RayScheduler:
    """The ray scheduler for ``session_name`` (``ray`` is imported on first use, not here)."""
    from tsm.schedulers.common.factory import scheduler_params
    from tsm.schedulers.ray.scheduler import RayScheduler

    kwargs = scheduler_params("ray", kwargs, ("address",))
    return RayScheduler(session_name, address=str(kwargs.get("address") or ""))
