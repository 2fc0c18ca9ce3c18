"""The one interface every backend implements, the values it returns, and the capabilities it may declare.

A backend subclasses :class:`Scheduler`, implements the abstract methods, and registers a factory
``create_scheduler(session_name: str, **kwargs) -> Scheduler`` under the entry-point group
``tsm.schedulers``. The runner calls nothing else, so a new backend touches no other module.

Flow: ``submit_dryrun(app, cfg)`` returns an :class:`AppDryRunInfo` (the request as a value);
``schedule(info)`` submits exactly that request and returns the scheduler's app id.

**Capabilities.** What a backend can do beyond the base interface is a class it inherits, listed in its class
docstring; the runner, the views and the CLI ask ``isinstance(sched, Capability)``, never ``getattr`` or a
signature, never a backend's name:

==========================  =====================================================================================
:class:`BatchedViews`       ``view_snapshot(app_ids)``: every app of a view's refresh from one batched query
:class:`DetailedViews`      the same, told which apps need costly extras (last log lines): ``tsm top``
:class:`MultiReplicaLogs`   ``log_iter_many(app_id, targets, ...)``: many replicas' logs in one reader
:class:`SizedPlacement`     places replicas by their size: the runner refuses a role without a resource
:class:`DirectoryWorkspaces`  roles run in a directory: the runner ships a workspace as a snapshot directory
``WorkspaceBuilder``        (:mod:`tsm.workspace.api`) builds its own workspaces (an image): the runner calls it
:class:`EventWait`          ``wait`` reacts to an event (no polling): ``poll_interval`` is not used
:class:`StoreRecords`       keeps its records in tsm's store: the runner's history row joins the record's write
:class:`PresetAppIds`       ``app_id_of``: the dry run fixes the app id, so an app can be held, then submitted
:class:`NativeDependencies` ``with_dependencies``: the engine holds a job until others end (``--after``)
:class:`ReplicaExec`        ``exec_in_replica``: a command in a live replica's place (``tsm exec``)
:class:`ReplicaStacks`      ``replica_stacks``: py-spy dumps of every Python process of replicas (``tsm stack``)
:class:`ReplicaPorts`       ``connect_replica_port``: a stream to a port inside a replica (``tsm port-forward``)
==========================  =====================================================================================

**Factories.** ``create_scheduler(session_name, **kwargs)`` takes only the keywords its backend documents; any
other raises :class:`tsm.schedulers.common.factory.UnknownSchedulerParamError` (an
:class:`~tsm.errors.InvalidRunOptionError`) naming it (:func:`tsm.schedulers.common.factory.scheduler_params`).

**Failures.** ``DescribeAppResponse.structured_error_msg`` is "" or the JSON object specified in
:mod:`tsm.schedulers.common.failure`, produced there for every backend.

**TorchX spellings.** A scheduler written for TorchX works unchanged: it may implement ``_run_opts()`` instead
of ``run_opts()``, ``_cancel_existing(app_id)`` instead of ``cancel(app_id)`` and
``_validate(app, scheduler, cfg)`` instead of ``_validate(app, cfg)``, and ``submit(app, cfg, workspace)``
ships a workspace. A class that implements neither spelling of a hook cannot be instantiated (``TypeError``).
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from tsm.errors import InvalidAppError, ReplicaNotRunningError, SchedulerError

# the log helpers every backend uses, importable from the interface module as well as from the kit
from tsm.schedulers.common.logs import (
    Stream as Stream,
    filter_regex as filter_regex,
    split_lines as split_lines,
    split_lines_iterator as split_lines_iterator,
)
from tsm.specs.api import NULL_RESOURCE, AppDef, AppDryRunInfo, AppState, Role, RoleStatus
from tsm.specs.runopts import CfgVal, runopts
from tsm.specs.validate import validate_app
from tsm.workspace.builder import DirectoryWorkspaces as DirectoryWorkspaces


@dataclass
class DescribeAppResponse:
    """What a scheduler knows of one app: state, message, per-role replica status, and the app if known.

    Constructible with no arguments, as in TorchX; ``roles`` and ``metadata`` are TorchX's way of
    giving back the app (used when ``app`` is None).
    """

    app_id: str = "<NOT_SET>"
    state: AppState = AppState.UNKNOWN
    num_restarts: int = 0
    msg: str = ""
    structured_error_msg: str = ""
    ui_url: str | None = None
    roles_statuses: list[RoleStatus] = field(default_factory=list)
    app: AppDef | None = None
    created: float | None = None
    roles: list[Role] = field(default_factory=list)
    metadata: dict[str, str] = field(default_factory=dict)


@dataclass
class ListAppResponse:
    """One row of :meth:`Scheduler.list`."""

    app_id: str
    state: AppState
    app_handle: str = ""
    name: str = ""
    created: float | None = None


TYPE_CHECKING = False
if TYPE_CHECKING:  # a default (PEP 696) lets a plain ``Scheduler`` mean "any request" to type checkers
    import socket
    from datetime import datetime  # annotations only: keeps datetime out of every command's start-up
    from typing import Any

    from typing_extensions import TypeVar as _TypeVarWithDefault

    from tsm.schedulers.common.viewmodel import AppSummary

    #: The type of the request a scheduler builds at dry run and submits unchanged (``SlurmBatchRequest``).
    RequestT = _TypeVarWithDefault("RequestT", default=Any)
else:
    RequestT = TypeVar("RequestT")


class Scheduler(abc.ABC, Generic[RequestT]):
    """A backend that runs apps: local processes, Slurm, Kubernetes, Ray, ...

    Generic over its request type: ``class SlurmScheduler(Scheduler[SlurmBatchRequest])``. Subclasses set
    ``backend`` and implement the abstract methods, ``run_opts`` (or TorchX's ``_run_opts``) and ``cancel``
    (or TorchX's ``_cancel_existing``); ``submit`` and ``exists`` are built on them. The contract every
    backend keeps is a test, ``tests/schedulers/conformance.py``: among others, ``describe`` of an unknown id
    is None and ``cancel`` is idempotent (cancelling an ended or unknown app does nothing).
    """

    backend: str = ""

    #: True when this class's ``_validate`` is TorchX's ``(app, scheduler, cfg)``; set when the class is defined.
    _validate_takes_scheduler: bool = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        own = cls.__dict__.get("_validate")
        if own is not None:
            import inspect

            own = inspect.unwrap(own)  # a decorated hook (functools.wraps) is told apart by what it wraps
        code = getattr(own, "__code__", None)
        if code is not None:  # the two spellings of the hook are told apart once, here, by their arity
            cls._validate_takes_scheduler = code.co_argcount == 4

    def __new__(cls, *args: Any, **kwargs: Any) -> Scheduler[Any]:
        missing = [
            f"{ours}() (or TorchX's {theirs}())"
            for ours, theirs in (("cancel", "_cancel_existing"),)  # no run options is a valid choice (TorchX's)
            if getattr(cls, ours) is getattr(Scheduler, ours) and getattr(cls, theirs) is getattr(Scheduler, theirs)
        ]
        if missing:
            raise TypeError(f"Can't instantiate scheduler class {cls.__name__}: it implements neither "
                            + " nor ".join(missing))
        return super().__new__(cls)

    def __init__(self, backend: str, session_name: str) -> None:
        self.backend = backend
        self.session_name = session_name

    # -- requests ----------------------------------------------------------------------------------
    def submit_dryrun(self, app: AppDef, cfg: Mapping[str, CfgVal] | None = None) -> AppDryRunInfo[RequestT]:
        """Validate ``cfg`` and ``app`` and return the request this scheduler would submit, unsubmitted.

        An object that is not an :class:`~tsm.specs.AppDef` (a test double) is passed on unchecked, as TorchX
        passes it; each role's ``pre_proc`` hook may then adjust the request (TorchX's order).
        """
        resolved = self.run_opts().resolve(cfg)
        if isinstance(app, AppDef):
            validate_app(app)
        if type(self)._validate is Scheduler._validate:
            pass  # no backend check of its own; the base check is the runner's (TorchX's order)
        elif self._validate_takes_scheduler:
            self._validate(app, self.backend, resolved)  # type: ignore[call-arg,arg-type]  # TorchX's
        else:
            self._validate(app, resolved)
        info = self._submit_dryrun(app, resolved)
        for role in app.roles:
            info = role.pre_proc(self.backend, info)
        info.app = app
        info.cfg = resolved
        info.scheduler = self.backend
        return info

    def submit(self, app: AppDef, cfg: Mapping[str, CfgVal] | None = None, workspace: str | None = None) -> str:
        """Dry-run then schedule; returns the app id. ``workspace`` is shipped with the app first, as the
        runner ships it (:func:`tsm.workspace.dir.apply_workspace`); a scheduler without workspace support
        raises :class:`~tsm.errors.NotSupportedError`."""
        if workspace:
            from tsm.errors import NotSupportedError
            from tsm.workspace.dir import apply_workspace, builder_for

            builder = builder_for(self.backend, self)
            if builder is None:
                raise NotSupportedError(f"the {self.backend} scheduler cannot ship workspace {workspace!r}",
                                        scheduler=self.backend)
            apply_workspace(app, workspace, self.run_opts().resolve(cfg), builder)
        return self.schedule(self.submit_dryrun(app, cfg))

    if TYPE_CHECKING:
        def _validate(self, app: AppDef, cfg: Mapping[str, CfgVal]) -> None:
            """Backend-specific checks before the request is built; raise InvalidAppError."""
    else:
        def _validate(self, app, *args):  # noqa: B027 (optional hook)
            """Backend-specific checks before the request is built; raise InvalidAppError.

            TorchX's spelling ``_validate(self, app, scheduler, cfg)`` is called with the backend's name. This
            base hook takes both spellings, so a TorchX-style subclass's ``super()._validate(app, scheduler,
            cfg)`` works as a tsm-style one's ``super()._validate(app, cfg)``; it refuses, as TorchX's does, a
            role that does not say what it needs (:data:`~tsm.specs.NULL_RESOURCE`). :meth:`submit_dryrun` calls a
            subclass's own hook only: the base check is the TorchX runner's to make. tsm's backends override it.
            """
            for role in app.roles:
                if role.resource == NULL_RESOURCE:
                    raise InvalidAppError(f"role '{role.name}' has no resource: give it a Resource (or -h a named "
                                          "resource); this scheduler needs one for every role")

    @abc.abstractmethod
    def _submit_dryrun(self, app: AppDef, cfg: Mapping[str, CfgVal]) -> AppDryRunInfo[RequestT]:
        """Build the request for a validated app and resolved cfg."""

    @abc.abstractmethod
    def schedule(self, dryrun_info: AppDryRunInfo[RequestT]) -> str:
        """Submit the request in ``dryrun_info`` unchanged; return the app id."""

    def run_opts(self) -> runopts:
        """The run options this scheduler accepts (a TorchX-style subclass gives them in :meth:`_run_opts`)."""
        return self._run_opts()

    def _run_opts(self) -> runopts:
        """TorchX's hook for :meth:`run_opts`; a subclass implements one of the two."""
        return runopts()

    # -- queries -----------------------------------------------------------------------------------
    @abc.abstractmethod
    def describe(self, app_id: str) -> DescribeAppResponse | None:
        """The app's current state, or None when this scheduler does not know it."""

    def describe_native(self, app_id: str) -> AppDryRunInfo[Any] | None:
        """The request the app was submitted with, read back from the scheduler (the twin of
        :meth:`submit_dryrun`), or None: the app is unknown, or this scheduler does not read requests back
        (the default; TorchX's nightly has the same default)."""
        return None

    def exists(self, app_id: str) -> bool:
        """True when the scheduler knows the app."""
        return self.describe(app_id) is not None

    @abc.abstractmethod
    def list(self) -> list[ListAppResponse]:
        """The apps this scheduler knows of for the current user, newest first."""

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
        """Lines (each ending with a newline, but possibly the last) of replica ``k`` of ``role_name``.

        ``should_tail`` follows the log until the replica ends, then stops. A scheduler without logs keeps
        this default, which raises :class:`~tsm.errors.NotSupportedError` (TorchX's default raises too).
        """
        from tsm.errors import NotSupportedError

        raise NotSupportedError(f"{type(self).__qualname__} does not support application log iteration",
                                scheduler=self.backend)

    def wait(
        self, app_id: str, timeout: float | None = None, poll_interval: float | None = None
    ) -> DescribeAppResponse | None:
        """Block until the app is terminal or ``timeout`` passes; return its description.

        The default polls :meth:`describe`, backing off from 0.1 s to 5 s
        (:func:`tsm.schedulers.common.polling.poll_until_terminal`); ``poll_interval`` caps the pause
        between polls (a smaller value asks more often; a larger one changes nothing). A backend with an
        event to wait on overrides this and declares :class:`EventWait`.
        """
        from tsm.schedulers.common.polling import poll_until_terminal

        cap = 5.0 if poll_interval is None else max(0.001, min(5.0, poll_interval))
        return poll_until_terminal(lambda _pause: self.describe(app_id), timeout, initial=min(0.1, cap), cap=cap)

    def cancel(self, app_id: str) -> None:
        """Stop the app if it still runs; idempotent, and nothing for an unknown app.

        The default is TorchX's: :meth:`_cancel_existing` for an app that :meth:`exists`.
        """
        if self.exists(app_id):
            self._cancel_existing(app_id)

    def _cancel_existing(self, app_id: str) -> None:
        """TorchX's hook for :meth:`cancel`: stop an app known to exist; a subclass implements one of the two."""
        raise NotImplementedError(f"{type(self).__name__} implements neither cancel() nor _cancel_existing()")

    def remove(self, app_id: str) -> bool:
        """Delete what this scheduler keeps of an ended app (state, logs); True if anything was removed.

        The default keeps nothing locally, so there is nothing to remove.
        """
        return False

    def close(self) -> None:  # noqa: B027 (optional hook)
        """Release clients and connections; the scheduler is not used after this."""


