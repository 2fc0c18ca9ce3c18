"""``tsm describe HANDLE``: the app definition as it was launched, as JSON."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from tsm.cli import _exits


def add_parser(sub: Any) -> None:
    p = sub.add_parser("describe", help="show the definition an app was launched with")
    p.add_argument("handle", help="app handle")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tsm.runner.api import get_runner

    with get_runner(args.session) as runner:
        app = runner.describe(args.handle)
    if app is None:  # a runner that answers "unknown" with None rather than an error
        raise _exits.unknown_app(args.handle)
    sys.stdout.write(json.dumps(app.to_dict(), indent=2) + "\n")
    return _exits.OK
