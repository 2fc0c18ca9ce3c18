"""``tsm serve``: the web dashboard of every app (tables, live updates, logs, usage charts, cancel).

Bound to 127.0.0.1 by default. Every request needs a token, on loopback too (a login node has many
users, and loopback is theirs as well): ``$TSM_SERVE_TOKEN`` or ``--token`` (which other users can read in
the process list: prefer the variable), else one is made up and printed in the URL. Requests must also
name the server as it was bound in their ``Host`` header (DNS rebinding); ``--allow-host NAME`` adds a
name (a proxy's). The first line on stdout is the URL to open (with the port chosen when ``--port 0``);
it is printed once the store is open, so a store that cannot be opened (locked, unwritable) is one
error line and exit status 1, not a URL and a traceback.
Needs the ``web`` extra (``pip install 'tsm[web]'``); the API is described in :mod:`tsm.views.web.app`.
"""

from __future__ import annotations

import argparse
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
                   help="access token required on every request (default $TSM_SERVE_TOKEN, else one is made up "
                        "and printed in the URL)")
    p.add_argument("--allow-host", action="append", default=None, metavar="NAME",
                   help="also answer requests whose Host header is NAME (e.g. a proxy's name); repeatable")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes (default 1)")
    p.add_argument("--sample-interval", type=float, default=5.0,
                   help="seconds between usage samples kept for the charts (default 5)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tsm.errors import TsmError, UsageError

    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port must be 0..65535, not {args.port}")
    for flag, value in (("--interval", args.interval), ("--sample-interval", args.sample_interval)):
        if not 0.05 <= value <= 3600:
            raise UsageError(f"{flag} must be between 0.05 and 3600 seconds, not {value}")
    try:
        import uvicorn

        from tsm.views.samples import SampleRecorder
        from tsm.views.snapshot import SnapshotCollector
        from tsm.views.web.app import HostCheck, create_app
    except ImportError as e:
        raise TsmError(f"tsm serve needs the web extra ({e.name} is missing): pip install 'tsm[web]'") from e
    token = args.token or os.environ.get("TSM_SERVE_TOKEN") or secrets.token_urlsafe(24)
    hosts = HostCheck.for_bind(args.host, args.allow_host or ())
    # open the store (and the samples' tables) before printing the URL: a locked or unwritable store is one
    # line on stderr (a StoreError through main), never a URL followed by a traceback from the server task
    collector = SnapshotCollector()
    recorder = SampleRecorder(collector.store, args.sample_interval)
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
    sys.stdout.write(f"tsm serve: http://{shown}:{port}/?token={token}\n")
    sys.stdout.flush()
    app = create_app(token=token, interval=args.interval, sample_interval=args.sample_interval,
                     collector=collector, recorder=recorder, hosts=hosts)
    config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=2, access_log=False)
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        sock.close()
    return _exits.OK
