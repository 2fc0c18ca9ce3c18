"""``tsm rm HANDLE... | --older-than DAYS``: forget ended apps and delete their local state and logs.

Nothing is deleted behind the user's back: only this command removes logs, and never those of an app
that is still running. A scheduler that cannot be reached stops nothing else: every other app is removed,
then one line per app that was not says why (exit 1).
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any

from tsm.cli import _exits
from tsm.cli._names import one_line
from tsm.errors import brief


def days(text: str) -> float:
    """``--older-than`` value: a finite number of days >= 0 (0 means every ended app)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{brief(text, 60)} is not a number of days (e.g. 7 or 0.5)") from None
    if not math.isfinite(value) or value < 0 or value > 1e7:
        raise argparse.ArgumentTypeError(f"{brief(text, 60)}: give a number of days from 0 to 10000000")
    return value


def add_parser(sub: Any) -> None:
    p = sub.add_parser("rm", help="remove ended apps and their logs")
    p.add_argument("handles", nargs="*", metavar="HANDLE", help="app handle(s)")
    p.add_argument("--older-than", type=days, metavar="DAYS",
                   help="every ended app created more than DAYS ago (0: every ended app)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tsm.errors import IncompleteRemovalError, InvalidRunOptionError
    from tsm.runner.api import get_runner
    from tsm.specs.handles import parse_app_handle

    if not args.handles and args.older_than is None:
        raise InvalidRunOptionError("say what to remove: HANDLE... or --older-than DAYS")
    for handle in args.handles:  # every handle checked before anything is removed
        parse_app_handle(handle)
    failed: dict[str, str] = {}
    with get_runner(args.session) as runner:
        try:
            removed = runner.remove(args.handles, older_than_days=args.older_than)
        except IncompleteRemovalError as e:  # what could be removed was: say so, then what could not
            removed, failed = e.removed, e.failed
    for handle in removed:
        sys.stdout.write(f"removed {handle}\n")
    sys.stdout.flush()
    for handle, why in failed.items():
        sys.stderr.write(f"tsm: could not remove {handle}: {one_line(why)}\n")
    if failed:
        sys.stderr.write(f"error: {len(failed)} app(s) not removed (above); the others were\n")
        return _exits.FAILED
    missing = [h for h in args.handles if h not in removed]
    if missing:  # a runner that skips unknown handles instead of raising: still exit 2, as everywhere
        raise _exits.unknown_app(missing[0])
    if not removed:
        sys.stdout.write("nothing to remove\n")
    return _exits.OK
