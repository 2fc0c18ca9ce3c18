"""``tsm top``: a full-screen view of apps, replicas, usage and logs (keys in :mod:`tsm.views.top`).

When stdout is not a terminal (or with ``--once``) it prints one plain-text snapshot instead and exits.
The full-screen view needs the ``views`` extra (``pip install 'tsm[views]'``).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from tsm.cli import _exits


def add_parser(sub: Any) -> None:
    p = sub.add_parser("top", help="full-screen view of apps, replicas, usage and logs")
    p.add_argument("--filter", default="", metavar="QUERY",
                   help="show matching apps only: state:RUNNING, scheduler:local, words of the name")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes (default 1)")
    p.add_argument("--limit", type=int, default=200, help="newest apps shown (default 200)")
    p.add_argument("--once", action="store_true", help="print one plain-text snapshot and exit")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tsm.errors import TsmError, UsageError

    if not 0.05 <= args.interval <= 3600:
        raise UsageError(f"--interval must be between 0.05 and 3600 seconds, not {args.interval}")
    if not 1 <= args.limit <= 100_000:
        raise UsageError(f"--limit must be between 1 and 100000, not {args.limit}")
    check_filter(args.filter)
    from tsm.runner.api import get_runner
    from tsm.views.snapshot import SnapshotCollector

    with get_runner(args.session) as runner:
        collector = SnapshotCollector(runner=runner, limit=args.limit)
        if args.once or not (sys.stdout.isatty() and sys.stdin.isatty()):
            from tsm.views.text import render_text

            sys.stdout.write(render_text(collector.refresh(), args.filter))
            return _exits.OK
        try:
            from tsm.views.top import TopApp
        except ImportError as e:
            raise TsmError(f"tsm top needs the views extra ({e.name} is missing): pip install 'tsm[views]'; "
                           "tsm top --once prints a plain-text snapshot without it") from e
        TopApp(collector, runner, interval=args.interval, query=args.filter).run()
    return _exits.OK


def check_filter(query: str) -> None:
    """Refuse a ``state:X`` word of ``--filter`` that names no state, with a "did you mean".

    Such a word matches no app ever, so ``state:FAILD`` would only print "no apps match" and leave the user
    guessing; a misspelt state is a usage error (exit 2) naming the states there are.
    """
    from tsm.errors import UsageError, brief, did_you_mean
    from tsm.specs.api import AppState

    states = [s.name for s in AppState]
    for word in query.split():
        key, sep, value = word.partition(":")
        if not sep or key.lower() != "state":
            continue
        for v in value.split(","):
            if v and v.upper() not in states:
                raise UsageError(
                    f"--filter: {brief(v, 40)} is not a state{did_you_mean(v.upper(), states)}; "
                    f"states: {', '.join(states)}"
                )
