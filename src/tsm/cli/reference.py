"""The command-line reference as Markdown, made from the parsers themselves (``make docs`` renders it).

Nothing here is written by hand: each subcommand's usage, arguments and help come from the same
:func:`tsm.cli.main.build_parser` the ``tsm`` command runs, so the reference cannot drift from the code.
"""

from __future__ import annotations

import argparse
import os


def _help(parser: argparse.ArgumentParser) -> str:
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"  # argparse wraps to $COLUMNS: a fixed width makes the page reproducible
    try:
        return parser.format_help()
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old


def markdown() -> str:
    """``tsm --help`` and every subcommand's ``--help``, each under its own heading, as Markdown."""
    from tsm.cli._parser import _subparser, build_parser
    from tsm.cli.main import SUBCOMMANDS

    parser = build_parser()
    parts = ["## tsm\n", "```text\n" + _help(parser).rstrip() + "\n```\n"]
    for name in SUBCOMMANDS:
        sub = _subparser(parser, name)
        if sub is None:
            continue
        parts += [f"## tsm {name}\n", "```text\n" + _help(sub).rstrip() + "\n```\n"]
    return "\n".join(parts)
