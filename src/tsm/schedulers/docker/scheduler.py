"""DockerScheduler: the interface, gluing the pure request/status modules to the Docker client.

Local store: ``$TSM_HOME/docker/<app_id>/`` (:class:`~tsm.schedulers.common.appdir.AppDir`: private, written
whole) holds ``request.json`` (the containers, to recreate them for ROLE/APPLICATION retries), ``app.json``
(the :class:`AppRecord`), ``logs/`` (snapshots of every container's output taken before it is removed) and
``final.json`` (the app's last status and its start and end, written when its containers are removed: by
``cancel``, ``remove``, ``cleanup`` or ``remove_finished``); for long runs ``preemptions.json`` (the
restarts made as preemptions: a container ended by a daemon restart, a requeue at the time limit; each as
``[attempt, [roles]]``, so two roles preempted into the same try are two restarts and two processes deciding
the same restart record it once; spent from ``max_preemptions``, never ``max_retries``), ``time_limit_from``,
``warned``/``time_limit_reached``/``stall_stopped`` markers (``O_EXCL``: one process acts), ``stall.json``
(:mod:`tsm.schedulers.docker.stall`) and ``lock`` (held by one look from load to save).

**Stops do not hold the caller.** A stop the controller decides (a final failure, a stall, after the warning
lead) is handed to a detached helper process (``python -m tsm.schedulers.docker stop --after S --grace G``,
:meth:`DockerScheduler._stop_later`) that waits for the containers to end or the lead to pass and then stops
them: a ``tsm status`` returns at once, and the stop still happens when the CLI has exited, so no replica is
left running unwatched. A scheduler given its client (a fake engine in the tests) cannot be reached from
another process: it stops in threads of its own process, which a CLI waits for before it exits.

Each look is the kit's controller step (:mod:`tsm.schedulers.common.controller`): observe (one container list),
decide (pure), act (:meth:`DockerScheduler.act`), only for an app whose ``request.json`` this home holds.
"""

from __future__ import annotations

import builtins
import contextlib
import os
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

from tsm.env import image as env_image
from tsm.errors import SchedulerError, SubmissionError
from tsm.schedulers.api import DescribeAppResponse, LockfileEnvironments, Secrets
from tsm.schedulers.common import keeper
from tsm.schedulers.common.appdir import kept_status
from tsm.schedulers.common.container import mark_cancelled
from tsm.schedulers.common.container_lock import claim, locked
from tsm.schedulers.common.controller import (
    Decision,
    Finish,
    Limits,
    Retry,
    Warn,
    count_preemptions,
    decide,
    shapes,
)
from tsm.schedulers.common.failure import failure_of
from tsm.schedulers.common.files import unlink
from tsm.schedulers.common.lifecycle_opts import DEFAULT_MAX_PREEMPTIONS
from tsm.schedulers.common.owner import owner
from tsm.schedulers.common.polling import poll_until, poll_until_terminal
from tsm.schedulers.common.record import AppRecord
from tsm.schedulers.common.status import AppStatusView
from tsm.schedulers.docker import secrets as docker_secrets
from tsm.schedulers.docker.client import DockerClient
from tsm.schedulers.docker.debug import DockerDebug
from tsm.schedulers.docker.logs import DockerLogs
from tsm.schedulers.docker.request import (
    LABEL_APP,
    LABEL_ATTEMPT,
    LABEL_OWNER,
    LABEL_SCHEDULER,
    LABEL_SESSION,
    ContainerSpec,
    DockerOptions,
    DockerRequest,
    attempt_env,
    build_request,
    format_request,
    validate,
)
from tsm.schedulers.docker.stall import StallState, check
from tsm.schedulers.docker.status import AppView, Observed, app_status, app_times, group, parse_time
from tsm.specs.api import AppDef, AppDryRunInfo, AppState
from tsm.specs.runopts import CfgVal, runopts
from tsm.workspace.image import ImageEngine, ImagePlan, build_image

