"""The ``docker`` scheduler: every replica a container on this host's Docker engine, one network per app.

Usage::

    pip install 'tsm[docker]'                  # the official docker SDK, imported only by this backend
    tsm run -s docker utils.echo --image tsm-test/python:3 --msg hello
    tsm run -s docker -c pull=never --workspace . dist.ddp -j 2x1 --image my/torch:cpu --script train.py

What it does:

* **One container per replica** named ``<app_id>-<role>-<k>``, on a bridge network ``tsm-<app_id>`` made for
  the app, where Docker's DNS resolves ``<role>-<k>``; ``TSM_RANK0_HOST`` (``${rank0_env}``) is role 0's
  replica 0. ``cpu`` -> CPU quota, ``memMB`` -> memory limit (no swap) and a ``/dev/shm`` of
  ``shm_fraction`` of it, ``gpu`` -> device requests (refused at dry run on a host without NVIDIA GPUs),
  mounts: bind, volume and device.
* **No blind pulls**: run option ``pull`` = ``missing`` (default: pull only an image not present here),
  ``always``, ``never``. An image that cannot be had makes the app FAILED with Docker's message.
* **Retries**: ``REPLICA`` by Docker's restart policy ``on-failure:<max_retries>`` (``RestartCount`` is the
  replica's restarts); ``ROLE`` and ``APPLICATION`` by tsm, which replaces the role's (or app's) containers
  when it observes the failure -- on any ``describe``/``wait``/``status``, so something must be watching
  (``tsm run`` attached, ``tsm wait``); a launcher that is gone retries when the next status call comes.
* **Long runs**, carried out when tsm looks at the app: ``time_limit`` (warned first with
  ``warn_signal``; ``requeue_on_time_limit`` restarts the app as a preemption), preemption by a daemon
  restart (a container ended by a signal before the daemon's start: :mod:`.status`), spent from
  ``max_preemptions`` and never ``max_retries``, ``stall_timeout``/``on_stall`` (:mod:`.stall`). Every
  attempt sees ``TSM_ATTEMPT``, ``TSM_RESTART_COUNT``, ``TSM_LAST_EXIT``. ``exclude_nodes`` is refused.
* **Submit** creates a role's containers a few at a time concurrently (``CREATE_CONCURRENCY``).
* **Status** is one ``containers.list`` by label per refresh for every app of the process (the kit's
  ``StatusWatcher``); an ended container is inspected once for its exit code and ``OOMKilled``.
* **Views**: ``tsm top``/``tsm serve`` see every Docker app of a tick through one container list
  (:mod:`.view`); CPU and memory come from container stats sampled every 5 s by a background thread.
* **Logs** come from Docker (``local`` log driver: bytes kept as written), stdout and stderr apart or
  combined in order, ``since``/``until``/regex, follow. Before tsm removes a container its output is
  copied into ``$TSM_HOME/docker/<app_id>/logs``, so logs of removed containers stay readable.
* **Cancel** stops every container (SIGTERM, SIGKILL after ``grace_period``), snapshots the logs, then
  removes the containers and the network: nothing is left.
* **Retention**: an app that ends by itself keeps its (stopped) containers and network so ``docker
  inspect`` and ``docker logs`` work, until ``tsm rm`` (:meth:`DockerScheduler.remove`),
  :meth:`DockerScheduler.cleanup` (``python -m tsm.schedulers.docker cleanup [--dry-run] [--include-running]``:
  every ended app, and networks whose app is gone -- what a crashed launcher leaves), or ``-c remove_finished=True``.
* **Owners**: every container and network carries the owner label (``tsm.owner``, the login name or
  ``$TSM_OWNER``); list, status, cancel and cleanup see only the caller's. A status look acts (retries,
  stopping the others after a failure) only on apps whose request this ``$TSM_HOME`` holds. Files kept in
  ``$TSM_HOME`` are private (0600/0700) whatever its mode; a container's log is streamed to disk, never read whole.
* **Secrets** (``-c secrets=...``, a role's ``secrets``): read at submit into a read-only volume of the
  role, one file per secret, which a ``/bin/sh`` wrapper exports before it runs the program (``exec``); no
  value in the request, the dry run, ``docker inspect`` or ``$TSM_HOME`` (:mod:`.secrets`).
* **Workspaces**: ``--workspace DIR`` snapshots DIR (``.tsmignore``) and builds ``FROM <role image>`` +
  ``COPY . /workspace`` (or the workspace's ``Dockerfile.tsm``), tagged by the snapshot's content hash and
  the base image id: an unchanged workspace reuses the image and builds nothing; the dry run says which.

Docker's API carries text: args or env values holding bytes that are not UTF-8 are refused at dry run.
A missing or stopped engine is :class:`~tsm.errors.SchedulerUnavailableError` saying how to start one
(``sudo scripts/docker-up``).
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from tsm.schedulers.docker.scheduler import DockerScheduler


def create_scheduler(session_name: str, **kwargs: object) -> DockerScheduler:
    """The docker scheduler for ``session_name`` (the SDK is imported on first use, not here)."""
    from tsm.schedulers.common.factory import scheduler_params
    from tsm.schedulers.docker.scheduler import DockerScheduler

    scheduler_params("docker", kwargs, ())  # takes no parameters: any keyword is an error naming it
    return DockerScheduler(session_name)
