"""``tsm``: the command line. Parses, calls the runner, prints; nothing else.

Each subcommand is a module here with ``add_parser(subparsers)`` and ``run(args) -> int``; the modules
import the runner and backends only inside ``run`` so ``tsm --help`` stays fast. Every tsm error is
printed as one line on stderr (``--debug`` shows the traceback); usage errors exit 2, failures 1.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import NoReturn

SUBCOMMANDS = [
    "run", "dryrun", "status", "describe", "log", "list", "cancel", "wait", "rm",
    "builtins", "runopts", "lint",
]


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line on stderr and exit code 2."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message} (see {self.prog} --help)\n")
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    """The full parser: global flags plus one subparser per subcommand module."""
    from tsm import __version__

    parser = _Parser(prog="tsm", description="Training Session Manager: launch, watch, log and stop apps on any scheduler.")
    parser.add_argument("--version", action="version", version=f"tsm {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    parser.add_argument("--session", default="default", help="session name used in new app handles (default: default)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in SUBCOMMANDS:
        importlib.import_module(f"tsm.cli.cmd_{name}").add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit code (the console script exits with it)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 2
    debug = args.debug or os.environ.get("TSM_DEBUG") == "1"
    from tsm.errors import ComponentArgumentError, TsmError

    try:
        return int(args.func(args))
    except ComponentArgumentError as e:
        if e.usage:
            sys.stderr.write(e.usage.rstrip("\n") + "\n")
        sys.stderr.write(f"error: {e}\n")
        if debug:
            raise
        return 2
    except TsmError as e:
        sys.stderr.write(f"error: {e}\n")
        if debug:
            raise
        return 1
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        return 130
    except BrokenPipeError:
        # The reader of our output went away (tsm log | head): not an error.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


def entry() -> NoReturn:
    """Console-script wrapper."""
    sys.exit(main())


if __name__ == "__main__":
    entry()