TYPE_CHECKING = False
if TYPE_CHECKING:
    from tsm.schedulers.docker.view import DockerView

#: seconds after which a tsm network without containers counts as left behind (cleanup removes it)
ORPHAN_AGE = 60.0
#: seconds a status snapshot (one containers.list for every app) is reused by describe
MAX_AGE = 0.2
#: containers of an app created at once (bounded: the SDK's pool holds 10 connections to dockerd)
CREATE_CONCURRENCY = 8
#: seconds a network whose just-removed containers dockerd has not released yet is retried
NETWORK_RELEASE = 5.0
#: marker files in the app's directory: the warning was sent; the time limit was reached
WARNED, TIME_LIMIT = "warned", "time_limit_reached"

#: a counter in the app's directory, changed by each look that replaces containers (:meth:`DockerScheduler.look`)
GENERATION = "generation"
#: files in the app's directory: the restarts made as preemptions (JSON ``[[attempt, [roles]], ...]``); when
#: the time limit counts from after a requeue (epoch seconds)
PREEMPTIONS, CLOCK = "preemptions.json", "time_limit_from"
#: marker: the replicas of an app failed for a stall (``on_stall=fail``) were told to stop
STALL_STOPPED = "stall_stopped"
#: the app directory's log of the detached stop helpers (their errors: nobody else would see them)
STOP_LOG = "stop.log"

#: The stop helper's entry point (``python -m tsm.schedulers.docker stop``, started by :func:`tsm.util.daemon.command`).
STOP_HELPER = "tsm.schedulers.docker.__main__:main"


def has_gpus() -> bool:
    """True when this host has NVIDIA GPUs Docker can hand out."""
    return os.path.exists("/dev/nvidiactl")


