"""``tsm status HANDLE [--json]``: the app's state, restarts, message and every replica.

For an app that FAILED it also says why: the replica that failed, its exit code or the signal that killed
it, the scheduler's error message, and the last lines that replica wrote to stderr (read from its log when
the scheduler gives no error text of its own), so the reason is on screen without a second command.
"""

from __future__ import annotations

import json
import signal
import sys
from collections import deque

from tsm.cli import _exits
from tsm.util.text import escaped

TYPE_CHECKING = False  # argparse and typing are for type checkers only: `tsm status` need not import them
if TYPE_CHECKING:
    import argparse
    from typing import Any

    from tsm.specs.api import AppStatus, ReplicaStatus

#: How many stderr lines of the failed replica are shown, and how much of each.
TAIL_LINES = 10
_LINE_WIDTH = 400


def add_parser(sub: Any) -> None:
    p = sub.add_parser("status", help="show an app's status")
    p.add_argument("handle", help="app handle, e.g. local://default/echo-1a2b3c4d")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tsm.runner.api import get_runner

    with get_runner(args.session) as runner:
        status = _exits.app_status(runner, args.handle)
        failure = failure_of(runner, args.handle, status)
    if args.json:
        # TorchX's keys (its AppStatus.to_json: state, num_restarts, roles, msg, structured_error_msg, url) and tsm's
        data = {"handle": args.handle, **status.to_dict(), "url": status.ui_url, "failure": failure}
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
    else:
        sys.stdout.write(f"{args.handle}\n{status.summary()}\n{format_failure(failure)}")
    return _exits.OK


def failed_replica(status: AppStatus) -> tuple[str, ReplicaStatus] | None:
    """The replica to blame for a FAILED app: a FAILED one that exited on its own, else any FAILED one."""
    from tsm.specs.api import AppState

    failed = [(rs.role, r) for rs in status.roles for r in rs.replicas if r.state == AppState.FAILED]
    # A replica stopped by tsm because a sibling failed (SIGTERM/SIGKILL) is a victim, not the cause.
    own = [(role, r) for role, r in failed if _signal_of(r) not in ("SIGTERM", "SIGKILL")]
    candidates = own or failed
    return candidates[0] if candidates else None


def _signal_of(r: ReplicaStatus) -> str | None:
    """The name of the signal that ended the replica, if a signal did (exit code -N or 128+N)."""
    code = r.exit_code
    if code is None:
        return None
    number = -code if code < 0 else code - 128 if code > 128 and "SIG" in r.error_msg else None
    if number is None:
        return None
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def failure_of(runner: Any, handle: str, status: AppStatus) -> dict[str, Any] | None:
    """Why a FAILED app failed, as plain data (None for any other state).

    Keys: ``replica`` (``role/k``), ``exit_code``, ``signal`` (its name, when a signal ended the replica),
    ``message`` and ``stderr_tail`` (its last stderr lines). Taken from the scheduler's
    ``structured_error_msg`` when that is such a JSON object (the local scheduler's is); otherwise worked
    out here from the replica states and the replica's log.
    """
    from tsm.specs.api import AppState

    if status.state != AppState.FAILED:
        return None
    out: dict[str, Any] = {
        "replica": None, "exit_code": None, "signal": None, "message": status.msg, "stderr_tail": [],
    }
    given = _structured(status.structured_error_msg)
    if given is not None and isinstance(given.get("replica"), str):
        for key, kinds in (("replica", str), ("exit_code", int), ("signal", str), ("message", str)):
            if isinstance(given.get(key), kinds) and not isinstance(given.get(key), bool):
                out[key] = given[key]
        tail = given.get("stderr_tail")
        if isinstance(tail, list):
            out["stderr_tail"] = [str(line)[:_LINE_WIDTH] for line in tail][-TAIL_LINES:]
        return out
    if status.structured_error_msg and given is None:  # a scheduler's own error text: the best message
        out["message"] = status.structured_error_msg
    found = failed_replica(status)
    if found is None:
        return out
    role, r = found
    out.update(replica=f"{role}/{r.id}", exit_code=r.exit_code, signal=_signal_of(r), message=r.error_msg or out["message"])
    out["stderr_tail"] = stderr_tail(runner, handle, role, r.id)
    return out


def _structured(text: str) -> dict[str, Any] | None:
    """``structured_error_msg`` as a JSON object, or None when it is empty or anything else."""
    if not text:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def stderr_tail(runner: Any, handle: str, role: str, k: int, n: int = TAIL_LINES) -> list[str]:
    """The last ``n`` lines replica ``role/k`` wrote to stderr; [] when its scheduler cannot say."""
    from tsm.schedulers.api import Stream

    lines: deque[str] = deque(maxlen=n)
    try:
        for line in runner.log_lines(handle, role, k, streams=Stream.STDERR):
            lines.append(line.rstrip("\r\n")[:_LINE_WIDTH])
    except Exception:  # noqa: BLE001 - logs are extra detail: a backend without them must not hide the status
        return list(lines)
    return list(lines)


def format_failure(failure: dict[str, Any] | None) -> str:
    """The text form of :func:`failure_of`: a few lines after the status, or "" when nothing failed."""
    if failure is None or failure["replica"] is None:
        return ""
    from tsm.util.text import printable

    how = f"killed by {failure['signal']}" if failure["signal"] else f"exit code {failure['exit_code']}"
    lines = [f"Failed: {failure['replica']} ({how})" + (f": {printable(failure['message'])}" if failure["message"] else "")]
    if failure["stderr_tail"]:
        lines.append(f"Last stderr lines of {failure['replica']}:")
        lines += [f"  | {_printable(line)}" for line in failure["stderr_tail"]]
    return "\n".join(lines) + "\n"


def _printable(text: str) -> str:
    """A log line as the terminal should show it: control characters escaped, not acted on."""
    return escaped(text, keep="\t")
