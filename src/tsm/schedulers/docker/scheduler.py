"""DockerScheduler: the interface, gluing the pure request/status modules to the Docker client.

Local store: ``$TSM_HOME/docker/<app_id>/`` holds ``request.json`` (the containers, to recreate them for
ROLE/APPLICATION retries), ``app.json`` (the :class:`AppRecord`), ``logs/`` (snapshots of every container's
output taken before it is removed) and ``final.json`` (the app's last status, written when its containers
are removed: by ``cancel``, ``remove``, ``cleanup`` or ``remove_finished``).
"""

from __future__ import annotations

import builtins
import contextlib
import os
import shutil
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from pathlib import Path

from tsm.errors import SchedulerError, SubmissionError
from tsm.schedulers.api import DescribeAppResponse, ListAppResponse, Scheduler, Stream
from tsm.schedulers.common.logs import (
    check_log_target,
    decode,
    filter_regex,
    in_window,
    replica_counts,
    split_lines,
    split_lines_iterator,
    stream_names,
    utf8_chunks,
)
from tsm.schedulers.common.record import AppRecord, ended_status, load_final, save_final, with_record
from tsm.schedulers.common.watcher import StatusWatcher
from tsm.schedulers.docker.client import DockerClient
from tsm.schedulers.docker.request import (
    LABEL_APP,
    LABEL_ATTEMPT,
    LABEL_SCHEDULER,
    LABEL_SESSION,
    DockerOptions,
    DockerRequest,
    build_request,
    format_request,
    validate,
)
from tsm.schedulers.docker.status import AppView, Observed, app_status, group
from tsm.specs.api import AppDef, AppDryRunInfo, AppState, Role
from tsm.specs.runopts import CfgVal, runopts
from tsm.store import tsm_home
from tsm.workspace.api import WorkspaceBuilder
from tsm.workspace.image import ImagePlan, build_image, plan_image, pull_policy

TYPE_CHECKING = False
if TYPE_CHECKING:
    from tsm.schedulers.docker.view import DockerView
    from tsm.views.snapshot import AppView as ViewOfApp

STREAMS = ("stdout", "stderr")
#: seconds after which a tsm network without containers counts as left behind (cleanup removes it)
ORPHAN_AGE = 60.0
#: seconds a status snapshot (one containers.list for every app) is reused by describe
MAX_AGE = 0.2


def has_gpus() -> bool:
    """True when this host has NVIDIA GPUs Docker can hand out."""
    return os.path.exists("/dev/nvidiactl")


def store_root() -> Path:
    return tsm_home() / "docker"