class DockerScheduler(DockerLogs, LockfileEnvironments, Secrets, DockerDebug):
    """Runs each replica as a container on a network of its app (see :mod:`tsm.schedulers.docker`), on the
    container kit (:class:`~tsm.schedulers.common.container.ContainerScheduler`).

    Capabilities: ``WorkspaceBuilder`` (a workspace becomes an image built on the first role's),
    ``BatchedViews`` (one container list per view refresh: :mod:`tsm.schedulers.docker.view`), ``PresetAppIds``
    (the dry run names the app). Not ``SizedPlacement``: a role without a size runs without limits, as ``docker
    run`` does. ``Secrets``: in a read-only volume of each role, read before the program (:mod:`.secrets`).

    ``client`` and ``images`` are the seams to the engine (tests pass fakes: ``tests/schedulers/docker/fake_docker.py``).
    """

    max_age = MAX_AGE

    def __init__(self, session_name: str, client: DockerClient | None = None, images: ImageEngine | None = None) -> None:
        #: a client given by the caller (a fake engine, an embedding program) is not reachable from a helper
        #: process: stops then run in (non-daemon) threads of this process (see the module docstring)
        super().__init__("docker", session_name, in_process=client is not None, images=images)
        self._client = client
        #: networks the last :meth:`cleanup` could not remove, with Docker's reason
        self.cleanup_errors: builtins.list[str] = []
        #: app id -> (started, ended) as the last look saw them
        self._times: dict[str, tuple[float | None, float | None]] = {}

    @property
    def client(self) -> DockerClient:
        """The engine's containers and networks (connected on first use)."""
        if self._client is None:
            self._client = DockerClient()
        return self._client

    # -- requests -----------------------------------------------------------------------------------------
    def run_opts(self) -> runopts:
        return DockerOptions.runopts()

    def _validate(self, app: AppDef, cfg: Mapping[str, CfgVal]) -> None:
        validate(app, has_gpus())

    def _submit_dryrun(self, app: AppDef, cfg: Mapping[str, CfgVal]) -> AppDryRunInfo[DockerRequest]:
        opts = DockerOptions.from_cfg(cfg)
        app, env_images = env_image.apply(app, opts, lambda: self.images, opts.pull)  # lockfile environments
        req = build_request(app, opts, self.session_name, str(self.store_root()), time.time(), owner())
        req.builds = [plan for plan in map(ImagePlan.from_metadata, app.roles) if plan is not None]
        built = {b.tag for b in req.builds} | {e.tag for e in env_images}
        req.images = [i for i in req.images if i not in built]
        return AppDryRunInfo(request=req, fmt=env_image.fmt(format_request, env_images) if env_images else format_request)

    def schedule(self, dryrun_info: AppDryRunInfo[DockerRequest]) -> str:
        req = dryrun_info.request
        app = dryrun_info.app or AppDef.from_dict(req.spec)
        values = docker_secrets.read_values(req)  # a missing one fails first; the values stay in memory
        env_image.build_all(AppDef.from_dict(req.spec), self.images)  # before anything of the app exists
        self.app_dir(req.app_id).save_submission(req.to_json(), AppRecord("docker", req.session, app, os.getcwd(), {}))
        self._watcher.submitted(req.app_id)
        for b in req.builds:  # unless its tag is already here (then nothing is built)
            build_image(b, self.images)
        for image in req.images:
            reason = self.images.ensure_image(image, req.pull)
            if reason:
                self._write_final(req, AppState.FAILED, reason)
                return req.app_id
        labels = {LABEL_SCHEDULER: "docker", LABEL_APP: req.app_id, LABEL_SESSION: req.session,
                  LABEL_OWNER: req.owner or self.client.owner}
        self.client.create_network(req.network, labels)
        try:
            docker_secrets.deliver(self.client, req, values)
            self._create(req)
        except SchedulerError as e:
            self._teardown(req.app_id, req.network)
            self._write_final(req, AppState.FAILED, f"could not start: {e}")
            raise SubmissionError(f"app {req.app_id} could not start: {e}") from e
        self._ensure_keeper()
        return req.app_id

    def _create(self, req: DockerRequest, specs: builtins.list[ContainerSpec] | None = None) -> None:
        """Create and start the containers ``specs`` (default: every one of ``req``), at most
        :data:`CREATE_CONCURRENCY` at once (a create and a start are two round trips to dockerd each; the
        SDK's connection pool holds 10). The first failure is raised once the calls under way have returned
        (the caller tears the app down)."""
        todo = req.containers if specs is None else specs
        if len(todo) <= 1:
            for c in todo:
                self.client.run(c, req.network)
            return
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=min(CREATE_CONCURRENCY, len(todo)),
                                thread_name_prefix="tsm-docker-create") as pool:
            futures = [pool.submit(self.client.run, c, req.network) for c in todo]
            errors = [e for f in futures if (e := f.exception()) is not None]
        if errors:
            raise errors[0]

    # -- status: observe -> decide -> act -------------------------------------------------------------
    def _parse_request(self, text: str) -> DockerRequest:
        return DockerRequest.from_json(text)

    def _app_status(self, view: AppView) -> AppStatusView:
        return app_status(view)

    def _new_view(self) -> DockerView:
        from tsm.schedulers.docker.view import DockerView

        return DockerView(self, self.client, self.times)

    def _observe(self, app_id: str | None = None) -> dict[str, tuple[AppView, Any]]:
        """One owner-scoped container list (of ``app_id`` only: an app this home submitted), each app's view
        with its :data:`GENERATION` read before the list (a look that then replaced containers changed it)."""
        if app_id is None:
            gens = {a: self.app_dir(a).read(GENERATION) for a in keeper.running_apps(self.store_root())}
            views = group(self.client.list_containers())
            for a, view in views.items():
                self._times[a] = app_times(view.containers)
            return {a: (view, gens.get(a)) for a, view in views.items()}
        d = self.app_dir(app_id)
        if d.cancelling:
            return {}
        # Running, yet absent from the list: a look of another process (the keeper, a `tsm status`) was
        # replacing its containers (a retry removes the old ones, then makes the new ones) while the list
        # was taken. That look holds the app's lock: once it is free the new ones are there.
        with locked(d):
            gen = d.read(GENERATION)
        one = group(self.client.list_containers(app_id)).get(app_id)
        return {} if one is None else {app_id: (one, gen)}

    def times(self, app_id: str) -> tuple[float | None, float | None]:
        """``(started, ended)`` of an app: from its containers while Docker has them, else from its final
        status (None each when unknown), for the views' DURATION."""
        kept = self.app_dir(app_id).final_times()
        if kept != (None, None):
            return kept
        return self._times.get(app_id, (None, None))

    def look(self, view: AppView, mark: Any = None) -> DescribeAppResponse:
        """One controller step for an app: observe (``view``), :func:`decide`, :meth:`act`; before deciding,
        the stall check of an app with ``stall_timeout`` (:mod:`tsm.schedulers.docker.stall`). An app this
        home submitted is stepped under its directory's lock (:func:`~tsm.schedulers.common.container_lock.locked`):
        two processes looking at it at once (``tsm status`` beside an attached ``tsm run``, the keeper) act
        in turn, the second on what the first did: ``mark`` is the app's :data:`GENERATION` read before
        ``view`` was listed, and a look that replaced containers meanwhile changed it, so the app's containers
        are listed again (else the second look would act on containers that no longer exist, a retry twice)."""
        req = self.request(view.app_id)
        if req is None:
            return self._step(view, None)
        d = self.app_dir(view.app_id)
        with locked(d):
            if d.read(GENERATION) != mark:
                fresh = group(self.client.list_containers(view.app_id)).get(view.app_id)
                if fresh is None:  # the other look removed them (an end with remove_finished)
                    return kept_status(d) or self._describe_view(view)
                view = fresh
            return self._step(view, req)

    def _step(self, view: AppView, req: DockerRequest | None) -> DescribeAppResponse:
        d = self.app_dir(view.app_id)
        stall = StallState.load(d) if req is not None and req.stall_timeout is not None else None
        if stall is not None and req is not None:
            restarted = self._restart_in_place(req, view, stall)
            if restarted is not None:
                return restarted
            if any(c.state == "running" for c in view.containers):
                self._stalls(req, view, stall)
            for c in view.containers:
                c.stalled = stall.stalled.get(c.id, "")
        st = app_status(view)
        attempts: dict[str, int] = {}
        for c in view.containers:
            attempts[c.role] = max(attempts.get(c.role, 0), c.attempt)
        clock = d.read(CLOCK) if req is not None and req.time_limit is not None else None
        limits = None if req is None or req.time_limit is None else Limits(
            req.time_limit, req.warn_before, warn=any(c.warn_signal for c in req.containers),
            started=float(clock) if clock else (req.created if req.created is not None else view.created),
            warned=d.exists(WARNED), reached=d.exists(TIME_LIMIT), requeue=req.requeue_on_time_limit,
            reached_msg=(d.read(TIME_LIMIT) or "").strip(),
        )
        decision: Decision
        if stall is not None and stall.failed:
            decision = Finish(AppState.FAILED, stall.failed, stop=True)
        else:
            # read only where decide uses them: a failure, or a requeue at the time limit
            used = st.state == AppState.FAILED or (limits is not None and limits.requeue)
            total, by_role = count_preemptions(roles for _, roles in self._preemptions(d)) if used else (0, {})
            decision = decide(st, shapes(view.roles), attempts, owned=req is not None, now=time.time(), limits=limits,
                              preemptions=total, role_preemptions=by_role,
                              max_preemptions=req.max_preemptions if req is not None else DEFAULT_MAX_PREEMPTIONS)
        return self.act(view, st, decision, req)

    def _restart_in_place(self, req: DockerRequest, view: AppView, stall: StallState) -> DescribeAppResponse | None:
        """Recreate each replica of a REPLICA role stopped for a stall (``stall.in_place``) whose container has
        ended, as its next attempt with ``TSM_LAST_EXIT=stalled``: the restarts it spent (stall restarts
        and Docker's own of the containers replaced) are recorded first and taken off the new container's
        restart policy, so ``max_retries`` bounds them together. None when there was none to recreate."""
        d = self.app_dir(req.app_id)
        done: builtins.list[str] = []
        for c in view.containers:
            if c.id not in stall.in_place or not c.final:
                continue
            why = stall.in_place.pop(c.id)
            stall.marks.pop(c.id, None)
            key = f"{c.role}/{c.replica_id}"
            spent = stall.restarts.get(key, 0) + c.restarts + 1
            stall.restarts[key] = spent
            stall.save(d)  # before the new container exists: a crash cannot lose the count
            for spec in req.containers:
                if (spec.role, spec.replica_id) == (c.role, c.replica_id):
                    spec.restart_max = max(0, spec.restart_max - spent)
            self._retry(req, [c], c.attempt + 1, attempt_env(c.attempt + 1, spent, "stalled"))
            done.append(f"role '{c.role}' replica {c.replica_id} {why}")
        if not done:
            return None
        restarts = sum(c.restarts for c in view.containers) + view.attempt + 1
        return DescribeAppResponse(app_id=view.app_id, state=AppState.RUNNING, created=view.created,
                                   num_restarts=restarts, msg=f"restarting after {done[0]}")

    def _stalls(self, req: DockerRequest, view: AppView, stall: StallState) -> None:
        """One stall check (at most one per tick), and what each stall found does (see the module docstring
        of :mod:`tsm.schedulers.docker.stall`): the stalled replica is warned, then stopped (a REPLICA role's
        to be recreated in place while its restarts last), or the app fails (``on_stall=fail``). The caller
        holds the app's lock: the stall is recorded before anything is sent, and acted on once."""
        d = self.app_dir(req.app_id)
        if d.cancelling or req.stall_timeout is None or stall.failed:
            return
        found = check(self.client, stall, view.containers, req.stall_timeout, time.time())
        specs = {(c.role, c.replica_id): c for c in req.containers}
        stop: builtins.list[Observed] = []
        for c, why in found:
            if req.on_stall == "fail":
                stall.stalled[c.id] = why
                stall.failed = f"role '{c.role}' replica {c.replica_id} {why}"
                break
            spec = specs.get((c.role, c.replica_id))
            # Docker's restarts of this container and the stall restarts before it share max_retries (the
            # list does not give a running container's RestartCount: one inspect, for a stall found)
            if spec is not None and spec.restart_max > 0 and stall.restarts.get(
                    f"{c.role}/{c.replica_id}", 0) + self.client.restart_count(c.id) < spec.restart_max:
                stall.in_place[c.id] = why
            else:
                stall.stalled[c.id] = why
            stop.append(c)
        stall.save(d)
        if stop:
            self._stop_warned(req, stop)

    def _stop_warned(self, req: DockerRequest, containers: builtins.list[Observed],
                     warned_at: float | None = None) -> None:
        """Stop the running ``containers`` without waiting (:meth:`_stop_later`): with ``warn_signal`` each is
        warned now (``warned_at``: it was at that time) and stopped once ``warn_before`` from the warning has
        passed, sooner when it has ended."""
        sig = next((c.warn_signal for c in req.containers if c.warn_signal), "")
        live = [c for c in containers if c.state in ("running", "restarting", "created")]
        after = 0.0
        if sig:
            if warned_at is None:
                for c in live:
                    with contextlib.suppress(SchedulerError):
                        self.client.signal(c.id, sig)
                warned_at = time.time()
            after = max(0.0, req.warn_before - (time.time() - warned_at))
        self._stop_later(req, [c.id for c in live], after)

    def _stop_later(self, req: DockerRequest, ids: builtins.list[str], after: float) -> None:
        """Stop the containers ``ids`` (SIGTERM, SIGKILL after the grace period) once each has ended or
        ``after`` seconds have passed, without this process waiting: a detached helper process does it
        (``python -m tsm.schedulers.docker stop``, its errors in the app's ``stop.log``), so the stop
        happens even when this process exits first; in process (threads) for a client given by the caller."""
        if not ids:
            return
        grace = max((c.stop_grace for c in req.containers), default=10.0)
        if self._in_process:
            client = self.client

            def one(cid: str) -> None:
                with contextlib.suppress(SchedulerError):
                    if after <= 0 or not client.wait_ended(cid, after):
                        client.stop(cid, grace)

            for cid in ids:
                # not a daemon: a process that exits still waits for the stop (no survivor left unwatched)
                threading.Thread(target=one, args=(cid,), daemon=False, name="tsm-docker-stop").start()
            return
        from tsm.util import daemon

        argv = daemon.command(STOP_HELPER, "stop", "--after", f"{after:.3f}", "--grace", f"{grace:g}", *ids)
        daemon.spawn(argv, log=self.app_dir(req.app_id).private_dir() / STOP_LOG)

    def _warn(self, req: DockerRequest, containers: builtins.list[Observed]) -> int:
        """Send the warning signal to every running container of ``containers`` once (the ``warned`` marker
        is created first with ``O_EXCL``, so of several looks or processes exactly one sends it); how many
        were signalled."""
        sig = next((c.warn_signal for c in req.containers if c.warn_signal), "")
        d = self.app_dir(req.app_id)
        if not sig or not claim(d, WARNED, f"{time.time():.3f}\n"):
            return 0
        n = 0
        for c in containers:
            if c.state == "running":
                self.client.signal(c.id, sig)
                n += 1
        return n

    def _warned_at(self, req: DockerRequest) -> float | None:
        """When the app's warning was sent (the ``warned`` marker's time), None when it was not."""
        try:
            return float((self.app_dir(req.app_id).read(WARNED) or "").strip())
        except ValueError:
            return None

    def act(self, view: AppView, st: AppStatusView, decision: Decision, req: DockerRequest | None) -> DescribeAppResponse:
        """Do what :func:`~tsm.schedulers.common.controller.decide` said, on an app this home submitted:
        a :class:`Retry` replaces the failed scope's containers; a final failure stops the containers still
        running (:meth:`_stop_later`: a status look stays quick, and the stop happens if the process exits);
        an end with ``remove_finished`` removes them. Returns the status to report."""
        if isinstance(decision, Warn) and req is not None:
            self._warn(req, view.containers)
        if isinstance(decision, Finish) and decision.time_limit and req is not None and \
                claim(self.app_dir(view.app_id), TIME_LIMIT, decision.msg + "\n"):
            self._warn(req, view.containers)  # not warned yet (no look in the warning window): warn now
        if isinstance(decision, Retry) and req is not None:
            scope = [c for c in view.containers if c.role in decision.roles]
            failed = next((c for c in view.containers if view.containers and st.first_failure is not None
                           and (c.role, c.replica_id) == st.first_failure), None)
            code = failed.exit_code if failed is not None else None
            last = decision.last_exit or ("stalled" if failed is not None and failed.stalled else
                                          "failed:" + (str(code) if code is not None else "unknown"))
            d = self.app_dir(view.app_id)
            if decision.preemption:  # counted before the new try exists, so a crash cannot lose it
                self._record_preemption(d, decision.attempt, decision.roles)
            if decision.time_limit:  # a requeue at the limit: the limit counts again from now, warned again
                d.write(CLOCK, f"{time.time():.3f}\n")
                unlink(d.path / WARNED)
            self._retry(req, scope, decision.attempt, attempt_env(decision.attempt, st.num_restarts + 1, last))
            return DescribeAppResponse(app_id=view.app_id, state=AppState.RUNNING, created=view.created,
                                       num_restarts=st.num_restarts + 1, msg=f"retrying after {decision.why}")
        stall_failed = isinstance(decision, Finish) and req is not None and req.stall_timeout is not None and \
            StallState.load(self.app_dir(view.app_id)).failed == decision.msg
        if stall_failed and req is not None:
            # every replica is warned and stopped warn_before later, as on a cancel (once: the marker)
            if claim(self.app_dir(view.app_id), STALL_STOPPED, f"{time.time():.3f}\n"):
                self._warn(req, view.containers)  # now, or already (a time limit's warning): never twice
                self._stop_warned(req, view.containers, warned_at=self._warned_at(req) or time.time())
        elif isinstance(decision, Finish) and decision.stop and req is not None:
            self._stop_later(req, [c.id for c in view.containers if c.state in ("running", "restarting", "created")], 0)
        desc = self._describe_view(view, st)
        if isinstance(decision, Finish) and (stall_failed or decision.msg != desc.msg) and \
                decision.state == AppState.FAILED and not decision.time_limit:
            # the decision's own words: a stall, a spent preemption budget ("... (no preemptions left: ...)")
            desc.state, desc.msg = AppState.FAILED, decision.msg
            desc.structured_error_msg = failure_of(desc.state, desc.msg, desc.roles_statuses)
        if isinstance(decision, Finish) and decision.time_limit:
            desc.state, desc.msg = AppState.FAILED, decision.msg
            for rs in desc.roles_statuses:
                for r in rs.replicas:
                    if r.state != AppState.SUCCEEDED:
                        r.state, r.error_msg = AppState.FAILED, decision.msg
            desc.structured_error_msg = failure_of(desc.state, desc.msg, desc.roles_statuses)
        if isinstance(decision, Finish) and req is not None and req.remove_finished:
            self._finish(view.app_id, desc)
        return desc

    def _retry(self, req: DockerRequest, scope: builtins.list[Observed], attempt: int,
               env: dict[str, str] | None = None) -> None:
        """Replace the containers of ``scope`` by new ones (their logs are snapshotted first), with ``env``
        (the attempt's ``TSM_ATTEMPT``, ``TSM_RESTART_COUNT``, ``TSM_LAST_EXIT``) laid over their own. The
        app's :data:`GENERATION` changes before and after: a look of another process that listed the old
        containers, or listed them half replaced, lists them again (the caller holds the app's lock)."""
        d = self.app_dir(req.app_id)
        keys = {(c.role, c.replica_id) for c in scope}
        d.count_up(GENERATION)
        try:
            for c in scope:
                self.client.kill(c.id)
            for c in scope:
                self._snapshot_logs(req.app_id, c)
                self.client.remove_container(c.id)
            specs = [spec for spec in req.containers if (spec.role, spec.replica_id) in keys]
            for spec in specs:
                spec.labels[LABEL_ATTEMPT] = str(attempt)
                spec.env.update(env or {})
            with contextlib.suppress(SchedulerError):  # another process retried them first (the names are taken)
                self._create(req, specs)
        finally:  # a look that listed them half replaced (one killed, not yet removed) lists them again
            d.count_up(GENERATION)

    def wait(
        self, app_id: str, timeout: float | None = None, poll_interval: float | None = None
    ) -> DescribeAppResponse | None:
        """Poll :meth:`describe` (never Docker's blocking wait: ROLE/APPLICATION retries happen on a look),
        backing off to every 0.5 s: a look is one list call shared by every app of the process."""

        return poll_until_terminal(lambda _pause: self.describe(app_id), timeout, initial=0.05,
                                   cap=min(0.5, poll_interval or 0.5))

    def _cancel(self, app_id: str, current: DescribeAppResponse) -> None:
        """Stop every container (SIGTERM, SIGKILL after the grace period), keep their logs, remove them and
        the network. With ``warn_signal``, every running container first gets the warning, and the cancel
        waits ``warn_before`` (less as soon as every warned container has ended) before the stop."""
        d = self.app_dir(app_id)
        with d.cancel_marker():
            containers = self.client.list_containers(app_id)
            req = self.request(app_id)
            grace = max((c.stop_grace for c in req.containers), default=10.0) if req else 10.0
            if req is not None and self._warn(req, containers):
                poll_until(lambda: True if not any(c.state == "running" for c in self.client.list_containers(app_id))
                           else None, req.warn_before, initial=0.05, cap=0.5)
            threads = [threading.Thread(target=self.client.stop, args=(c.id, grace)) for c in containers]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            ended = self.client.list_containers(app_id)
            desc = mark_cancelled(self._describe_view(AppView(app_id, req.roles if req else [], current.created, ended)))
            self._finish(app_id, desc, network=req.network if req else f"tsm-{app_id}")

    def _finish(self, app_id: str, desc: DescribeAppResponse, network: str | None = None) -> None:
        """Snapshot every container's logs, write the final status (with the app's start and end), then
        remove containers and network."""
        containers = self.client.list_containers(app_id)
        for c in containers:
            self._snapshot_logs(app_id, c)
        started, ended = app_times(containers)
        self.app_dir(app_id).save_final(desc, started, ended)
        self._teardown(app_id, network or f"tsm-{app_id}", containers=containers)

    def _teardown(self, app_id: str, network: str, containers: builtins.list[Observed] | None = None) -> None:
        for c in containers if containers is not None else self.client.list_containers(app_id):
            self.client.remove_container(c.id)
        docker_secrets.drop(self.client, app_id, self.request(app_id))
        self._remove_network(network)

    def _remove_network(self, network: str) -> None:
        """Remove a network, polling while dockerd releases the endpoints of just-removed containers."""
        if not poll_until(lambda: True if self.client.remove_network(network) else None, NETWORK_RELEASE,
                          initial=0.05, cap=0.5):
            raise SchedulerError(f"remove network {network} failed: dockerd still holds endpoints on it")

    @contextlib.contextmanager
    def _removing(self, app_id: str) -> Iterator[bool]:
        containers = self.client.list_containers(app_id)
        self._teardown(app_id, f"tsm-{app_id}", containers)
        yield bool(containers)

    def cleanup(self, include_running: bool = False, session: str | None = None,
                dry_run: bool = False) -> builtins.list[str]:
        """Remove the containers and networks of this owner's ended tsm apps (logs of the apps this home
        submitted are snapshotted first), and networks no container uses any more (left by a launcher that
        crashed); ``include_running`` also cancels the apps still running; ``session`` limits it to the
        apps of one session; ``dry_run`` only says which. Returns the app ids cleaned (or to clean)."""
        done = []
        for app_id, view in group(self.client.list_containers()).items():
            if session is not None and view.containers[0].labels.get(LABEL_SESSION) != session:
                continue
            desc = self._describe_view(view)
            if not desc.state.is_terminal and not include_running:
                continue
            done.append(app_id)
            if dry_run:
                continue
            if not desc.state.is_terminal:
                self.cancel(app_id)
            elif self.request(app_id) is not None:
                self._finish(app_id, desc)
            else:  # another home's app of this owner: nothing of it is kept here
                self._teardown(app_id, f"tsm-{app_id}", view.containers)
        in_use = set(group(self.client.list_containers()))
        if not dry_run:
            docker_secrets.drop_orphans(self.client, in_use, session)
        self.cleanup_errors = []
        for net in self.client.networks():
            labels = net.get("Labels") or {}
            created = parse_time(str(net.get("Created", "")))
            young = created is not None and time.time() - created < ORPHAN_AGE  # its launcher may be creating containers
            mine = session is None or labels.get(LABEL_SESSION) in (None, session)
            if labels.get(LABEL_APP) not in in_use and mine and not young and not dry_run:
                try:
                    self._remove_network(str(net.get("Name")))
                except SchedulerError as e:  # one stuck network (a dockerd that lost track) does not stop the rest
                    self.cleanup_errors.append(str(e))
        self._watcher.invalidate()
        return done

    def close(self) -> None:
        super().close()
        if self._client is not None:
            self._client.close()
