"""``tsm exec HANDLE/ROLE/K [-i] [-t] -- CMD ...``: run a command where a live replica runs.

The command runs in the replica's place (its host, container or pod), in its working directory, with its
environment (``TSM_REPLICA_ID`` and the other ``TSM_*`` variables included), as its user. The words after
``--`` reach it verbatim: no shell, unless the command is one (``-- sh -c '...'``). ``-t`` gives it a terminal
of its own (``-it`` with no command: an interactive ``sh``); ``-i`` passes stdin. ``tsm exec`` exits with the
command's exit code; its own errors are one line and the table's codes (2: unknown app, role or replica; 4:
the replica is not running).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any


def add_parser(sub: Any) -> None:
    p = sub.add_parser("exec", help="run a command inside a live replica",
                       description="Run CMD in replica HANDLE/ROLE/K's place: its host, container or pod, its working "
                       "directory and environment. Exits with CMD's exit code.")
    p.add_argument("-i", "--stdin", action="store_true", help="pass stdin to the command")
    p.add_argument("-t", "--tty", action="store_true",
                   help="give the command a terminal of its own (-it without CMD: an interactive sh)")
    p.add_argument("target", metavar="HANDLE/ROLE/K", help="scheduler://session/app_id/role/replica (role/replica "
                   "may be left out for an app of one replica)")
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD ...", help="the command and its arguments, verbatim")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tsm.cli._common import UsageError, split_handle_path
    from tsm.runner.api import get_runner

    handle, role, k = split_handle_path(args.target)
    cmd = list(args.cmd)
    if not cmd:
        if not args.tty:
            raise UsageError("give the command to run after --: tsm exec HANDLE/ROLE/K -- CMD ... (or -it for a shell)")
        cmd = ["sh"]
    sys.stdout.flush()
    with get_runner(args.session) as runner:
        return runner.exec_replica(handle, role, k, cmd, tty=args.tty, stdin=args.stdin or args.tty)