class DockerScheduler(Scheduler[DockerRequest], WorkspaceBuilder[None]):
    """Runs each replica as a container on a network of its app (see :mod:`tsm.schedulers.docker`)."""

    requires_resource = False  # a role without a size runs without limits, as ``docker run`` does

    def __init__(self, session_name: str, client: DockerClient | None = None) -> None:
        super().__init__("docker", session_name)
        self._client = client
        self._watcher = self._new_watcher()
        self._lock = threading.Lock()
        #: networks the last :meth:`cleanup` could not remove, with Docker's reason
        self.cleanup_errors: builtins.list[str] = []
        self._view: DockerView | None = None

    def _new_watcher(self) -> StatusWatcher[DescribeAppResponse]:
        return StatusWatcher(self._snapshot, self._lookup, is_terminal=lambda d: d.state.is_terminal)

    @property
    def client(self) -> DockerClient:
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
        req = build_request(app, opts, self.session_name, str(store_root()), time.time())
        req.builds = [plan for plan in map(ImagePlan.from_metadata, app.roles) if plan is not None]
        built = {b.tag for b in req.builds}
        req.images = [i for i in req.images if i not in built]
        return AppDryRunInfo(request=req, fmt=format_request)

    def schedule(self, dryrun_info: AppDryRunInfo[DockerRequest]) -> str:
        req = dryrun_info.request
        app_dir = Path(req.app_dir)
        app_dir.mkdir(parents=True, exist_ok=True)
        (app_dir / "request.json").write_text(req.to_json())
        app = dryrun_info.app or AppDef.from_dict(req.spec)
        (app_dir / "app.json").write_text(AppRecord("docker", req.session, app, os.getcwd(), {}).to_json())
        self._watcher.submitted(req.app_id)
        for b in req.builds:
            self._build(b)
        for image in req.images:
            reason = self.client.ensure_image(image, req.pull)
            if reason:
                self._write_final(req, AppState.FAILED, reason)
                return req.app_id
        labels = {LABEL_SCHEDULER: "docker", LABEL_APP: req.app_id, LABEL_SESSION: req.session}
        self.client.create_network(req.network, labels)
        try:
            # one after the other: creating them concurrently measured no faster on a 2-core host (dockerd
            # is the bottleneck) and dockerd 20.10 is known to leak network endpoints under such races
            for c in req.containers:
                self.client.run(c, req.network)
        except SchedulerError as e:
            self._teardown(req.app_id, req.network, grace=0)
            self._write_final(req, AppState.FAILED, f"could not start: {e}")
            raise SubmissionError(f"app {req.app_id} could not start: {e}") from e
        return req.app_id

    def _build(self, b: ImagePlan) -> None:
        """Build a workspace image unless its tag is already here (then nothing is built)."""
        build_image(b, self.client)

    # -- workspaces --------------------------------------------------------------------------------------
    def build_workspace_and_update_role(self, role: Role, workspace: str, cfg: Mapping[str, CfgVal]) -> None:
        """Snapshot ``workspace`` and point ``role`` at the image of it; the build itself runs at ``schedule``
        (:func:`tsm.workspace.image.plan_image`: content-hash tag on the role image's id, ``Dockerfile.tsm``
        when the workspace has one; nothing is built when Docker already has the tag)."""
        plan_image(role, workspace, self.client, pull_policy(cfg))

    def dryrun_push_images(self, app: AppDef, cfg: Mapping[str, CfgVal]) -> None:
        """Nothing to push: the image is built on this Docker engine, which runs it."""
        return None

    def push_images(self, images_to_push: None) -> None:
        """Nothing to push (see :meth:`dryrun_push_images`)."""

    # -- status -------------------------------------------------------------------------------------------
    def _app_dir(self, app_id: str) -> Path:
        return store_root() / app_id

    def _request(self, app_id: str) -> DockerRequest | None:
        try:
            return DockerRequest.from_json((self._app_dir(app_id) / "request.json").read_text())
        except (OSError, ValueError, TypeError, KeyError):
            return None

    def _snapshot(self) -> dict[str, DescribeAppResponse]:
        out: dict[str, DescribeAppResponse] = {}
        for app_id, view in group(self.client.list_containers()).items():
            if (self._app_dir(app_id) / "cancelling").exists():
                continue  # being cancelled: final.json answers once it is written
            out[app_id] = self._settle(view)
        return out

    def _lookup(self, ids: list[str]) -> dict[str, DescribeAppResponse]:
        out = {}
        for app_id in ids:
            d = self._final(app_id)
            if d is not None:
                out[app_id] = d
            elif (self._app_dir(app_id) / "cancelling").exists():
                out[app_id] = DescribeAppResponse(app_id=app_id, state=AppState.RUNNING, msg="being cancelled")
        return out

    def _final(self, app_id: str) -> DescribeAppResponse | None:
        return load_final(self._app_dir(app_id))

    def _describe_view(self, view: AppView) -> DescribeAppResponse:
        st = app_status(view)
        return DescribeAppResponse(
            app_id=view.app_id, state=st.state, msg=st.msg, num_restarts=st.num_restarts, created=view.created,
            roles_statuses=st.roles,
        )

    def _settle(self, view: AppView) -> DescribeAppResponse:
        """The app's status; a failure with ROLE/APPLICATION retries left is retried here, and a final
        failure stops the replicas still running."""
        st = app_status(view)
        if st.state == AppState.FAILED and st.first_failure is not None:
            role_name = st.first_failure[0]
            shape = {r[0]: r for r in view.roles}
            _, _, max_retries, policy = shape.get(role_name, [role_name, 1, 0, "APPLICATION"])
            scope = [c for c in view.containers if policy == "APPLICATION" or c.role == role_name]
            attempt = max((c.attempt for c in scope), default=0)
            req = self._request(view.app_id)
            if policy in ("APPLICATION", "ROLE") and attempt < int(max_retries) and req is not None:
                self._retry(req, scope, attempt + 1)
                return DescribeAppResponse(app_id=view.app_id, state=AppState.RUNNING, created=view.created,
                                           num_restarts=st.num_restarts + 1, msg=f"retrying after {st.msg}")
            req = self._request(view.app_id)
            grace = max((c.stop_grace for c in req.containers), default=10.0) if req else 10.0
            for c in view.containers:  # the app failed: stop the others (in the background: describe stays quick)
                if c.state in ("running", "restarting", "created"):
                    threading.Thread(target=self.client.stop, args=(c.id, grace), daemon=True).start()
        desc = self._describe_view(view)
        req = self._request(view.app_id) if desc.state.is_terminal else None
        if req is not None and req.remove_finished:
            self._finish(view.app_id, desc)
        return desc

    def _retry(self, req: DockerRequest, scope: builtins.list[Observed], attempt: int) -> None:
        """Replace the containers of ``scope`` by new ones (their logs are snapshotted first)."""
        keys = {(c.role, c.replica_id) for c in scope}
        for c in scope:
            self.client.kill(c.id)
        for c in scope:
            self._snapshot_logs(req.app_id, c)
            self.client.remove_container(c.id)
        for spec in req.containers:
            if (spec.role, spec.replica_id) in keys:
                spec.labels[LABEL_ATTEMPT] = str(attempt)
                with contextlib.suppress(SchedulerError):  # another process retried it first (name taken)
                    self.client.run(spec, req.network)

    def describe(self, app_id: str) -> DescribeAppResponse | None:
        return with_record(self._watcher.get(app_id, max_age=MAX_AGE), self._app_dir(app_id) / "app.json")

    def view_snapshot(self, app_ids: Sequence[str]) -> builtins.list[ViewOfApp]:
        """The views' batch hook (:class:`tsm.views.snapshot.BatchSnapshot`): every app of ``app_ids`` from one
        label-filtered container list, usage from a background stats sampler; see
        :mod:`tsm.schedulers.docker.view`."""
        if self._view is None:
            from tsm.schedulers.docker.view import DockerView

            self._view = DockerView(self)
        return self._view.snapshot(app_ids)

    def wait(self, app_id: str, timeout: float | None = None) -> DescribeAppResponse | None:
        """Poll :meth:`describe` (never Docker's blocking wait: ROLE/APPLICATION retries happen on a look),
        backing off to every 0.5 s: a look is one list call shared by every app of the process."""
        from tsm.schedulers.common.polling import poll_until_terminal

        return poll_until_terminal(lambda _pause: self.describe(app_id), timeout, initial=0.05, cap=0.5)

    def list(self) -> list[ListAppResponse]:
        rows = {a: ListAppResponse(a, d.state, name=a.rsplit("-", 1)[0], created=d.created)
                for a, d in self._watcher.all().items()}
        root = store_root()
        if root.is_dir():
            for entry in os.scandir(root):
                if entry.name not in rows:
                    d = self._final(entry.name)
                    if d is None and (Path(entry.path) / "cancelling").exists():
                        d = DescribeAppResponse(app_id=entry.name, state=AppState.RUNNING)
                    if d is not None:
                        rows[entry.name] = ListAppResponse(entry.name, d.state, name=entry.name.rsplit("-", 1)[0],
                                                           created=d.created)
        return sorted(rows.values(), key=lambda r: -(r.created or 0))

    # -- cancel / remove ------------------------------------------------------------------------------
    def cancel(self, app_id: str) -> None:
        current = self.describe(app_id)
        if current is None or current.state.is_terminal:
            return
        app_dir = self._app_dir(app_id)
        app_dir.mkdir(parents=True, exist_ok=True)
        (app_dir / "cancelling").touch()
        try:
            containers = self.client.list_containers(app_id)
            req = self._request(app_id)
            grace = max((c.stop_grace for c in req.containers), default=10.0) if req else 10.0
            threads = [threading.Thread(target=self.client.stop, args=(c.id, grace)) for c in containers]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            ended = self.client.list_containers(app_id)
            shape = req.roles if req else []
            view = AppView(app_id, shape, current.created, ended)
            desc = self._describe_view(view)
            for rs in desc.roles_statuses:
                for r in rs.replicas:
                    if r.state != AppState.SUCCEEDED:
                        r.state, r.error_msg = AppState.CANCELLED, "cancelled"
            desc.state, desc.msg = AppState.CANCELLED, "cancelled"
            self._finish(app_id, desc, network=req.network if req else f"tsm-{app_id}")
        finally:
            with contextlib.suppress(OSError):
                (app_dir / "cancelling").unlink()
        self._watcher.invalidate()

    def _finish(self, app_id: str, desc: DescribeAppResponse, network: str | None = None) -> None:
        """Write the final status, snapshot every container's logs, then remove containers and network."""
        containers = self.client.list_containers(app_id)
        for c in containers:
            self._snapshot_logs(app_id, c)
        save_final(self._app_dir(app_id), desc)
        self._teardown(app_id, network or f"tsm-{app_id}", grace=0, containers=containers)

    def _teardown(self, app_id: str, network: str, grace: float, containers: builtins.list[Observed] | None = None) -> None:
        for c in containers if containers is not None else self.client.list_containers(app_id):
            if grace:
                self.client.stop(c.id, grace)
            self.client.remove_container(c.id)
        self.client.remove_network(network)

    def _write_final(self, req: DockerRequest, state: AppState, msg: str) -> None:
        save_final(Path(req.app_dir), ended_status(req.app_id, req.roles, state, msg))

    def remove(self, app_id: str) -> bool:
        """Remove the app's containers, network and everything kept of it in ``$TSM_HOME``."""
        found = False
        for c in self.client.list_containers(app_id):
            self.client.remove_container(c.id)
            found = True
        self.client.remove_network(f"tsm-{app_id}")
        app_dir = self._app_dir(app_id)
        if app_dir.exists():
            shutil.rmtree(app_dir, ignore_errors=True)
            found = True
        self._watcher = self._new_watcher()  # it keeps ended apps for good: forget the removed one
        return found

    def cleanup(self, include_running: bool = False, session: str | None = None) -> builtins.list[str]:
        """Remove the containers and networks of every ended tsm app (logs are snapshotted first), and
        networks no container uses any more (left by a launcher that crashed); ``include_running`` also
        cancels the apps still running; ``session`` limits it to the apps of one session. Returns the app
        ids cleaned."""
        done = []
        for app_id, view in group(self.client.list_containers()).items():
            if session is not None and view.containers[0].labels.get(LABEL_SESSION) != session:
                continue
            desc = self._describe_view(view)
            if desc.state.is_terminal:
                self._finish(app_id, desc)
                done.append(app_id)
            elif include_running:
                self.cancel(app_id)
                done.append(app_id)
        in_use = set(group(self.client.list_containers()))
        self.cleanup_errors = []
        for net in self.client.networks():
            labels = net.attrs.get("Labels") or {}
            created, _ = _parse_ts(str(net.attrs.get("Created", "")).encode() + b" ")
            young = created is not None and time.time() - created < ORPHAN_AGE  # its launcher may be creating containers
            mine = session is None or labels.get(LABEL_SESSION) in (None, session)
            if labels.get(LABEL_APP) not in in_use and mine and not young:
                try:
                    self.client.remove_network(net.name)
                except SchedulerError as e:  # one stuck network (a dockerd that lost track) does not stop the rest
                    self.cleanup_errors.append(str(e))
        self._watcher.invalidate()
        return done

    # -- logs ---------------------------------------------------------------------------------------------
    def _log_dir(self, app_id: str, container_name: str) -> Path:
        return self._app_dir(app_id) / "logs" / container_name

    def _snapshot_logs(self, app_id: str, c: Observed) -> None:
        """Copy a container's output into the store (``attempt-N/{stdout,stderr,combined,*.ts}``)."""
        d = self._log_dir(app_id, c.name) / f"attempt-{c.attempt}"
        if (d / "done").exists():
            return
        d.mkdir(parents=True, exist_ok=True)
        try:
            (d / "stdout").write_bytes(self.client.logs(c.id, True, False))
            (d / "stderr").write_bytes(self.client.logs(c.id, False, True))
            (d / "combined").write_bytes(self.client.logs(c.id, True, True))
            (d / "stdout.ts").write_bytes(self.client.logs(c.id, True, False, timestamps=True))
            (d / "stderr.ts").write_bytes(self.client.logs(c.id, False, True, timestamps=True))
        except self.client.NotFound:
            return
        (d / "done").touch()

    def log_iter(
        self,
        app_id: str,
        role_name: str,
        k: int = 0,
        regex: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        should_tail: bool = False,
        streams: Stream | None = None,
    ) -> Iterator[str]:
        req = self._request(app_id)
        roles = replica_counts(req.roles if req else None, lambda: self.describe(app_id))
        check_log_target("docker", app_id, roles, role_name, k)
        names = stream_names(streams)
        return filter_regex(regex, self._lines(app_id, role_name, k, names, since, until, should_tail))

    def _lines(self, app_id: str, role: str, k: int, names: builtins.list[str], since: datetime | None,
               until: datetime | None, tail: bool) -> Iterator[str]:
        from tsm.schedulers.docker.request import dns_name

        cname = f"{app_id}-{dns_name(role, k)}"
        live = next((c for c in self.client.list_containers(app_id) if c.name == cname), None)
        logs = self._log_dir(app_id, cname)
        snaps = sorted(logs.glob("attempt-*"), key=lambda p: int(p.name.split("-")[1])) if logs.is_dir() else []
        for snap in snaps:
            if live is not None and snap.name == f"attempt-{live.attempt}":
                continue  # the container is still there: read it from Docker
            yield from _snapshot_lines(snap, names, since, until)
        if live is None:
            return
        out, err = "stdout" in names, "stderr" in names
        s = since.timestamp() if since else None
        if tail and until is None:
            chunks = (decode(b) for b in utf8_chunks(self._follow_restarts(app_id, live, out, err, s)))
            yield from split_lines_iterator(chunks)
            return
        u = until.timestamp() if until else None
        yield from split_lines(decode(self.client.logs(live.id, out, err, since=s, until=u)))

    def _follow_restarts(self, app_id: str, live: Observed, out: bool, err: bool, since: float | None) -> Iterator[bytes]:
        """Docker's follow of one container, continued across the restarts Docker makes (REPLICA retries).

        A follow ends when the container stops; if Docker will start it again, it is followed again and
        the bytes already given are skipped (the container keeps one log across its restarts).
        """
        consumed = 0
        while True:
            skip = consumed
            for chunk in self.client.follow(live.id, out, err, since=since):
                if skip >= len(chunk):
                    skip -= len(chunk)
                    continue
                chunk, skip = chunk[skip:], 0
                consumed += len(chunk)
                yield chunk
            now = next((c for c in self.client.list_containers(app_id) if c.id == live.id), None)
            if now is None or now.final:
                return
            time.sleep(0.2)

    def close(self) -> None:
        if self._view is not None:
            self._view.close()
            self._view = None
        if self._client is not None:
            self._client.close()


def _parse_ts(line: bytes) -> tuple[float | None, bytes]:
    head, _, rest = line.partition(b" ")
    try:
        text = head.decode()
        base, _, frac = text.rstrip("Z").partition(".")
        when = datetime.fromisoformat(base + "+00:00").timestamp() + (float("0." + frac[:6]) if frac else 0.0)
    except (ValueError, UnicodeDecodeError):
        return None, line
    return when, rest


def _snapshot_lines(snap: Path, names: list[str], since: datetime | None, until: datetime | None) -> Iterator[str]:
    if since is None and until is None:
        name = names[0] if len(names) == 1 else "combined"
        with contextlib.suppress(OSError):
            yield from split_lines(decode((snap / name).read_bytes()))
        return
    stamped: list[tuple[float, int, str]] = []
    for i, name in enumerate(names):
        try:
            raw = (snap / f"{name}.ts").read_bytes()
        except OSError:
            continue
        for n, line in enumerate(raw.split(b"\n")):
            if not line:
                continue
            when, body = _parse_ts(line)
            if in_window(when, since, until):
                stamped.append((when or 0.0, i * 10**9 + n, decode(body) + "\n"))
    for _, _, text in sorted(stamped):
        yield text