# -- declared capabilities ------------------------------------------------------------------------------
class BatchedViews(abc.ABC):
    """Capability: ``tsm top``/``tsm serve`` see every app of a refresh through one call.

    ``view_snapshot(app_ids)`` returns an :class:`~tsm.schedulers.common.viewmodel.AppSummary` for each id
    it knows (unknown ids are left out), built from one batched query of the backend (a label-selected list,
    one ``squeue``, one State API call). ``handle`` may be left empty; the collector fills it in.
    """

    __slots__ = ()

    @abc.abstractmethod
    def view_snapshot(self, app_ids: Sequence[str]) -> list[AppSummary]:
        """A summary of each app of ``app_ids`` this scheduler knows, from one batched query."""


class DetailedViews(BatchedViews):
    """Capability: :class:`BatchedViews` whose costly extras (each replica's last log line) can be limited.

    ``detail`` names the app ids that need them (None: all); the others' summaries leave them empty.
    """

    __slots__ = ()

    @abc.abstractmethod
    def view_snapshot(
        self, app_ids: Sequence[str], detail: Collection[str] | None = None
    ) -> list[AppSummary]:
        """As :meth:`BatchedViews.view_snapshot`, with last log lines only for the apps in ``detail``."""


class MultiReplicaLogs(abc.ABC):
    """Capability: the logs of many replicas of an app followed by one reader (no thread per replica).

    ``log_iter_many`` yields ``LogEvent``-shaped values (``role``, ``k``, ``attempt``, ``marker``, ``text``;
    see :class:`tsm.schedulers.local.logs.LogEvent`), or just lines with ``text_only``. What ``tsm log -f``
    and an attached ``tsm run`` use when the scheduler has it.
    """

    __slots__ = ()

    @abc.abstractmethod
    def log_iter_many(
        self,
        app_id: str,
        targets: Sequence[tuple[str, int]] | None = None,
        regex: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        should_tail: bool = False,
        streams: Stream | None = None,
        attempt: int | None = None,
        idle: Any = None,
        text_only: bool = False,
    ) -> Iterator[Any]:
        """Events (or, with ``text_only``, lines) of the replicas ``targets`` (None: all) of ``app_id``."""


