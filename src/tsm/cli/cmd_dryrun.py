"""``tsm dryrun COMPONENT [ARGS...]``: print what would be submitted, submit nothing."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from tsm.cli._common import add_cfg_args, parse_cfg


def add_parser(sub: Any) -> None:
    p = sub.add_parser("dryrun", help="print the scheduler request for a component without submitting it")
    add_cfg_args(p)
    p.add_argument("component", help="component name, e.g. utils.echo or ./my.py:train")
    p.add_argument("component_args", nargs=argparse.REMAINDER, help="the component's arguments")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tsm.cli.cmd_run import component_help
    from tsm.components import wants_help
    from tsm.runner.api import get_runner

    if wants_help(args.component_args):
        return component_help(args.component)
    with get_runner(args.session) as runner:
        info = runner.dryrun_component(args.component, args.component_args, args.scheduler, parse_cfg(args.cfg))
    sys.stdout.write(f"=== scheduler request ({info.scheduler}) ===\n{info}\n")
    return 0
