"""``tsm log HANDLE[/ROLE[/K]]``: print (or follow with -f) replica logs, prefixed ``role/k``."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from tsm.cli._common import UsageError, parse_time, replica_targets, split_handle_path, stream_logs


def add_parser(sub: Any) -> None:
    p = sub.add_parser("log", help="print an app's logs", description="Print the logs of every replica, of one "
                       "role (HANDLE/ROLE) or of one replica (HANDLE/ROLE/K).")
    p.add_argument("target", help="scheduler://session/app_id[/role[/replica]]")
    p.add_argument("-f", "--follow", action="store_true",
                   help="follow until the replicas end, across their restarts; a line a replica ends with \\r "
                   "(a progress bar) is shown as it comes, with its \\r")
    p.add_argument("--regex", help="only lines matching this regular expression")
    p.add_argument("--streams", choices=["stdout", "stderr", "combined"], help="which output (default combined)")
    p.add_argument("--since", help="only lines after this time: ISO time or duration ago (5m)")
    p.add_argument("--until", help="only lines before this time: ISO time or duration ago")
    p.add_argument("--attempt", metavar="N",
                   help="only attempt N of each replica (0: its first run, 1: its first restart, ...); default: "
                        "every attempt in order, with a '--- attempt N ---' line on stderr where a restart begins")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import re

    from tsm.runner.api import get_runner
    from tsm.schedulers.api import Stream

    handle, role, k = split_handle_path(args.target)
    if args.regex:
        try:
            re.compile(args.regex)
        except re.error as e:
            raise UsageError(f"--regex {args.regex!r} is not a valid regular expression: {e}") from None
    since, until = parse_time(args.since, "--since"), parse_time(args.until, "--until")
    extra: dict[str, Any] = {}
    if args.attempt is not None:
        if not (args.attempt.isascii() and args.attempt.isdigit()) or len(args.attempt) > 9:
            raise UsageError(f"--attempt {args.attempt!r}: give a whole number >= 0 (0: the first run)")
        extra["attempt"] = int(args.attempt)
    with get_runner(args.session) as runner:
        targets = replica_targets(runner, handle, role, k)
        errors = stream_logs(
            runner, handle, targets, tail=args.follow, prefix=len(targets) > 1 or role is None,
            regex=args.regex, since=since, until=until, streams=Stream(args.streams) if args.streams else None,
            **extra,
        )
    if errors:
        raise errors[0]
    sys.stdout.flush()
    return 0


# -- TorchX's ``torchx.cli.cmd_log`` helpers, which tools built on TorchX import (NeMo-Run's log printer) -------
#: The form :func:`validate` accepts (TorchX's wording, shown in its error).
ID_FORMAT = "SCHEDULER://[SESSION_NAME]/APP_ID/[ROLE_NAME/[REPLICA_IDS,...]]"


def validate(job_identifier: str) -> None:
    """Exit with status 1 after one error line unless ``job_identifier`` is a handle with an optional role/replicas.

    TorchX's behaviour (tools call it before reading logs and rely on the exit): the check is the form
    ``scheduler://[session]/app_id[/role[/0,1,...]]``, not whether the app exists.
    """
    import logging
    import re

    if not re.match(r"^\w+://[^/]*/[^/]+(/[^/]+(/(\d+,?)+)?)?$", job_identifier):
        logging.getLogger(__name__).error("%s is not of the form %s", job_identifier, ID_FORMAT)
        sys.exit(1)


def find_role_replicas(app: Any, role_name: str | None) -> list[tuple[str, int]]:
    """Every ``(role name, replica index)`` of ``app`` (an AppDef), of ``role_name`` only when given."""
    return [(r.name, i) for r in app.roles if role_name is None or r.name == role_name for i in range(r.num_replicas)]


def _prefix_line(prefix: str, line: str) -> str:
    """``line`` with ``prefix`` at its start and after every ``\\r`` and inner ``\\n``, so progress bars keep it."""
    if "\r" in line:
        line = line.replace("\r", "\r" + prefix)
    if "\n" in line[:-1]:
        line = line[:-1].replace("\n", "\n" + prefix) + line[-1:]
    return line if line.startswith("\r") else prefix + line
