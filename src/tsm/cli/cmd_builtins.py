"""``tsm builtins``: every component you can run by name, with its one-line description."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from tsm.cli import _exits


def add_parser(sub: Any) -> None:
    p = sub.add_parser("builtins", help="list the components you can run by name")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tsm.components import list_components
    from tsm.errors import ComponentError

    errors: list[ComponentError] = []
    comps = list_components(errors)
    width = max((len(n) for n in comps), default=0)
    for name, comp in sorted(comps.items()):
        sys.stdout.write(f"{name.ljust(width)}  {comp.description}\n")
    for e in errors:
        sys.stderr.write(f"warning: {e}\n")
    return _exits.OK
