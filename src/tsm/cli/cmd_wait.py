"""``tsm wait HANDLE [--timeout S]``: block until the app ends; exit 0 when it SUCCEEDED."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def add_parser(sub: Any) -> None:
    p = sub.add_parser("wait", help="wait for an app to end (exit 0 if it succeeded)")
    p.add_argument("handle", help="app handle")
    p.add_argument("--timeout", type=float, help="give up after this many seconds (exit 3)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tsm.runner.api import get_runner
    from tsm.specs.api import AppState

    with get_runner(args.session) as runner:
        status = runner.wait(args.handle, timeout=args.timeout)
    sys.stdout.write(f"{args.handle}\n{status.format()}\n")
    if not status.state.is_terminal:
        return 3
    return 0 if status.state == AppState.SUCCEEDED else 1
