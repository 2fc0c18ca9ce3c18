"""TorchX's ``torchx.cli.cmd_log``: ``torchx log [--regex R] [-t] [--streams S] SCHEDULER://[SESSION]/APP[/ROLE[/0,1]]``.

Lines come through tsm's log printer (:func:`tsm.cli._common.stream_logs`, what ``tsm log`` uses), each
prefixed ``role/k `` as TorchX prefixes them. An identifier not of TorchX's form is one error line and exit 1
(:func:`validate`); a role the app does not have lists the roles it has (exit 1); an app its scheduler does
not know is TorchX's "does not exist" line and exit 1 (TorchX's own command waits for it forever).
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
from collections.abc import Callable
from typing import Any, TextIO

from tsm.cli.cmd_log import ID_FORMAT, _prefix_line, find_role_replicas, validate
from tsm.compat.torchx.cli.cmd_base import SubCommand
from tsm.schedulers.api import Stream

__all__ = ["ID_FORMAT", "CmdLog", "_prefix_line", "find_role_replicas", "get_logs", "validate"]

logger = logging.getLogger(__name__)


def _wait_started(runner: Any, handle: str, app_id: str, scheduler: str) -> None:
    """Return once the app has started (RUNNING or ended); exit 1 when its scheduler does not know it."""
    from tsm.specs.api import is_started

    said = False
    stop = threading.Event()
    while True:
        status = runner.status(handle)
        if status is None:
            logger.error("AppDef: %s, does not exist or has been removed from %s's data plane", app_id, scheduler)
            sys.exit(1)
        if is_started(status.state):
            return
        if not said:
            logger.info("Waiting for app state response before fetching logs...")
            said = True
        stop.wait(1)  # TorchX's pace: a pending app is asked again each second until it starts


def _writer(file: TextIO) -> Callable[[str], None]:
    def write(text: str) -> None:
        file.write(text)

    return write


def get_logs(
    file: TextIO,
    identifier: str,
    regex: str | None,
    should_tail: bool = False,
    runner: Any = None,
    streams: Stream | None = None,
) -> None:
    """Print the log lines of the replicas ``identifier`` names (all of the app's when it names none) to ``file``."""
    from tsm.cli._common import stream_logs
    from tsm.compat.torchx.cli._runner import command_runner
    from tsm.specs.handles import make_app_handle

    validate(identifier)
    scheduler, _, path_str = identifier.partition("://")
    path = path_str.split("/")
    app_id = path[1]
    role_name = path[2] if len(path) > 2 else None
    runner = runner if runner is not None else command_runner()
    handle = make_app_handle(scheduler, path[0] or "default", app_id)
    if len(path) == 4:
        targets = [(str(role_name), int(i)) for i in path[3].split(",") if i]
    else:
        _wait_started(runner, handle, app_id, scheduler)
        app = runner.describe(handle)
        targets = find_role_replicas(app, role_name) if app is not None else []
        if not targets:
            roles = app.roles if app is not None else []
            valid = "\n".join(f"  {i}: {scheduler}://{app_id}/{r.name}" for i, r in enumerate(roles))
            logger.error("No role [%s] found for app: %s. Did you mean one of the following:\n%s",
                         role_name, app.name if app is not None else app_id, valid)
            sys.exit(1)
    errors = stream_logs(runner, handle, targets, tail=should_tail, prefix=True, out=_writer(file),
                         regex=regex, streams=streams)
    file.flush()
    for e in errors[1:]:
        logger.error(e)
    if errors:
        raise errors[0]


class CmdLog(SubCommand):
    """``torchx log``."""

    def add_arguments(self, subparser: argparse.ArgumentParser) -> None:
        subparser.add_argument("--regex", type=str, help="regex filter")
        subparser.add_argument("-t", "--tail", action="store_true", help="Tail logs")
        subparser.add_argument("--streams", type=Stream, choices=[s.value for s in Stream], default=None,
                               help="IO streams to use. Default is scheduler specific.")
        subparser.add_argument("identifier", type=str, metavar=ID_FORMAT,
                               help="identifiers for the roles and replicas to log")

    def run(self, args: argparse.Namespace) -> None:
        get_logs(sys.stdout, args.identifier, args.regex, args.tail, streams=args.streams)