class SizedPlacement:
    """Capability (a marker): the backend places replicas by their size, so every role needs a resource.

    The runner refuses a role without one before the dry run (:func:`tsm.specs.validate.check_resources`).
    """

    __slots__ = ()


class LockfileEnvironments:
    """Capability (a marker): the backend builds a role's lockfile environment (:mod:`tsm.env`) and runs it there.

    The runner refuses a role that names an environment on a backend without it, rather than run it elsewhere.
    """

    __slots__ = ()


class Secrets:
    """Capability: the backend delivers a role's secrets (:mod:`tsm.specs.secrets`) to its replicas' environment
    through its own channel, reading their values at ``schedule``, never keeping them in its request.

    ``secret_kinds``: the sources it takes (``k8s``: a Kubernetes Secret the pod references). The runner
    refuses secrets on a backend without it, and a source it does not list, at dry run.
    """

    __slots__ = ()
    secret_kinds: tuple[str, ...] = ("env", "file")


class PresetAppIds:
    """Capability: the app id is fixed by the dry run (not by the engine at submission), so tsm can hand out an
    app's handle before it submits it: an app held until others end (:mod:`tsm.runner.after`)."""

    __slots__ = ()

    def app_id_of(self, dryrun_info: AppDryRunInfo[Any]) -> str:
        """The id ``schedule(dryrun_info)`` will return: the request's ``app_id`` (override where it is not)."""
        return str(dryrun_info.request.app_id)


