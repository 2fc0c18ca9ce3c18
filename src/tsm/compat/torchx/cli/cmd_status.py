"""TorchX's ``torchx status``, ``describe``, ``list`` and ``cancel``, on the command's runner.

``torchx status HANDLE [--roles a,b] [--json]`` prints TorchX's ``AppStatus.format()`` layout, or with
``--json`` (TorchX's nightly) one JSON object with TorchX's keys (:func:`status_json`). ``status`` and
``describe`` of an app its scheduler does not know say TorchX's "does not exist" line and exit 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import json
import logging
import pprint
import sys
from typing import Any, NoReturn

from tsm.compat.torchx.cli.cmd_base import SubCommand

logger = logging.getLogger(__name__)

HANDLE_HEADER = "APP HANDLE"
STATUS_HEADER = "APP STATUS"


def parse_list_arg(arg: str) -> list[str] | None:
    """``"a,b"`` -> ``["a", "b"]``; empty -> None (every role)."""
    return arg.split(",") if arg else None


def _plain(value: Any) -> Any:
    """``value`` ready for ``json.dumps``: an enum as its value (TorchX writes a replica's state as its number)."""
    return value.value if isinstance(value, enum.Enum) else value


def status_json(status: Any, filter_roles: list[str] | None = None) -> dict[str, Any]:
    """TorchX's ``AppStatus.to_json``: ``state`` (its name), ``num_restarts``, ``roles`` (each ``role`` and its
    ``replicas`` as records: TorchX's fields and tsm's), ``msg``, ``structured_error_msg``, ``url``."""
    roles = [rs for rs in status.roles if not filter_roles or rs.role in filter_roles]
    return {
        "state": str(status.state),
        "num_restarts": status.num_restarts,
        "roles": [{"role": rs.role, "replicas": [{k: _plain(v) for k, v in dataclasses.asdict(r).items()}
                                                 for r in rs.replicas]} for rs in roles],
        "msg": status.msg,
        "structured_error_msg": status.structured_error_msg or "<NONE>",
        "url": status.ui_url,
    }


def _unknown(handle: str) -> NoReturn:
    from tsm.specs.handles import parse_app_handle

    parsed = parse_app_handle(handle)
    logger.error("AppDef: %s, does not exist or has been removed from %s's data plane", parsed.app_id,
                 parsed.scheduler)
    sys.exit(1)


def _add_handle(subparser: argparse.ArgumentParser) -> None:
    subparser.add_argument("app_handle", type=str, help="torchx app handle (e.g. local://session-name/app-id)")


class CmdStatus(SubCommand):
    """``torchx status``."""

    def add_arguments(self, subparser: argparse.ArgumentParser) -> None:
        _add_handle(subparser)
        subparser.add_argument("--roles", type=str, default="", help="comma separated roles to filter")
        subparser.add_argument("--json", action="store_true", help="output the status in JSON format")

    def run(self, args: argparse.Namespace) -> None:
        from tsm.compat.torchx.cli._runner import command_runner

        with command_runner() as runner:
            status = runner.status(args.app_handle)
        if status is None:
            _unknown(args.app_handle)
        roles = parse_list_arg(args.roles)
        print(json.dumps(status_json(status, roles)) if args.json else status.format(roles))


class CmdDescribe(SubCommand):
    """``torchx describe``: the app as a dict, pretty-printed."""

    def add_arguments(self, subparser: argparse.ArgumentParser) -> None:
        _add_handle(subparser)

    def run(self, args: argparse.Namespace) -> None:
        from tsm.compat.torchx.cli._runner import command_runner

        with command_runner() as runner:
            app = runner.describe(args.app_handle)
        if app is None:
            _unknown(args.app_handle)
        pprint.pprint(dataclasses.asdict(app), indent=2, width=80)


class CmdList(SubCommand):
    """``torchx list [-s SCHEDULER]``: the scheduler's apps, TorchX's table."""

    def add_arguments(self, subparser: argparse.ArgumentParser) -> None:
        from tsm.compat.torchx.cli._runner import scheduler_factories

        names = list(scheduler_factories())
        subparser.add_argument("-s", "--scheduler", type=str, default=names[0], choices=names,
                               help=f"Name of the scheduler to use. One of: [{','.join(names)}].")

    def run(self, args: argparse.Namespace) -> None:
        from tsm.compat.torchx.cli._runner import command_runner, tabulate

        with command_runner() as runner:
            apps = runner.list(args.scheduler)
        print(tabulate([[a.app_handle, str(a.state)] for a in apps], headers=[HANDLE_HEADER, STATUS_HEADER]))


class CmdCancel(SubCommand):
    """``torchx cancel HANDLE``: a no-op for an app that ended or is unknown, as in TorchX."""

    def add_arguments(self, subparser: argparse.ArgumentParser) -> None:
        _add_handle(subparser)

    def run(self, args: argparse.Namespace) -> None:
        from tsm.compat.torchx.cli._runner import command_runner

        with command_runner() as runner:
            runner.cancel(args.app_handle)
