"""The one interface every backend implements, and the values it returns.

A backend subclasses :class:`Scheduler`, implements the abstract methods, and registers a factory
``create_scheduler(session_name: str, **kwargs) -> Scheduler`` under the entry-point group
``tsm.schedulers``. The runner calls nothing else, so a new backend touches no other module.

Flow: ``submit_dryrun(app, cfg)`` returns an :class:`AppDryRunInfo` (the request as a value);
``schedule(info)`` submits exactly that request and returns the scheduler's app id.
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

# the log helpers every backend uses, importable from the interface module as well as from the kit
from tsm.schedulers.common.logs import (
    filter_regex as filter_regex,
    split_lines as split_lines,
    split_lines_iterator as split_lines_iterator,
)
from tsm.specs.api import AppDef, AppDryRunInfo, AppState, Role, RoleStatus
from tsm.specs.runopts import CfgVal, runopts
from tsm.specs.validate import validate_app


class Stream(str, enum.Enum):
    """Which output of a replica to read: stdout, stderr, or both in the order they were written."""

    STDOUT = "stdout"
    STDERR = "stderr"
    COMBINED = "combined"


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
    from datetime import datetime  # annotations only: keeps datetime out of every command's start-up
    from typing import Any

    from typing_extensions import TypeVar as _TypeVarWithDefault

    #: The type of the request a scheduler builds at dry run and submits unchanged (``SlurmBatchRequest``).
    RequestT = _TypeVarWithDefault("RequestT", default=Any)
else:
    RequestT = TypeVar("RequestT")


class Scheduler(abc.ABC, Generic[RequestT]):
    """A backend that runs apps: local processes, Slurm, Kubernetes, Ray, ...

    Generic over its request type: ``class SlurmScheduler(Scheduler[SlurmBatchRequest])``. Subclasses set
    ``backend`` and implement the abstract methods; ``submit`` and ``exists`` are built on them. The
    contract every backend keeps is a test, ``tests/schedulers/conformance.py``: among others, ``describe``
    of an unknown id is None and ``cancel`` is idempotent (cancelling an ended or unknown app does nothing).
    """

    backend: str = ""

    def __init__(self, backend: str, session_name: str) -> None:
        self.backend = backend
        self.session_name = session_name

    # -- requests ----------------------------------------------------------------------------------
    def submit_dryrun(self, app: AppDef, cfg: Mapping[str, CfgVal] | None = None) -> AppDryRunInfo[RequestT]:
        """Validate ``app`` and ``cfg`` and return the request this scheduler would submit, unsubmitted."""
        validate_app(app)
        resolved = self.run_opts().resolve(cfg)
        self._validate(app, resolved)
        info = self._submit_dryrun(app, resolved)
        info.app = app
        info.cfg = resolved
        info.scheduler = self.backend
        return info

    def submit(self, app: AppDef, cfg: Mapping[str, CfgVal] | None = None) -> str:
        """Dry-run then schedule; returns the app id."""
        return self.schedule(self.submit_dryrun(app, cfg))

    def _validate(self, app: AppDef, cfg: Mapping[str, CfgVal]) -> None:  # noqa: B027 (optional hook)
        """Backend-specific checks before the request is built; raise InvalidAppError."""

    @abc.abstractmethod
    def _submit_dryrun(self, app: AppDef, cfg: Mapping[str, CfgVal]) -> AppDryRunInfo[RequestT]:
        """Build the request for a validated app and resolved cfg."""

    @abc.abstractmethod
    def schedule(self, dryrun_info: AppDryRunInfo[RequestT]) -> str:
        """Submit the request in ``dryrun_info`` unchanged; return the app id."""

    @abc.abstractmethod
    def run_opts(self) -> runopts:
        """The run options this scheduler accepts."""

    # -- queries -----------------------------------------------------------------------------------
    @abc.abstractmethod
    def describe(self, app_id: str) -> DescribeAppResponse | None:
        """The app's current state, or None when this scheduler does not know it."""

    def exists(self, app_id: str) -> bool:
        """True when the scheduler knows the app."""
        return self.describe(app_id) is not None

    @abc.abstractmethod
    def list(self) -> list[ListAppResponse]:
        """The apps this scheduler knows of for the current user, newest first."""

    @abc.abstractmethod
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

        ``should_tail`` follows the log until the replica ends, then stops.
        """

    def wait(self, app_id: str, timeout: float | None = None) -> DescribeAppResponse | None:
        """Block until the app is terminal or ``timeout`` passes; return its description.

        The default polls :meth:`describe`, backing off from 0.1 s to 5 s
        (:func:`tsm.schedulers.common.polling.poll_until_terminal`); backends with an event (the local
        scheduler) override it.
        """
        from tsm.schedulers.common.polling import poll_until_terminal

        return poll_until_terminal(lambda _pause: self.describe(app_id), timeout)

    @abc.abstractmethod
    def cancel(self, app_id: str) -> None:
        """Stop the app if it still runs; idempotent."""

    def remove(self, app_id: str) -> bool:
        """Delete what this scheduler keeps of an ended app (state, logs); True if anything was removed.

        The default keeps nothing locally, so there is nothing to remove.
        """
        return False

    def close(self) -> None:  # noqa: B027 (optional hook)
        """Release clients and connections; the scheduler is not used after this."""