class NativeDependencies(abc.ABC):
    """Capability: the engine holds a job until others end (Slurm's ``--dependency``) and ends it when they
    never can."""

    __slots__ = ()

    @abc.abstractmethod
    def with_dependencies(self, dryrun_info: AppDryRunInfo[Any],
                          after: Sequence[tuple[str, str]]) -> AppDryRunInfo[Any] | None:
        """``dryrun_info`` waiting for each ``(app_id, condition)`` (``ok``, ``any``, ``fail``) of this scheduler;
        None when the engine cannot (an app of another cluster): tsm's helper waits instead."""


class EventWait:
    """Capability (a marker): ``wait`` returns when an event says the app ended, not by polling.

    The runner then does not pass ``poll_interval`` (it would mean nothing).
    """

    __slots__ = ()


class StoreRecords(abc.ABC):
    """Capability: the backend keeps its apps' records in tsm's own store (its ``store``, a
    :class:`tsm.store.Store`), so the runner's history row can be written in the same transaction.

    The runner calls :meth:`schedule_recording` instead of ``schedule`` when its history uses that store: one
    store write per launch, not two.
    """

    __slots__ = ()

    store: Any

    @abc.abstractmethod
    def schedule_recording(self, dryrun_info: AppDryRunInfo[Any],
                           also: Callable[[str], tuple[str, tuple[Any, ...]]] | None = None) -> str:
        """``schedule``, with ``also(app_id)``'s ``(sql, params)`` written in the transaction of the app's record."""


