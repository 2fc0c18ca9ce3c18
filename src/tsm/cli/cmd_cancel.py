"""``tsm cancel HANDLE...``: stop apps (returns once they have ended; cancelling an ended app is fine)."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def add_parser(sub: Any) -> None:
    p = sub.add_parser("cancel", help="stop apps")
    p.add_argument("handles", nargs="+", metavar="HANDLE", help="app handle(s)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tsm.runner.api import get_runner

    with get_runner(args.session) as runner:
        for handle in args.handles:
            runner.cancel(handle)
            sys.stdout.write(f"{handle}: {runner.status(handle).state.name}\n")
    return 0
