"""``tsm serve``: the web dashboard of every app (tables, live updates, logs, usage charts, cancel).

Bound to 127.0.0.1 by default. Bound anywhere else it requires a token: ``--token`` (or
``$TSM_SERVE_TOKEN``), else one is made up and printed in the URL. A token set on a loopback address is
required too. The first line on stdout is the URL to open (with the port chosen when ``--port 0``).
Needs the ``web`` extra (``pip install 'tsm[web]'``); the API is described in :mod:`tsm.views.web.app`.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import secrets
import socket
import sys
from typing import Any

from tsm.cli import _exits


def add_parser(sub: Any) -> None:
    p = sub.add_parser("serve", help="web dashboard of apps (live tables, logs, usage charts, cancel)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8765, help="port (default 8765; 0 picks a free one)")
    p.add_argument("--token", default=None,
                   help="access token required on every request (default $TSM_SERVE_TOKEN; made up when "
                        "--host is not a loopback address)")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes (default 1)")
    p.add_argument("--sample-interval", type=float, default=5.0,
                   help="seconds between usage samples kept for the charts (default 5)")
    p.set_defaults(func=run)


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def run(args: argparse.Namespace) -> int:
    from tsm.errors import TsmError, UsageError

    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port must be 0..65535, not {args.port}")
    for flag, value in (("--interval", args.interval), ("--sample-interval", args.sample_interval)):
        if not 0.05 <= value <= 3600:
            raise UsageError(f"{flag} must be between 0.05 and 3600 seconds, not {value}")
    try:
        import uvicorn

        from tsm.views.web.app import create_app
    except ImportError as e:
        raise TsmError(f"tsm serve needs the web extra ({e.name} is missing): pip install 'tsm[web]'") from e
    token = args.token if args.token is not None else os.environ.get("TSM_SERVE_TOKEN") or None
    if token is None and not _loopback(args.host):
        token = secrets.token_urlsafe(24)
    try:
        infos = socket.getaddrinfo(args.host, args.port, type=socket.SOCK_STREAM)
        family, _, _, _, addr = infos[0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(128)
    except OSError as e:
        raise TsmError(f"cannot listen on {args.host}:{args.port}: {e.strerror or e}") from e
    port = sock.getsockname()[1]
    shown = f"[{args.host}]" if ":" in args.host else args.host
    sys.stdout.write(f"tsm serve: http://{shown}:{port}/" + (f"?token={token}" if token else "") + "\n")
    sys.stdout.flush()
    app = create_app(token=token, interval=args.interval, sample_interval=args.sample_interval)
    config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=2, access_log=False)
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        sock.close()
    return _exits.OK