@dataclass(frozen=True)
class TrialState:
    """What a :class:`SweepNative` scheduler says of one trial: its state, message and (when known) the times
    the engine started and ended it (epoch seconds)."""

    state: AppState
    msg: str = ""
    started: float | None = None
    ended: float | None = None


class SweepNative(abc.ABC):
    """Capability: the scheduler runs a whole sweep as one native object that enforces the cap itself.

    :func:`tsm.sweep.api.run_sweep` asks ``isinstance(sched, SweepNative)`` and, when :meth:`accepts_sweep` takes the
    trials (Slurm: every trial single-role), calls :meth:`schedule_sweep` instead of starting a controller.
    Each trial must still be an ordinary app of the scheduler (its own app id, ``describe``, logs, cancel).
    """

    def accepts_sweep(self, trials: Sequence[AppDryRunInfo[Any]]) -> bool:
        """Whether these trials (``AppDryRunInfo`` each) can be one native sweep; by default they can."""
        return bool(trials)

    @abc.abstractmethod
    def schedule_sweep(self, trials: Sequence[AppDryRunInfo[Any]], parallel: int, name: str) -> list[str]:
        """Submit ``trials`` (``AppDryRunInfo`` each) as one native sweep named ``name``, at most ``parallel``
        running at once; each trial's app id, in order."""

    @abc.abstractmethod
    def trial_states(self, app_ids: Sequence[str]) -> dict[str, TrialState]:
        """The trials' states from one batched query where the engine has one; an id it no longer knows is
        left out."""

    @abc.abstractmethod
    def cancel_trials(self, app_ids: Sequence[str]) -> None:
        """Cancel these trials (in one call where the engine has one); ended or unknown ones are no error."""


