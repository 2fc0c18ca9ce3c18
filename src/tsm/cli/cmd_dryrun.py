"""``tsm dryrun COMPONENT [ARGS...]``: print what would be submitted, submit nothing (``tsm run --dryrun``)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from tsm.cli import _exits
from tsm.cli._launch import ID_NOTE as ID_NOTE, add_launch_args, component_help, dry_run, dryrun_text


def add_parser(sub: Any) -> None:
    p = sub.add_parser("dryrun", help="print the scheduler request for a component without submitting it",
                       description="Print what tsm run would submit (the same as tsm run --dryrun), submit nothing.")
    add_launch_args(p)
    p.add_argument("component", help="component name, e.g. utils.echo or ./my.py:train")
    p.add_argument("component_args", nargs=argparse.REMAINDER, help="the component's arguments")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tsm.components import wants_help
    from tsm.runner.api import get_runner

    if wants_help(args.component_args):
        return component_help(args.component, command="dryrun")
    with get_runner(args.session) as runner:
        info = dry_run(runner, args, "dryrun")
    sys.stdout.write(dryrun_text(info))
    return _exits.OK
