"""TorchX's ``torchx runopts [SCHEDULER]`` and ``torchx configure [-s a,b] [--print] [-a]``."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from tsm.compat.torchx.cli.cmd_base import SubCommand


def usage(opts: Any) -> str:
    """Run options as TorchX's ``torchx runopts`` prints them: a ``usage:`` line of ``key=KEY`` (``[...]`` when
    optional), then the required and the optional ones, each with its type, default and help."""
    from tsm.specs.runopts import get_type_name

    items = list(opts)
    required = [(k, o) for k, o in items if o.is_required]
    optional = [(k, o) for k, o in items if not o.is_required]
    words = [f"{k}={k.upper()}" if o.is_required else f"[{k}={k.upper()}]" for k, o in required + optional]
    out = "    usage:\n        " + ",".join(words)
    for section, group in (("required", required), ("optional", optional)):
        if group:
            out += f"\n\n    {section} arguments:"
        for k, o in group:
            default = "" if o.is_required else f", {o.default}"
            out += f"\n        {k}={k.upper()} ({get_type_name(o.opt_type)}{default})\n            {o.help}"
    return out


class CmdRunopts(SubCommand):
    """``torchx runopts``: each scheduler's run options (a scheduler that cannot be loaded says why)."""

    def add_arguments(self, subparser: argparse.ArgumentParser) -> None:
        subparser.add_argument("scheduler", type=str, nargs="?",
                               help="scheduler to dump the runopts for, dumps for all schedulers if not specified")

    def run(self, args: argparse.Namespace) -> None:
        from tsm.cli.colors import ENDC, GREEN
        from tsm.compat.torchx.cli._runner import command_runner

        with command_runner() as runner:
            for scheduler in runner.scheduler_backends():
                if args.scheduler and scheduler != args.scheduler:
                    continue
                try:
                    opts = runner.scheduler_run_opts(scheduler)
                except ImportError as e:
                    print(f"{GREEN}{scheduler}{ENDC}: {e}\n")
                    continue
                print(f"{GREEN}{scheduler}{ENDC}:\n{usage(opts)}\n")


class CmdConfigure(SubCommand):
    """``torchx configure``: write (or ``--print``) a ``.torchxconfig`` of the schedulers' run options."""

    def add_arguments(self, subparser: argparse.ArgumentParser) -> None:
        subparser.add_argument("-s", "--schedulers", type=str,
                               help="comma delimited list of schedulers to dump runopts for, if not specified, "
                               "dumps for all schedulers")
        subparser.add_argument("--print", action="store_true",
                               help="if specified, prints the config file to stdout instead of saving it to a file")
        subparser.add_argument("-a", "--all", action="store_true",
                               help="if specified, includes required and optional runopts (default only dumps "
                               "required)")

    def run(self, args: argparse.Namespace) -> None:
        from tsm.compat.torchx.cli._runner import scheduler_factories
        from tsm.runner.config import dump

        schedulers = args.schedulers.split(",") if args.schedulers else list(scheduler_factories())
        if args.print:
            dump(f=sys.stdout, schedulers=schedulers, required_only=not args.all)
            return
        with open(".torchxconfig", "w", encoding="utf-8") as f:
            dump(f=f, schedulers=schedulers, required_only=not args.all)
