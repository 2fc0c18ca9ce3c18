"""``tsm wait HANDLE [--timeout S]``: block until the app ends; exit 0 when it SUCCEEDED, 3 on timeout."""

from __future__ import annotations

import argparse
import math
import sys
import time
from typing import Any

from tsm.cli import _exits
from tsm.errors import brief

#: The longest single wait asked of the runner: a long ``--timeout`` is waited out in slices of this, so no
#: scheduler is ever handed a timeout too large for its clock arithmetic (select, poll).
_SLICE = 3600.0


def seconds(text: str) -> float | None:
    """``--timeout`` value: seconds >= 0, or ``inf`` / ``none`` for no timeout (None)."""
    word = text.strip().lower()
    if word in ("inf", "infinity", "+inf", "none"):
        return None
    try:
        value = float(word)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{brief(text, 60)} is not a number of seconds; give seconds (30, 2.5) or inf for no timeout"
        ) from None
    if math.isnan(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{brief(text, 60)}: give seconds >= 0 (30, 2.5) or inf for no timeout")
    return None if math.isinf(value) else value


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "wait", help="wait for an app to end (exit 0 if it succeeded)",
        description="Wait for an app to end. Exit 0 if it SUCCEEDED, 1 if it FAILED or was CANCELLED, "
        "3 if --timeout passed first (with one line on stderr saying what state it is still in).",
    )
    p.add_argument("handle", help="app handle")
    p.add_argument("--timeout", type=seconds, metavar="SECONDS",
                   help="give up after this many seconds (exit 3); inf (the default) waits for ever")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tsm.cli.cmd_status import failure_of, format_failure
    from tsm.runner.api import get_runner
    from tsm.specs.api import AppState

    with get_runner(args.session) as runner:
        status = _exits.app_status(runner, args.handle)
        deadline = None if args.timeout is None else time.monotonic() + args.timeout
        while not status.state.is_terminal:
            left = _SLICE if deadline is None else min(_SLICE, deadline - time.monotonic())
            if left <= 0:
                break
            waited = runner.wait(args.handle, timeout=left)
            if waited is None:  # removed while we waited
                raise _exits.unknown_app(args.handle)
            status = waited
        failure = failure_of(runner, args.handle, status)  # a FAILED app: which replica, why, its last stderr
    sys.stdout.write(f"{args.handle}\n{status.summary()}\n{format_failure(failure)}")
    if not status.state.is_terminal:
        sys.stdout.flush()
        sys.stderr.write(
            f"tsm: timed out after {args.timeout:g}s: {args.handle} is still {status.state.name}\n"
        )
        return _exits.TIMEOUT
    return _exits.OK if status.state == AppState.SUCCEEDED else _exits.FAILED
