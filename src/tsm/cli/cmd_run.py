"""``tsm run COMPONENT [ARGS...]``: launch a component; by default stream its logs and wait for it."""

from __future__ import annotations

import argparse
import sys
import threading
from typing import Any

from tsm.cli._common import add_cfg_args, parse_cfg, replica_targets, stream_logs


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "run", help="launch a component (streams logs and waits unless --detach)",
        description="Launch COMPONENT (builtin like utils.echo, an installed one, or path/file.py:function) "
        "with its own arguments after it. `tsm run COMPONENT --help` shows the component's arguments.",
    )
    add_cfg_args(p)
    p.add_argument("--dryrun", action="store_true", help="print the request instead of submitting it")
    p.add_argument("--detach", action="store_true", help="print the handle and return at once")
    p.add_argument("component", help="component name, e.g. utils.echo or ./my.py:train")
    p.add_argument("component_args", nargs=argparse.REMAINDER, help="the component's arguments")
    p.set_defaults(func=run)


def component_help(name: str) -> int:
    from tsm.components import component_help as render
    from tsm.components import get_component

    sys.stdout.write(render(get_component(name).fn, prog=f"tsm run {name}"))
    return 0


def run(args: argparse.Namespace) -> int:
    from tsm.components import wants_help
    from tsm.runner.api import get_runner

    if wants_help(args.component_args):
        return component_help(args.component)
    cfg = parse_cfg(args.cfg)
    with get_runner(args.session) as runner:
        info = runner.dryrun_component(args.component, args.component_args, args.scheduler, cfg)
        if args.dryrun:
            sys.stdout.write(f"=== scheduler request ({info.scheduler}) ===\n{info}\n")
            return 0
        handle = runner.schedule(info)
        if args.detach:
            sys.stdout.write(handle + "\n")
            return 0
        sys.stderr.write(f"tsm: launched {handle}\n")
        sys.stderr.flush()
        return attach(runner, handle)


def attach(runner: Any, handle: str) -> int:
    """Stream every replica's log until the app ends, then print its status; Ctrl-C cancels it."""
    from tsm.specs.api import AppState

    try:
        targets = replica_targets(runner, handle, None, None)
        done = threading.Event()
        errors: list[BaseException] = []

        def logs() -> None:
            errors.extend(stream_logs(runner, handle, targets, tail=True, prefix=True))
            done.set()

        t = threading.Thread(target=logs, daemon=True)
        t.start()
        status = runner.wait(handle)
        t.join()
    except KeyboardInterrupt:
        sys.stderr.write(f"\ntsm: interrupted; cancelling {handle} ...\n")
        runner.cancel(handle)
        status = runner.status(handle)
        sys.stderr.write(status.format() + "\n")
        return 130
    for e in errors:
        sys.stderr.write(f"tsm: log streaming stopped: {e}\n")
    sys.stdout.flush()
    sys.stderr.write(f"tsm: {handle}\n{status.format()}\n")
    return 0 if status.state == AppState.SUCCEEDED else 1
