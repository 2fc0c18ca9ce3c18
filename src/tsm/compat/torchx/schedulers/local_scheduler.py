"""TorchX's ``schedulers.local_scheduler`` at TorchX's path: the in-process local scheduler tools subclass.

tsm's own ``local`` scheduler (:mod:`tsm.schedulers.local`) hands each app to a detached supervisor, so
any process can watch or cancel it. Tools built on TorchX (NeMo-Run's local executor) instead subclass
TorchX's ``LocalScheduler`` and reach into its in-process shape: they call :meth:`LocalScheduler._to_popen_request`,
keep ``self._apps`` of :class:`_LocalAppDef` (``kill()``, ``role_replicas``, ``state``, ``log_dir``,
``set_state``), read ``<log_dir>/<role>/<k>/{stdout,stderr,combined}.log`` through :class:`LogIterator`, and
may skip ``__init__`` altogether, setting ``_apps``, ``_image_provider_class``, ``_cache_size``,
``_extra_paths``, ``_base_log_dir`` and ``_created_tmp_log_dir`` themselves. This module gives that shape
on tsm's :class:`~tsm.schedulers.api.Scheduler` interface, with tsm's rules where TorchX's differ:

* each replica starts in its own session (process group), and :meth:`_LocalAppDef.kill` ends the whole
  group, SIGTERM then SIGKILL after a grace period, so nothing a replica started outlives it;
* a scheduler made here answers both interfaces: TorchX's (``_run_opts``, ``_cancel_existing``, the base
  ``_validate`` that refuses a role without a resource) and tsm's (``run_opts``, ``cancel``,
  ``roles_statuses`` in describe).

Apps live as long as the scheduler object: ``close()`` (and garbage collection) ends them, as in TorchX.
Use ``tsm.schedulers.local`` for apps that must outlive the launching process.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, TypedDict

from tsm.compat.torchx.schedulers._local_apps import (
    KILL_GRACE,
    CWDImageProvider,
    ImageProvider,
    LocalDirectoryImageProvider,
    LogIterator,
    PopenRequest,
    ReplicaParam,
    _close_after,
    _join_path,
    _LocalAppDef,
    _LocalReplica,
    _pump,
)
from tsm.schedulers.api import DescribeAppResponse, ListAppResponse, Scheduler, Stream
from tsm.schedulers.common.logs import filter_regex, split_lines_iterator
from tsm.schedulers.ids import make_unique
from tsm.specs.api import (
    AppDef,
    AppDryRunInfo,
    AppState,
    ReplicaStatus,
    RoleStatus,
    is_terminal,
    macros,
)
from tsm.specs.runopts import CfgVal, runopts

if TYPE_CHECKING:
    from datetime import datetime

__all__ = [
    "COMBINED_LOG",
    "KILL_GRACE",
    "RANK0_ENV",
    "STDERR_LOG",
    "STDOUT_LOG",
    "AppId",
    "CWDImageProvider",
    "ImageProvider",
    "LocalDirectoryImageProvider",
    "LocalOpts",
    "LocalScheduler",
    "LogIterator",
    "PopenRequest",
    "ReplicaParam",
    "_LocalAppDef",
    "_LocalReplica",
    "create_scheduler",
]

#: The log files of a replica, under ``<log_dir>/<session>/<app_id>/<role>/<replica>/`` (TorchX's names).
STDOUT_LOG = "stdout.log"
STDERR_LOG = "stderr.log"
COMBINED_LOG = "combined.log"

#: The env var naming the host of a role's first replica (``localhost`` here), as TorchX sets it.
RANK0_ENV = "TORCHX_RANK0_HOST"


AppId = str
AppName = str
RoleName = str


class LocalOpts(TypedDict, total=False):
    """The run options of the local scheduler, as a typed dict (TorchX's ``LocalOpts``)."""

    log_dir: str
    prepend_cwd: bool | None
    auto_set_cuda_visible_devices: bool | None


class LocalScheduler(Scheduler[PopenRequest]):
    """Runs each replica as a child process of this Python process, logs in files (TorchX's ``LocalScheduler``).

    Capabilities: none beyond the base interface. ``image_provider_class`` decides what an image is
    (:class:`CWDImageProvider`: the working directory; :class:`LocalDirectoryImageProvider`: a directory).
    At most ``cache_size`` apps are kept; the oldest ended one is forgotten to make room.
    """

    def __init__(
        self,
        session_name: str,
        image_provider_class: Callable[[Mapping[str, Any]], ImageProvider],
        cache_size: int = 100,
        extra_paths: list[str] | None = None,
    ) -> None:
        super().__init__("local", session_name)
        if cache_size <= 0:
            raise ValueError("cache size must be greater than zero")
        self._apps: dict[AppId, _LocalAppDef] = {}
        self._image_provider_class = image_provider_class
        self._cache_size = cache_size
        self._extra_paths: list[str] = list(extra_paths or [])
        self._base_log_dir: str | None = None
        self._created_tmp_log_dir = False
        #: every temporary log dir this scheduler made (only these are removed by close(); TorchX removed the
        #: last app's ``log_dir``, a user's own folder when the last app was given one)
        self._tmp_log_dirs: list[str] = []

    # -- options (both spellings) -----------------------------------------------------------------------
    def _run_opts(self) -> runopts:
        opts = runopts()
        opts.add("log_dir", str, "directory for the replicas' stdout/stderr log files (default: a temporary one)")
        opts.add("prepend_cwd", bool, "put the working directory first on the replicas' PATH", default=False)
        opts.add("auto_set_cuda_visible_devices", bool,
                 "give each replica of a role that asks for GPUs its own CUDA_VISIBLE_DEVICES", default=False)
        return opts

    def run_opts(self) -> runopts:
        """The run options: ``log_dir``, ``prepend_cwd``, ``auto_set_cuda_visible_devices``."""
        return self._run_opts()

    # -- requests ------------------------------------------------------------------------------------------
    def _get_app_log_dir(self, app_id: str, cfg: Mapping[str, Any]) -> str:
        base = cfg.get("log_dir") or None
        if not base:
            base = tempfile.mkdtemp(prefix="tsm_local_")
            self._created_tmp_log_dir = True
            if not hasattr(self, "_tmp_log_dirs"):  # a subclass that skipped __init__ (NeMo-Run's shape)
                self._tmp_log_dirs = []
            self._tmp_log_dirs.append(base)
        self._base_log_dir = str(base)
        return os.path.join(str(base), self.session_name, app_id)

    def _to_popen_request(self, app: AppDef, cfg: Mapping[str, Any]) -> PopenRequest:
        """The request for ``app``: a new app id, each replica's argv/env/cwd with macros applied, its log files."""
        app_id = make_unique(app.name)
        provider = self._image_provider_class(cfg)
        app_log_dir = self._get_app_log_dir(app_id, cfg)
        request = PopenRequest(app_id, app_log_dir)
        for role in app.roles:
            params = request.role_params.setdefault(role.name, [])
            log_dirs = request.role_log_dirs.setdefault(role.name, [])
            img_root = provider.fetch_role(role)
            role.env["PATH"] = _join_path(*self._extra_paths, role.env.get("PATH"))
            cwd = provider.get_cwd(role.image)
            if cwd:
                first = bool(cfg.get("prepend_cwd"))
                role.env["PATH"] = _join_path(cwd, role.env.get("PATH")) if first else _join_path(role.env.get("PATH"), cwd)
            for replica_id in range(role.num_replicas):
                values = macros.Values(img_root=img_root, app_id=app_id, replica_id=str(replica_id), rank0_env=RANK0_ENV)
                replica_role = values.apply(role)
                replica_role.env[RANK0_ENV] = "localhost"
                log_dir = os.path.join(app_log_dir, role.name, str(replica_id))
                replica_role.env.setdefault("TORCHELASTIC_ERROR_FILE", os.path.join(log_dir, "error.json"))
                replica_role.env.setdefault("PET_LOG_DIR", os.path.join(app_log_dir, "torchelastic", role.name))
                params.append(provider.get_replica_param(
                    img_root, replica_role, os.path.join(log_dir, STDOUT_LOG), os.path.join(log_dir, STDERR_LOG),
                    os.path.join(log_dir, COMBINED_LOG),
                ))
                log_dirs.append(log_dir)
        self.auto_set_CUDA_VISIBLE_DEVICES(request.role_params, app, cfg)
        return request

    def auto_set_CUDA_VISIBLE_DEVICES(  # noqa: N802 (TorchX's name)
        self, role_params: dict[str, list[ReplicaParam]], app: AppDef, cfg: Mapping[str, Any]
    ) -> None:
        """With ``auto_set_cuda_visible_devices``, give each GPU replica its own devices, if there are enough."""
        if not cfg.get("auto_set_cuda_visible_devices"):
            return
        wanted = sum(max(r.resource.gpu, 0) * r.num_replicas for r in app.roles)
        count = self._cuda_device_count()
        if wanted == 0 or wanted > count:
            return
        next_device = 0
        for role in app.roles:
            gpus = max(role.resource.gpu, 0)
            if gpus == 0:
                continue
            for param in role_params[role.name]:
                param.env["CUDA_VISIBLE_DEVICES"] = ",".join(str(next_device + i) for i in range(gpus))
                next_device += gpus

    def _cuda_device_count(self) -> int:
        """How many NVIDIA GPUs this host has (0 when ``nvidia-smi`` is missing or fails)."""
        try:
            out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10, check=True).stdout
        except (OSError, subprocess.SubprocessError):
            return 0
        return sum(1 for line in out.splitlines() if line.startswith("GPU "))

    def _submit_dryrun(self, app: AppDef, cfg: Mapping[str, CfgVal]) -> AppDryRunInfo[PopenRequest]:
        import pprint

        request = self._to_popen_request(app, cfg)
        return AppDryRunInfo(request, lambda r: pprint.pformat(asdict(r), indent=2, width=80))

    # -- running ---------------------------------------------------------------------------------------------
    def _evict_lru(self) -> bool:
        ended = [(a.last_updated, app_id) for app_id, a in self._apps.items() if is_terminal(a.state)]
        if not ended:
            return False
        del self._apps[min(ended)[1]]
        return True

    def _popen(self, role_name: str, replica_id: int, param: ReplicaParam) -> _LocalReplica:
        """Start one replica in its own session, its output copied into its log files."""
        env = {**os.environ, **param.env}
        # the role's PATH entries go before the launcher's, never instead of it; Python unbuffered, as in TorchX
        env["PATH"] = _join_path(param.env.get("PATH"), os.environ.get("PATH"))
        env.setdefault("PYTHONUNBUFFERED", "x")
        for path in (param.stdout, param.stderr, param.combined):
            if path:
                os.makedirs(os.path.dirname(path), exist_ok=True)
        proc = subprocess.Popen(
            param.args, env=env, cwd=param.cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, start_new_session=True,
        )
        assert proc.stdout is not None and proc.stderr is not None
        combined = open(param.combined or os.devnull, "ab")  # noqa: SIM115 (closed by the last pump)
        lock = threading.Lock()
        pumps = [
            threading.Thread(target=_pump, args=(proc.stdout, open(param.stdout or os.devnull, "ab"), combined, lock),  # noqa: SIM115
                             daemon=True, name=f"tsm-log-{role_name}-{replica_id}-out"),
            threading.Thread(target=_pump, args=(proc.stderr, open(param.stderr or os.devnull, "ab"), combined, lock),  # noqa: SIM115
                             daemon=True, name=f"tsm-log-{role_name}-{replica_id}-err"),
        ]
        for t in pumps:
            t.start()
        closer = threading.Thread(target=_close_after, args=(pumps, combined), daemon=True)
        closer.start()
        error_file = param.env.get("TORCHELASTIC_ERROR_FILE", os.path.join(os.path.dirname(param.stdout or "."), "error.json"))
        return _LocalReplica(role_name, replica_id, proc, error_file, [*pumps, closer])

    def schedule(self, dryrun_info: AppDryRunInfo[PopenRequest]) -> str:
        """Start every replica of the request; the app id."""
        if len(self._apps) >= self._cache_size and not self._evict_lru():
            raise IndexError(f"App cache size ({self._cache_size}) exceeded. Increase the cache size")
        request = dryrun_info.request
        os.makedirs(request.log_dir)
        local_app = _LocalAppDef(request.app_id, request.log_dir)
        self._apps[request.app_id] = local_app
        try:
            for role_name, params in request.role_params.items():
                for replica_id, param in enumerate(params):
                    os.makedirs(request.role_log_dirs[role_name][replica_id], exist_ok=True)
                    local_app.add_replica(role_name, self._popen(role_name, replica_id, param))
        except BaseException:
            local_app.kill()
            local_app.set_state(AppState.FAILED)
            raise
        local_app.set_state(AppState.RUNNING)
        return request.app_id

    # -- queries ---------------------------------------------------------------------------------------------
    def describe(self, app_id: str) -> DescribeAppResponse | None:
        """The app's state from its replicas' exits (any running: RUNNING, any failed: FAILED); None if unknown."""
        local_app = self._apps.get(app_id)
        if local_app is None:
            return None
        if not is_terminal(local_app.state):
            replicas = local_app._replicas()
            if any(r.is_alive() for r in replicas):
                local_app.set_state(AppState.RUNNING)
            else:
                local_app.set_state(AppState.FAILED if any(r.failed() for r in replicas) else AppState.SUCCEEDED)
        if is_terminal(local_app.state):
            local_app.close()
        roles = []
        for role_name, reps in local_app.role_replicas.items():
            statuses = []
            for r in reps:
                code = r.proc.poll()
                if local_app.state == AppState.CANCELLED:
                    state = AppState.CANCELLED
                else:
                    state = AppState.RUNNING if code is None else AppState.SUCCEEDED if code == 0 else AppState.FAILED
                statuses.append(ReplicaStatus(r.replica_id, state, role_name, "localhost", exit_code=code, pid=r.proc.pid))
            roles.append(RoleStatus(role_name, statuses))
        return DescribeAppResponse(
            app_id=app_id, state=local_app.state, num_restarts=0, ui_url=f"file://{local_app.log_dir}",
            structured_error_msg=local_app.get_structured_error_msg(), roles_statuses=roles,
        )

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
        """The lines of ``<log_dir>/<role>/<k>/<stream>.log`` (``since``/``until`` are ignored, as in TorchX)."""
        from tsm.errors import UnknownAppError

        local_app = self._apps.get(app_id)
        if local_app is None:
            raise UnknownAppError(f"unknown app '{app_id}' (this scheduler only knows the apps it started)")
        name = {Stream.STDOUT: STDOUT_LOG, Stream.STDERR: STDERR_LOG}.get(streams or Stream.COMBINED, COMBINED_LOG)
        log_file = os.path.join(local_app.log_dir, role_name, str(k), name)
        if not os.path.isfile(log_file):
            raise UnknownAppError(f"app '{app_id}' has no log {log_file} (no role '{role_name}' replica {k})")
        lines: Iterator[str] = split_lines_iterator(LogIterator(app_id, log_file, self, should_tail))
        return filter_regex(regex, lines) if regex else lines

    def list(self) -> list[ListAppResponse]:
        """The apps this scheduler object started (it keeps nothing across processes)."""
        out = []
        for app_id in list(self._apps):
            desc = self.describe(app_id)
            if desc is not None:
                out.append(ListAppResponse(app_id, desc.state, app_handle=f"local://{self.session_name}/{app_id}"))
        return out

    # -- cancelling (both spellings) -------------------------------------------------------------------------
    def _cancel_existing(self, app_id: str) -> None:
        local_app = self._apps[app_id]
        local_app.kill()
        local_app.set_state(AppState.CANCELLED)

    def cancel(self, app_id: str) -> None:
        """End the app's replicas if it still runs; unknown or ended apps are left as they are."""
        desc = self.describe(app_id)
        if desc is not None and not is_terminal(desc.state):
            self._cancel_existing(app_id)

    def close(self) -> None:
        """End every app this scheduler started and remove the temporary log dirs it made (never a given one)."""
        for local_app in list(getattr(self, "_apps", {}).values()):
            local_app.kill()
        for tmp in getattr(self, "_tmp_log_dirs", []):
            shutil.rmtree(tmp, ignore_errors=True)
        self._tmp_log_dirs = []

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


def create_scheduler(
    session_name: str,
    cache_size: int = 100,
    extra_paths: list[str] | None = None,
    image_provider_class: Callable[[Mapping[str, Any]], ImageProvider] = CWDImageProvider,
    **kwargs: Any,
) -> LocalScheduler:
    """TorchX's factory: a :class:`LocalScheduler` running images as the working directory by default."""
    return LocalScheduler(session_name, image_provider_class, cache_size=cache_size, extra_paths=extra_paths)

