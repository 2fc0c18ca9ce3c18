"""``tsm dryrun COMPONENT [ARGS...]``: print what would be submitted, submit nothing."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from tsm.cli import _exits
from tsm.cli._common import add_cfg_args, parse_cfg

if TYPE_CHECKING:
    from tsm.specs.api import AppDryRunInfo

#: Said under every printed request: the id in it is made up for the dry run (ids are unique per
#: submission, so a later ``tsm run`` of the same component gets a new one).
ID_NOTE = "# the app id above is for this dry run only: `tsm run` assigns a new id when it submits"


def add_parser(sub: Any) -> None:
    p = sub.add_parser("dryrun", help="print the scheduler request for a component without submitting it")
    add_cfg_args(p)
    p.add_argument("component", help="component name, e.g. utils.echo or ./my.py:train")
    p.add_argument("component_args", nargs=argparse.REMAINDER, help="the component's arguments")
    p.set_defaults(func=run)


def request_text(info: AppDryRunInfo) -> str:
    """The dry-run output of ``tsm dryrun`` and ``tsm run --dryrun``: header, request, app-id note."""
    return f"=== scheduler request ({info.scheduler}) ===\n{info}\n{ID_NOTE}\n"


def run(args: argparse.Namespace) -> int:
    from tsm.cli.cmd_run import component_help, explain_misplaced_flags
    from tsm.components import wants_help
    from tsm.runner.api import get_runner

    if wants_help(args.component_args):
        return component_help(args.component, command="dryrun")
    cfg = parse_cfg(args.cfg)
    with get_runner(args.session) as runner, explain_misplaced_flags("dryrun", args.component, args.component_args):
        runner.check_cfg(args.scheduler, cfg)  # -c names options of one scheduler: a typo is an error here
        info = runner.dryrun_component(args.component, args.component_args, args.scheduler, cfg)
    sys.stdout.write(request_text(info))
    return _exits.OK
