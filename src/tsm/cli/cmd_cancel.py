"""``tsm cancel HANDLE...``: stop apps (returns once they have ended; cancelling an ended app is fine).

Every handle is checked first (a malformed one stops the command before anything is cancelled); an unknown
app does not keep the others from being cancelled, and still ends the command with exit code 2.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from tsm.cli import _exits


def add_parser(sub: Any) -> None:
    p = sub.add_parser("cancel", help="stop apps")
    p.add_argument("handles", nargs="+", metavar="HANDLE", help="app handle(s)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tsm.errors import UnknownAppError
    from tsm.runner.api import get_runner
    from tsm.specs.handles import parse_app_handle

    for handle in args.handles:
        parse_app_handle(handle)
    unknown: list[str] = []
    with get_runner(args.session) as runner:
        for handle in args.handles:
            try:
                _exits.app_status(runner, handle)  # a runner whose cancel ignores unknown apps still says so
                runner.cancel(handle)
                state = _exits.app_status(runner, handle).state.name
            except UnknownAppError:
                unknown.append(handle)
                continue
            sys.stdout.write(f"{handle}: {state}\n")
    if unknown:
        sys.stdout.flush()
        raise _exits.unknown_app(unknown[0] if len(unknown) == 1 else f"{unknown[0]} (and {len(unknown) - 1} more)")
    return _exits.OK