# -- looking inside a live replica (tsm exec / stack / port-forward) ----------------------------------------
@dataclass
class ProcessStack:
    """py-spy's dump of one process of a replica: its pid (as the replica's host sees it), its command line,
    and its threads as py-spy's JSON gives them (each with ``frames``, innermost first)."""

    pid: int
    cmdline: str
    threads: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class ReplicaStack:
    """Every Python process of one replica (``role``/``k``), or, in ``error``, one line saying why none could
    be dumped (py-spy missing where the replica runs, no ptrace permission) and what to change."""

    role: str
    k: int
    processes: list[ProcessStack] = field(default_factory=list)
    error: str = ""

    def take_dump(self, text: str) -> None:
        """Fill this from a dump helper's JSON: a list of ``{pid, cmdline, code, out, err}``, one per Python
        process of the replica (py-spy's exit code and output for each)."""
        import json

        from tsm.schedulers.common import pyspy

        rows = [(x["pid"], x["cmdline"], x["code"], x["out"], x["err"]) for x in json.loads(text or "[]")]
        dumped, why = pyspy.join_processes(rows)
        self.processes = [ProcessStack(pid, cmdline, threads) for pid, cmdline, threads in dumped]
        self.error = why or ("" if dumped else "no Python process in this replica")


def each_stack(replicas: Sequence[tuple[str, int]], fill: Callable[[ReplicaStack], None],
               errors: tuple[type[Exception], ...] = ()) -> list[ReplicaStack]:
    """One :class:`ReplicaStack` per ``(role, k)``, in order, each filled by ``fill``: an error of ``errors``
    (besides a replica not running and the engine's refusal) becomes that replica's ``error``, so one replica
    that cannot be dumped does not hide the others."""
    caught: tuple[type[Exception], ...] = (ReplicaNotRunningError, SchedulerError, *errors)
    out = []
    for role, k in replicas:
        stack = ReplicaStack(role, k)
        out.append(stack)
        try:
            fill(stack)
        except caught as e:
            stack.error = str(e)
    return out


class ReplicaExec(abc.ABC):
    """Capability: ``tsm exec``, a command run where a live replica runs (its host, container or pod), in its
    working directory, with its environment (``TSM_*`` included), as its user.

    The runner has checked that the app runs and names the replica; a replica that has not started or has
    ended raises :class:`~tsm.errors.ReplicaNotRunningError`.
    """

    __slots__ = ()

    @abc.abstractmethod
    def exec_in_replica(self, app_id: str, role: str, k: int, cmd: Sequence[str], tty: bool = False,
                        stdin: bool = False) -> int:
        """Run ``cmd`` (an argv, passed verbatim: no shell) with this process's stdout and stderr, and its stdin
        with ``stdin`` (else an empty one); with ``tty`` under a terminal of its own, stdin included. Returns
        its exit code (128 + N for a command killed by signal N)."""


class ReplicaStacks(abc.ABC):
    """Capability: ``tsm stack``, every Python thread's stack of every Python process of live replicas."""

    __slots__ = ()

    @abc.abstractmethod
    def replica_stacks(self, app_id: str, replicas: Sequence[tuple[str, int]], native: bool = False) -> list[ReplicaStack]:
        """One :class:`ReplicaStack` per ``(role, k)`` of ``replicas``, in order; ``native`` adds C frames.
        A replica that cannot be dumped says why in its ``error``; this raises only when none can be reached."""


class ReplicaPorts(abc.ABC):
    """Capability: ``tsm port-forward``, a byte stream to a TCP port inside a live replica."""

    __slots__ = ()

    @abc.abstractmethod
    def connect_replica_port(self, app_id: str, role: str, k: int, port: int) -> socket.socket:
        """A connected stream socket whose other end is ``port`` inside replica ``role``/``k`` (each call a
        new connection; the caller closes it). A refused connection raises :class:`ConnectionError`."""
