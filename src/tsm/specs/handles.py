"""App handles: ``scheduler://session/app_id``, the one string that names a launched app everywhere.

Only letters, digits, ``_``, ``-`` and ``.`` are allowed in each part (no ``/``, ``%``, spaces, control
characters or non-ASCII), ``.`` and ``..`` are refused as a session or app id, and each part is at most
:data:`MAX_PART` characters, so no part of a handle can climb out of a directory or smuggle a path.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from tsm.errors import MalformedAppHandleError, brief

#: The longest scheduler name, session or app id (a file name's limit on Linux).
MAX_PART = 255

# ``\Z``, not ``$``: ``$`` also matches before a trailing newline, which would let "local://s/app\n" through.
_HANDLE_RE = re.compile(
    rf"^(?P<scheduler>[A-Za-z0-9][A-Za-z0-9_.-]{{0,{MAX_PART - 1}}})://"
    rf"(?P<session>[A-Za-z0-9_.-]{{0,{MAX_PART}}})/(?P<app_id>[A-Za-z0-9_.-]{{1,{MAX_PART}}})\Z"
)


class ParsedAppHandle(NamedTuple):
    """The three parts of an app handle; ``scheduler_backend``/``session_name`` are TorchX's names for the first two."""

    scheduler: str
    session: str
    app_id: str

    @property
    def scheduler_backend(self) -> str:
        """TorchX's name for :attr:`scheduler`."""
        return self.scheduler

    @property
    def session_name(self) -> str:
        """TorchX's name for :attr:`session`."""
        return self.session


def make_app_handle(scheduler_backend: str, session_name: str, app_id: str) -> str:
    """Build ``scheduler_backend://session_name/app_id`` (and check it parses back); TorchX's keyword names."""
    handle = _join(scheduler_backend, session_name, app_id)
    parse_app_handle(handle)
    return handle


def app_handle_template(scheduler_backend: str, session_name: str) -> str:
    """The handle of an app not submitted yet: its app id is the ``${app_id}`` macro, filled in per replica.

    The scheduler and session are checked as :func:`make_app_handle` checks them.
    """
    make_app_handle(scheduler_backend, session_name, "app")
    return _join(scheduler_backend, session_name, "${app_id}")


def _join(scheduler_backend: str, session_name: str, app_id: str) -> str:
    return f"{scheduler_backend}://{session_name}/{app_id}"


def parse_app_handle(app_handle: str) -> ParsedAppHandle:
    """Split a handle into its parts; anything else, including ``..`` as an app id, is an error."""
    handle = app_handle
    m = _HANDLE_RE.match(handle) if isinstance(handle, str) else None
    if not m or m.group("app_id") in (".", "..") or m.group("session") in (".", ".."):
        raise MalformedAppHandleError(
            f"malformed app handle {brief(handle, 120)}: expected scheduler://session/app_id "
            f"(letters, digits, '_', '-', '.', at most {MAX_PART} each), e.g. local://default/echo-1a2b3c",
            handle=handle if isinstance(handle, str) else None,
        )
    return ParsedAppHandle(m.group("scheduler"), m.group("session"), m.group("app_id"))
