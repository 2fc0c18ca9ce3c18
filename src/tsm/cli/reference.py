"""The command-line reference and each scheduler's run-option table as Markdown, made from the code itself
(``make docs`` renders them).

Nothing here is written by hand: each subcommand's usage, arguments and help come from the same parser the
``tsm`` command runs (:func:`tsm.cli._parser.build_parser`), and a scheduler's options from the same
declaration ``tsm runopts`` prints (``Runner.scheduler_run_opts``), so neither can drift from the code.
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
    from tsm.cli._names import SUBCOMMANDS
    from tsm.cli._parser import _subparser, build_parser

    parser = build_parser()
    parts = ["## tsm\n", "```text\n" + _help(parser).rstrip() + "\n```\n"]
    for name in SUBCOMMANDS:
        sub = _subparser(parser, name)
        if sub is None:
            continue
        parts += [f"## tsm {name}\n", "```text\n" + _help(sub).rstrip() + "\n```\n"]
    return "\n".join(parts)


def run_options(scheduler: str) -> str:
    """The run options ``scheduler`` takes (``-c name=value``, a ``[scheduler.NAME]`` table of ``tsm.toml``) as a
    Markdown table: name, type, default and help, in the order the scheduler declares them."""
    from tsm.runner.api import Runner
    from tsm.specs.runopts import type_name

    with Runner("docs") as runner:
        opts = runner.scheduler_run_opts(scheduler)
    rows = ["| option | type | default | what it does |", "|---|---|---|---|"]
    for name, opt in opts:
        default = "required" if opt.required else f"`{opt.default!r}`"
        text = opt.help.replace("|", "\\|").replace("\n", " ")
        rows.append(f"| `{name}` | `{type_name(opt.type_)}` | {default} | {text} |")
    return "\n".join(rows) + "\n"
