"""Helpers the subcommands share: cfg parsing, handle paths, time parsing, log streaming."""

from __future__ import annotations

import re
import signal
import sys
import threading
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from tsm.errors import (  # UsageError moved to tsm.errors; importing it from here keeps working
    InvalidRunOptionError,
    MalformedAppHandleError,
    UsageError as UsageError,
    brief,
)

if TYPE_CHECKING:
    from tsm.cli._live import StatusLine
    from tsm.runner.api import Runner


def parse_cfg(text: str | None) -> dict[str, str]:
    """``-c k=v,k2=a,b`` -> ``{"k": "v", "k2": "a,b"}``: a piece without ``=`` continues the previous value."""
    out: dict[str, str] = {}
    last: str | None = None
    for piece in (text or "").split(","):
        if "=" in piece:
            key, _, value = piece.partition("=")
            key = key.strip()
            if not key:
                raise InvalidRunOptionError(f"-c: empty option name in {text!r}; use -c name=value,name2=value2")
            out[key] = value.strip()
            last = key
        elif last is not None:
            out[last] += "," + piece.strip()
        elif piece.strip():
            raise InvalidRunOptionError(f"-c: {piece!r} is not name=value; use -c name=value,name2=value2")
    return out


def add_cfg_args(parser: Any) -> None:
    """``-s/--scheduler`` and ``-c/--cfg`` as run and dryrun take them."""
    parser.add_argument("-s", "--scheduler", help="scheduler to use (default: config file's, else local)")
    parser.add_argument("-c", "--cfg", help="run options: name=value,name2=value2 (see tsm runopts)")



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


def start_thread(target: Callable[..., None], *args: Any) -> threading.Thread:
    """Start a daemon thread that never takes Ctrl-C, so SIGINT always wakes the main thread.

    A process-wide SIGINT goes to any thread that does not block it; landing on a worker, it would
    leave the main thread asleep in ``select``/``join`` and Ctrl-C would do nothing. The new thread
    inherits a mask blocking SIGINT; the caller's own mask is restored at once.
    """
    can_mask = hasattr(signal, "pthread_sigmask")
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT}) if can_mask else None
    try:
        t = threading.Thread(target=target, args=args, daemon=True)
        t.start()
    finally:
        if old is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
    return t


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
    """Print the lines of every ``(role, k)`` target, prefixed ``role/k`` when ``prefix``.

    With ``live`` (an attached ``tsm run`` on a terminal), every line and marker goes through that
    status line, which steps out of the way of each one; the bytes written are the same.

    Where a replica's restarted attempt begins, a line ``--- attempt N ---`` goes to stderr (never into
    the output). A line that a follower ended at ``\\r`` (a progress bar redrawing itself) is printed
    with its ``\\r`` and no newline, so a terminal redraws it in place. Returns the errors met.

    A scheduler that follows many replicas in one thread (``MultiReplicaLogs``, the local one) serves
    every target with one reader: no thread, connection or open file per replica. Other schedulers
    get one thread per replica, each with a runner of its own (a runner belongs to one thread).
    """
    from tsm.runner.api import Runner
    from tsm.schedulers.api import MultiReplicaLogs
    from tsm.specs.handles import parse_app_handle

    write: Callable[[str], object] = out or (live.write_out if live is not None else sys.stdout.write)
    err: Callable[[str], object] = live.write_err if live is not None else sys.stderr.write
    errors: list[BaseException] = []
    own = Runner(runner.session_name)  # log reading needs no config; this one belongs to this thread
    try:
        parsed = parse_app_handle(handle)
        sched = own.scheduler(parsed.scheduler)
        if isinstance(sched, MultiReplicaLogs):
            flush = sys.stdout.flush
            events = sched.log_iter_many(parsed.app_id, targets, should_tail=tail, idle=flush if tail else None,
                                         **kwargs)
            for ev in events:
                tag = f"{ev.role}/{ev.k} " if prefix else ""
                if ev.marker:
                    flush()  # what the replica printed before comes first
                    err(f"{tag}--- attempt {ev.attempt} ---\n")
                    sys.stderr.flush()
                    continue
                text = ev.text
                write(tag + text if text.endswith(("\n", "\r")) else tag + text + "\n")
            return errors
    except BaseException as e:  # noqa: BLE001 - reported by the caller
        errors.append(e)
        return errors
    finally:
        own.close()
        sys.stdout.flush()
    return _stream_logs_threads(runner, handle, targets, tail, prefix, write, **kwargs)


def _stream_logs_threads(
    runner: Runner,
    handle: str,
    targets: list[tuple[str, int]],
    tail: bool,
    prefix: bool,
    write: Callable[[str], object],
    **kwargs: Any,
) -> list[BaseException]:
    """:func:`stream_logs` for a scheduler without ``MultiReplicaLogs``: one thread and runner per replica."""
    from tsm.runner.api import Runner

    if kwargs.pop("attempt", None) is not None:
        raise UsageError(f"--attempt: the scheduler of {handle} does not keep a replica's attempts apart")

    lock = threading.Lock()
    errors: list[BaseException] = []

    def pump(role: str, k: int) -> None:
        tag = f"{role}/{k} " if prefix else ""
        own = Runner(runner.session_name)  # log reading needs no config
        try:
            for line in own.log_lines(handle, role, k, should_tail=tail, **kwargs):
                if not line.endswith("\n"):
                    line += "\n"
                with lock:
                    write(tag + line)
                    if tail:  # a follower shows each line as it comes, even through a pipe
                        sys.stdout.flush()
        except BaseException as e:  # noqa: BLE001 - reported by the caller
            errors.append(e)
        finally:
            own.close()
            with lock:
                sys.stdout.flush()

    if len(targets) == 1:
        pump(*targets[0])
        return errors
    threads = [start_thread(pump, *t) for t in targets]
    for t in threads:
        t.join()
    return errors


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
