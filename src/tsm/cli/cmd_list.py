"""``tsm list [-s SCHEDULER]``: recent apps launched through tsm (any scheduler), or one scheduler's apps."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any


def add_parser(sub: Any) -> None:
    p = sub.add_parser("list", help="list apps with their live state")
    p.add_argument("-s", "--scheduler", help="list this scheduler's apps instead of tsm's recent history")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tsm.runner.api import get_runner

    with get_runner(args.session) as runner:
        apps = runner.list(args.scheduler)
    if not apps:
        sys.stdout.write("no apps\n")
        return 0
    rows = [("HANDLE", "STATE", "NAME", "CREATED")]
    for a in apps:
        created = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(a.created)) if a.created else "-"
        rows.append((a.app_handle or a.app_id, a.state.name, a.name or "-", created))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    sys.stdout.write("\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths + [0], strict=True)).rstrip() for r in rows) + "\n")
    return 0
