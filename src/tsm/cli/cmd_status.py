"""``tsm status HANDLE [--json]``: the app's state, restarts, message and every replica."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def add_parser(sub: Any) -> None:
    p = sub.add_parser("status", help="show an app's status")
    p.add_argument("handle", help="app handle, e.g. local://default/echo-1a2b3c4d")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tsm.runner.api import get_runner

    with get_runner(args.session) as runner:
        status = runner.status(args.handle)
    if args.json:
        sys.stdout.write(json.dumps({"handle": args.handle, **status.to_dict()}, indent=2) + "\n")
    else:
        sys.stdout.write(f"{args.handle}\n{status.format()}\n")
    return 0
