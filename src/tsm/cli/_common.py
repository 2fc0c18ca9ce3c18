"""Helpers the subcommands share: handle paths, time parsing, printing replicas' logs."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from tsm.errors import (  # UsageError moved to tsm.errors; importing it from here keeps working
    MalformedAppHandleError,
    UsageError as UsageError,
    brief,
)

if TYPE_CHECKING:
    from tsm.cli._live import StatusLine
    from tsm.runner.api import Runner


def split_handle_path(text: str) -> tuple[str, str | None, int | None]:
    """``scheduler://session/app_id[/role[/k]]`` -> (handle, role, k), each part checked before any lookup.

    The handle must parse (:func:`~tsm.specs.handles.parse_app_handle`), the role must be a valid role
    name and the replica a number, so no part can name a path (``..``) or reach a scheduler.
    """
    from tsm.specs.handles import parse_app_handle
    from tsm.specs.validate import NAME_RE

    scheme, sep, rest = text.partition("://")
    parts = rest.split("/") if sep else []
    if not sep or len(parts) < 2 or len(parts) > 4:
        raise MalformedAppHandleError(
            f"malformed app handle {brief(text, 120)}: expected scheduler://session/app_id[/role[/replica]]"
        )
    handle = f"{scheme}://{parts[0]}/{parts[1]}"
    parse_app_handle(handle)
    role = parts[2] if len(parts) > 2 and parts[2] else None
    if role is not None and not NAME_RE.match(role):
        raise MalformedAppHandleError(
            f"malformed app handle {brief(text, 120)}: role {brief(role, 120)} is not a role name "
            "(letters, digits, '-', '_')"
        )
    k = None
    if len(parts) > 3 and parts[3]:
        if not parts[3].isdigit() or not parts[3].isascii() or len(parts[3]) > 9:
            raise MalformedAppHandleError(f"replica index {brief(parts[3], 120)} in {brief(text, 120)} must be a number")
        k = int(parts[3])
    return handle, role, k


_REL = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$", re.ASCII)


def parse_time(text: str | None, flag: str) -> datetime | None:
    """An ISO time (``2026-11-21T10:00``) or a duration ago (``30s``, ``5m``, ``2h``, ``1d``), as local time.

    Checked here, where the flag is parsed: a time the scheduler could not turn into a POSIX time
    (``0001-01-01``, ``99999999d`` ago) is a usage error naming the flag, never a failure further in. A time
    with a UTC offset is converted to local time, so it compares with the (local) times of log lines.
    """
    if not text:
        return None
    usage = f"{flag} {brief(text, 80)}: use an ISO time (2026-11-21T10:00:00) or a duration ago (30s, 5m, 2h, 1d)"
    m = _REL.match(text.strip())
    try:
        if m:
            unit = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}[m.group(2)]
            when = datetime.now() - timedelta(**{unit: float(m.group(1))})
        else:
            when = datetime.fromisoformat(text.strip())
            if when.tzinfo is not None:
                when = when.astimezone().replace(tzinfo=None)
        when.timestamp()  # what the scheduler does with it: a time out of its range fails here, not there
    except ValueError as e:
        if "out of range" not in str(e):
            raise UsageError(usage) from None
        raise UsageError(f"{flag} {brief(text, 80)} is out of range: use a time within the years 1 to 9999") from None
    except (OverflowError, OSError):
        raise UsageError(f"{flag} {brief(text, 80)} is out of range: use a time within the years 1 to 9999") from None
    return when


def stream_logs(
    runner: Runner,
    handle: str,
    targets: list[tuple[str, int]],
    tail: bool,
    prefix: bool,
    out: Callable[[str], None] | None = None,
    live: StatusLine | None = None,
    **kwargs: Any,
) -> list[BaseException]:
    """Print the lines of every ``(role, k)`` target (:meth:`Runner.log_events`), prefixed ``role/k`` when ``prefix``.

    With ``live`` (an attached ``tsm run`` on a terminal), every line and marker goes through that
    status line, which steps out of the way of each one; the bytes written are the same.

    Where a replica's restarted attempt begins, a line ``--- attempt N ---`` goes to stderr (never into
    the output). A line that a follower ended at ``\\r`` (a progress bar redrawing itself) is printed
    with its ``\\r`` and no newline, so a terminal redraws it in place. Returns the errors met.
    """
    from tsm.errors import NotSupportedError

    write: Callable[[str], object] = out or (live.write_out if live is not None else sys.stdout.write)
    err: Callable[[str], object] = live.write_err if live is not None else sys.stderr.write
    flush = sys.stdout.flush
    try:
        for ev in runner.log_events(handle, targets, should_tail=tail, idle=flush if tail else None, **kwargs):
            tag = f"{ev.role}/{ev.k} " if prefix else ""
            if ev.marker:
                flush()  # what the replica printed before comes first
                err(f"{tag}--- attempt {ev.attempt} ---\n")
                sys.stderr.flush()
                continue
            text = ev.text
            write(tag + text if text.endswith(("\n", "\r")) else tag + text + "\n")
    except NotSupportedError as e:
        if kwargs.get("attempt") is None:
            return [e]
        return [UsageError(f"--attempt: {e}")]
    except BaseException as e:  # noqa: BLE001 - reported by the caller
        return [e]
    finally:
        flush()
    return []


def replica_targets(runner: Runner, handle: str, role: str | None, k: int | None) -> list[tuple[str, int]]:
    """Every (role, replica) of the app, narrowed to ``role``/``k`` when given."""
    from tsm.cli._exits import app_status

    status = app_status(runner, handle)  # an unknown app: UnknownAppError (exit 2), whether the runner raises or says None
    out = []
    for rs in status.roles:
        if role is not None and rs.role != role:
            continue
        for rep in rs.replicas:
            if k is None or rep.id == k:
                out.append((rs.role, rep.id))
    if not out and role is not None:
        roles = ", ".join(f"{rs.role} ({len(rs.replicas)})" for rs in status.roles)
        raise UsageError(f"{handle} has no replica {role}/{'*' if k is None else k}; roles: {roles}")
    return out
