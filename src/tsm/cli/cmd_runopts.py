"""``tsm runopts [SCHEDULER]``: the run options each scheduler takes, with types, defaults and help."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from tsm.cli import _exits


def add_parser(sub: Any) -> None:
    p = sub.add_parser("runopts", help="show schedulers' run options")
    p.add_argument("scheduler", nargs="?", help="only this scheduler")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tsm.errors import SchedulerUnavailableError
    from tsm.runner.api import get_runner

    with get_runner(args.session) as runner:
        from tsm.schedulers import ALIASES

        names = [args.scheduler] if args.scheduler else [n for n in runner.scheduler_backends() if n not in ALIASES]
        for name in names:
            try:
                opts = runner.scheduler_run_opts(name)
            except (SchedulerUnavailableError, ImportError) as e:
                # One broken backend must not hide the others when listing them all.
                if args.scheduler:
                    raise
                sys.stdout.write(f"{name}:\n    (unavailable: {e})\n\n")
                continue
            sys.stdout.write(f"{name}:\n{opts}\n\n")
    return _exits.OK
