"""App handles: ``scheduler://session/app_id``, the one string that names a launched app everywhere."""

from __future__ import annotations

import re
from typing import NamedTuple

from tsm.errors import MalformedAppHandleError

# ``\Z``, not ``$``: ``$`` also matches before a trailing newline, which would let "local://s/app\n" through.
_HANDLE_RE = re.compile(r"^(?P<scheduler>[A-Za-z0-9][A-Za-z0-9_.-]*)://(?P<session>[A-Za-z0-9_.-]*)/(?P<app_id>[A-Za-z0-9_.-]+)\Z")


class ParsedAppHandle(NamedTuple):
    """The three parts of an app handle."""

    scheduler: str
    session: str
    app_id: str


def make_app_handle(scheduler: str, session: str, app_id: str) -> str:
    """Build ``scheduler://session/app_id`` (and check it parses back)."""
    handle = f"{scheduler}://{session}/{app_id}"
    parse_app_handle(handle)
    return handle


def parse_app_handle(handle: str) -> ParsedAppHandle:
    """Split a handle into its parts; anything else, including ``..`` as an app id, is an error."""
    m = _HANDLE_RE.match(handle) if isinstance(handle, str) else None
    if not m or m.group("app_id") in (".", "..") or m.group("session") in (".", ".."):
        raise MalformedAppHandleError(
            f"malformed app handle {handle!r}: expected scheduler://session/app_id "
            "(letters, digits, '_', '-', '.'), e.g. local://default/echo-1a2b3c"
        )
    return ParsedAppHandle(m.group("scheduler"), m.group("session"), m.group("app_id"))
