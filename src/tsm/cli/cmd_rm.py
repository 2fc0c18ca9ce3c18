"""``tsm rm HANDLE... | --older-than DAYS``: forget ended apps and delete their local state and logs.

Nothing is deleted behind the user's back: only this command removes logs, and never those of an app
that is still running.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any


def add_parser(sub: Any) -> None:
    p = sub.add_parser("rm", help="remove ended apps and their logs")
    p.add_argument("handles", nargs="*", metavar="HANDLE", help="app handle(s)")
    p.add_argument("--older-than", type=float, metavar="DAYS", help="every ended app created more than DAYS ago")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tsm.errors import InvalidRunOptionError
    from tsm.runner.api import get_runner

    if not args.handles and args.older_than is None:
        raise InvalidRunOptionError("say what to remove: HANDLE... or --older-than DAYS")
    with get_runner(args.session) as runner:
        removed = runner.remove(args.handles, older_than_days=args.older_than)
    for handle in removed:
        sys.stdout.write(f"removed {handle}\n")
    if not removed:
        sys.stdout.write("nothing to remove\n")
    return 0
