"""``tsm stack HANDLE[/ROLE[/K]] [--native] [--json]``: every Python thread's stack of live replicas.

Every Python process of each replica is dumped with py-spy (``pip install 'tsm[debug]'``; on a cluster it
must be installed where the replicas run), without stopping it for more than a moment. Replicas whose stacks
are the same are printed once, the largest group first, and a group that differs from it is marked
``<-- differs``: with many ranks in one all-reduce, the rank that is elsewhere is the one to look at. A replica
that could not be dumped (py-spy missing, no ptrace permission) gets one line on stderr saying what to change,
and the command then exits 1.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any


def add_parser(sub: Any) -> None:
    p = sub.add_parser("stack", help="every Python thread's stack of live replicas (py-spy)",
                       description="Dump every Python thread of every Python process of the app's replicas (of one "
                       "role, or one replica), grouping replicas whose stacks are the same.")
    p.add_argument("target", metavar="HANDLE[/ROLE[/K]]", help="scheduler://session/app_id[/role[/replica]]")
    p.add_argument("--native", action="store_true", help="include native (C/C++) frames")
    p.add_argument("--json", action="store_true", help="print the dumps and groups as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import json

    from tsm.cli._common import split_handle_path
    from tsm.runner.api import get_runner
    from tsm.runner.stacks import render

    handle, role, k = split_handle_path(args.target)
    with get_runner(args.session) as runner:
        report = runner.replica_stacks(handle, role, k, native=args.native)
    if args.json:
        sys.stdout.write(json.dumps(report.to_json(), indent=2) + "\n")
    else:
        sys.stdout.write(render(report))
    sys.stdout.flush()
    from tsm.cli._names import one_line

    for name, why in report.errors:
        sys.stderr.write(f"error: {name}: {one_line(why)}\n")
    return 1 if report.errors else 0
