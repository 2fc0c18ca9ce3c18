"""``tsm port-forward HANDLE/ROLE/K [LOCAL:]REMOTE``: reach a port inside a live replica from this machine.

Listens on 127.0.0.1 only (LOCAL, default: a free port, printed) and relays each connection to port REMOTE
inside the replica (its host, container or pod), until Ctrl-C, which ends it with exit code 0. Connections
from other users of this machine are refused.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any


def add_parser(sub: Any) -> None:
    p = sub.add_parser("port-forward", help="reach a port inside a live replica from 127.0.0.1",
                       description="Relay 127.0.0.1:LOCAL to port REMOTE inside replica HANDLE/ROLE/K until Ctrl-C.")
    p.add_argument("target", metavar="HANDLE/ROLE/K", help="scheduler://session/app_id/role/replica (role/replica "
                   "may be left out for an app of one replica)")
    p.add_argument("ports", metavar="[LOCAL:]REMOTE", help="the replica's port, after the local one (default: a free one)")
    p.set_defaults(func=run)


def parse_ports(text: str) -> tuple[int, int]:
    """``[LOCAL:]REMOTE`` -> ``(local, remote)``; a bad value is a :class:`~tsm.errors.UsageError`."""
    from tsm.errors import UsageError, brief

    local, _, remote = text.rpartition(":")
    try:
        ports = int(local or "0"), int(remote)
    except ValueError:
        ports = (-1, -1)
    if not (0 <= ports[0] <= 65535 and 1 <= ports[1] <= 65535) or not (remote.isascii() and remote.isdigit()):
        raise UsageError(f"ports {brief(text, 40)}: give [LOCAL:]REMOTE, TCP ports (REMOTE 1-65535, LOCAL 0 or omitted: "
                         "a free one)")
    return ports


def run(args: argparse.Namespace) -> int:
    from tsm.cli._common import split_handle_path
    from tsm.runner.api import get_runner

    handle, role, k = split_handle_path(args.target)
    local, remote = parse_ports(args.ports)

    def ready(port: int) -> None:
        sys.stdout.write(f"Forwarding 127.0.0.1:{port} -> {args.target}:{remote} (Ctrl-C to stop)\n")
        sys.stdout.flush()

    with get_runner(args.session) as runner:
        try:
            runner.port_forward(handle, role, k, remote, local, ready=ready)
        except KeyboardInterrupt:
            sys.stderr.write("stopped\n")
    return 0
