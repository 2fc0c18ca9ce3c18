"""``tsm lint FILE[:FUNCTION]``: check component functions against the rules; exit 1 on errors."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from tsm.cli import _exits


def add_parser(sub: Any) -> None:
    p = sub.add_parser("lint", help="check a component file")
    p.add_argument("target", help="path/to/file.py or path/to/file.py:function")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tsm.components import lint

    path, _, fn = args.target.partition(":")
    messages = lint(path, fn or None)
    for m in messages:
        sys.stdout.write(f"{path}:{m.line}: {m.severity}: {m.name}: {m.description}\n")
    if not messages:
        sys.stdout.write(f"{args.target}: ok\n")
    return _exits.FAILED if any(m.severity == "error" for m in messages) else _exits.OK
