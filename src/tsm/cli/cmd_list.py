"""``tsm list [-s SCHEDULER] [--limit N | --all]``: recent apps launched through tsm, or one scheduler's apps.

The list is capped (newest first, 200 by default) so a long history stays quick to show; when the cap cut
it short, one line on stderr says so and how to see more, so no app is silently left out. A sweep is one
line, where its own time puts it among the apps.
"""

from __future__ import annotations

import sys
import time

from tsm.cli import _exits
from tsm.errors import brief

TYPE_CHECKING = False  # argparse and typing are for type checkers only: `tsm list` need not import them
if TYPE_CHECKING:
    import argparse
    from typing import Any

DEFAULT_LIMIT = 200


def count(text: str) -> int:
    """``--limit`` value: a whole number >= 1."""
    import argparse

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{brief(text, 60)} is not a whole number (e.g. 50)") from None
    if value < 1 or value > 10**9:
        raise argparse.ArgumentTypeError(f"{brief(text, 60)}: give a number from 1 to 1000000000, or --all")
    return value


def add_parser(sub: Any) -> None:
    p = sub.add_parser("list", help="list apps with their live state")
    p.add_argument("-s", "--scheduler", help="list this scheduler's apps instead of tsm's recent history")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--limit", type=count, default=DEFAULT_LIMIT, metavar="N",
                       help=f"show the N newest apps (default {DEFAULT_LIMIT})")
    group.add_argument("--all", action="store_true", help="show every app")
    p.set_defaults(func=run)


def launched_handles(runner: Any, scheduler: str, apps: list[Any]) -> list[Any]:
    """``apps`` (one scheduler's list) with each handle spelt as the app was launched.

    A scheduler with an alias (``local`` and ``local_cwd``) lists every app under the name it was asked by,
    while ``tsm list`` shows the handle the app was launched with; an app must have one handle, the same in
    both lists, so a handle the history knows under another alias of the same scheduler is shown as that.
    """
    aliases = _aliases(scheduler)
    if not aliases:
        return apps
    known = {r.handle for r in runner.history.recent(None)}
    for a in apps:
        scheme, sep, rest = (a.app_handle or "").partition("://")
        if not sep or a.app_handle in known:
            continue
        for alias in (scheduler, *aliases):
            if f"{alias}://{rest}" in known:
                a.app_handle = f"{alias}://{rest}"
                break
    return apps


def newest(runner: Any, limit: int | None) -> list[Any]:
    """The ``limit`` newest entries of tsm's history, and one more when there are more (None: all of them).

    A sweep is one entry, its trials folded into it, placed by its own time among the apps whatever they
    are; the history is read further until ``limit`` + 1 entries are known to be the newest.
    """
    from tsm.sweep import fold_list

    if limit is None:
        return fold_list(runner.list(None, limit=None))
    fetch = limit + 1
    while True:
        rows = runner.list(None, limit=fetch)
        entries = fold_list(rows, complete=len(rows) < fetch)
        if len(rows) < fetch or len(entries) > limit:
            return entries
        fetch *= 4  # trials folded away: read further back


def run(args: argparse.Namespace) -> int:
    from tsm.runner.api import get_runner

    limit = None if args.all else args.limit
    with get_runner(args.session) as runner:
        if args.scheduler:
            apps = launched_handles(runner, args.scheduler, runner.list(args.scheduler))
        else:
            apps = newest(runner, limit)
    capped = limit is not None and len(apps) > limit
    apps = apps[:limit] if limit is not None else apps
    if not apps:
        sys.stdout.write("no apps\n")
        return _exits.OK
    rows = [("HANDLE", "STATE", "NAME", "CREATED")]
    for a in apps:
        created = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(a.created)) if a.created else "-"
        rows.append((a.app_handle or a.app_id, a.state.name, a.name or "-", created))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    sys.stdout.write("\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths + [0], strict=True)).rstrip() for r in rows) + "\n")
    if capped:
        sys.stdout.flush()
        sys.stderr.write(f"tsm: showing the newest {limit} apps only; use --limit N or --all to see more\n")
    return _exits.OK


def _aliases(scheduler: str) -> list[str]:
    """The other names the scheduler registry gives the backend of ``scheduler`` (none for a plugin)."""
    from tsm.schedulers import aliases_of

    return aliases_of(scheduler)
