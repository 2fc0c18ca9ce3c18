"""``structured_error_msg``, specified once: why a FAILED app failed, as one JSON object every backend writes alike.

The value of ``DescribeAppResponse.structured_error_msg`` (and so of ``AppStatus.structured_error_msg``) is
either the empty string (the app has not failed, or nothing is known of why) or a JSON object with exactly
these keys::

    {"replica": "trainer/3",        # role/index of the replica the failure is attributed to, or null
     "exit_code": 137,              # that replica's exit code, or null
     "signal": "SIGKILL",           # the signal that ended it, or null
     "message": "trainer/3 ...",    # one line a person reads (never empty)
     "stderr_tail": ["...", ...]}   # the last lines it wrote to stderr, oldest first (may be empty)

:func:`structured_error` encodes it, :func:`failure_of` derives it from the replica statuses a backend has
already built (the first replica that failed with an exit code of its own, else the first that failed), and
:func:`parse_structured_error` is the one reader consumers use (None for "" or anything else). Consumers
never parse a backend's sentence.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from tsm.specs.api import AppState, ReplicaStatus, RoleStatus

#: The keys of every structured error, in the order they are written.
KEYS = ("replica", "exit_code", "signal", "message", "stderr_tail")


def structured_error(
    message: str,
    replica: str | None = None,
    exit_code: int | None = None,
    signal: str | None = None,
    stderr_tail: Sequence[str] = (),
) -> str:
    """The JSON text of one structured error (see the module docstring); ``message`` must say something."""
    if not message:
        message = f"replica {replica} failed" if replica else "the app failed"
    return json.dumps({
        "replica": replica, "exit_code": exit_code, "signal": signal, "message": message,
        "stderr_tail": [str(line) for line in stderr_tail],
    })


def signal_name(number: int) -> str | None:
    """``SIGTERM`` for 15: the name of a signal number, None when it names none."""
    import signal

    try:
        return signal.Signals(number).name
    except ValueError:
        return None


def _signal_of(rep: ReplicaStatus) -> str | None:
    """The signal that ended ``rep``: named in its error (``killed by SIGTERM``) or a negative exit code."""
    if rep.error_msg.startswith("killed by "):
        return rep.error_msg.split()[-1]
    if rep.exit_code is not None and rep.exit_code < 0:
        return signal_name(-rep.exit_code)
    return None


def failure_of(
    state: AppState,
    msg: str,
    roles_statuses: Sequence[RoleStatus],
    stderr_tail: Callable[[str, int], Sequence[str]] | None = None,
) -> str:
    """The structured error of an app from its state, message and replica statuses ("" unless FAILED).

    The culprit is the first replica FAILED with a non-zero exit code, else the first FAILED one, else none
    (the app's message alone). ``stderr_tail(role, k)`` gives its last stderr lines when the backend can
    read them (a log file, a container's log); without it the tail is empty.
    """
    if state != AppState.FAILED:
        return ""
    failed = [r for rs in roles_statuses for r in rs.replicas if r.state == AppState.FAILED]
    own = [r for r in failed if r.exit_code not in (None, 0)]
    if not (own or failed):
        return structured_error(msg)
    culprit = (own or failed)[0]
    return structured_error(
        culprit.error_msg or msg, f"{culprit.role}/{culprit.id}", culprit.exit_code, _signal_of(culprit),
        stderr_tail(culprit.role, culprit.id) if stderr_tail is not None else (),
    )


def parse_structured_error(text: str | None) -> dict[str, Any] | None:
    """The structured error as a dict with every key of :data:`KEYS`, or None for "" or text that is not one."""
    if not text:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("message"), str):
        return None
    out = {k: data.get(k) for k in KEYS}
    out["stderr_tail"] = [str(x) for x in out["stderr_tail"] or [] if isinstance(x, str)]
    return out
