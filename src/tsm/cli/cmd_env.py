"""``tsm env list | show KEY | rm KEY... | gc --older-than AGE``: the lockfile environments built here.

The local scheduler's cache, ``$TSM_HOME/envs`` (see :mod:`tsm.env`). ``list`` shows each ready environment
(key, Python, kind of lock, size, last use, lock file), most recently used first; ``show`` one environment's
record and its builds (``--json`` for scripts); ``rm`` removes environments by key or unique key prefix;
``gc --older-than 7d`` removes those not used for that long (``--dry-run`` only names them), and what builds
that died left behind. An environment
a running app uses is kept unless ``--force``. An unknown key is a usage error (exit 2).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from tsm.cli import _exits


def add_parser(sub: Any) -> None:
    p = sub.add_parser("env", help="list, show and remove the lockfile environments built here",
                       description="Lockfile environments built for apps on this machine ($TSM_HOME/envs).")
    cmds = p.add_subparsers(dest="env_command", metavar="{list,show,rm,gc}")
    cmds.required = True
    ls = cmds.add_parser("list", help="ready environments, most recently used first")
    ls.add_argument("--json", action="store_true", help="print JSON instead of a table")
    ls.set_defaults(func=run_list)
    show = cmds.add_parser("show", help="an environment's record and builds")
    show.add_argument("key", help="key (or a unique prefix of it)")
    show.add_argument("--json", action="store_true", help="print JSON instead of text")
    show.set_defaults(func=run_show)
    rm = cmds.add_parser("rm", help="remove environments")
    rm.add_argument("keys", nargs="+", metavar="KEY", help="keys (or unique prefixes)")
    rm.add_argument("--force", action="store_true", help="remove even an environment a running app uses")
    rm.set_defaults(func=run_rm)
    gc = cmds.add_parser("gc", help="remove environments not used for a while")
    gc.add_argument("--older-than", required=True, metavar="AGE", help="e.g. 7d, 12h, 90m")
    gc.add_argument("--dry-run", action="store_true", help="name them, remove nothing")
    gc.set_defaults(func=run_gc)
    p.set_defaults(func=lambda args: (p.print_usage(sys.stderr), _exits.USAGE)[1])


def _cache() -> Any:
    from tsm.schedulers.local.envs import cache

    return cache()


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n //= 1024
    return f"{n} B"


def _ago(t: float) -> str:
    from tsm.schedulers.common.durations import format_duration

    return format_duration(max(0, int(time.time() - t))) + " ago"


def run_list(args: argparse.Namespace) -> int:
    from tsm.env.manage import entries

    rows = entries(_cache())
    if args.json:
        out = [{"key": e.key, "size": e.size, "last_used": e.last_used, **e.info} for e in rows]
        sys.stdout.write(json.dumps(out, indent=2) + "\n")
        return _exits.OK
    table = [("KEY", "PYTHON", "KIND", "SIZE", "LAST USED", "LOCK")]
    table += [(e.key, str(e.info.get("python_version") or e.info.get("python")), str(e.info.get("kind")),
               _size(e.size), _ago(e.last_used), _p(e.info.get("lock"))) for e in rows]
    widths = [max(len(r[i]) for r in table) for i in range(5)]
    for r in table:
        sys.stdout.write("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)) + "  " + r[5] + "\n")
    return _exits.OK


def _find(prefix: str) -> Any:
    from tsm.env.manage import find
    from tsm.errors import UsageError

    try:
        return find(_cache(), prefix)
    except LookupError as e:
        raise UsageError(str(e)) from None


def run_show(args: argparse.Namespace) -> int:
    entry = _find(args.key)
    builds = [b for b in _cache().builds() if b.get("key") == entry.key]
    if args.json:
        out = {"key": entry.key, "path": str(_cache().path(entry.key)), "size": entry.size,
               "last_used": entry.last_used, **entry.info, "builds": builds}
        sys.stdout.write(json.dumps(out, indent=2) + "\n")
        return _exits.OK
    info = entry.info
    lines = [f"key:        {entry.key}", f"path:       {_p(_cache().path(entry.key))}",
             f"lock:       {_p(info.get('lock'))} ({info.get('kind')})",
             f"python:     {info.get('python_version') or info.get('python')}", f"platform:   {info.get('platform')}",
             f"index:      {_p(info.get('index_url') or ('none: offline' if info.get('find_links') else 'uv default'))}",
             f"find-links: {_p(', '.join(info.get('find_links') or []) or '-')}",
             f"size:       {_size(entry.size)}", f"last used:  {_ago(entry.last_used)}",
             f"builds:     {len(builds)} ({', '.join(_build_text(b) for b in builds)})"]
    sys.stdout.write("\n".join(lines) + "\n")
    return _exits.OK


def _build_text(build: dict[str, Any]) -> str:
    return f"{build.get('seconds', 0):.1f}s" + ("" if build.get("ok") else " failed")


def _remove(keys: list[str], force: bool) -> list[str]:
    from tsm.env.manage import in_use, remove
    from tsm.schedulers.local.envs import running_app_dirs

    busy = set() if force else in_use(running_app_dirs())
    kept = [k for k in keys if k in busy]
    for key in kept:
        sys.stderr.write(f"tsm: kept {key}: a running app uses it (--force removes it anyway)\n")
    for key in keys:
        if key not in busy and remove(_cache(), key):
            sys.stdout.write(f"removed {key}\n")
    return kept


def run_rm(args: argparse.Namespace) -> int:
    keys = [_find(k).key for k in args.keys]
    return _exits.FAILED if _remove(keys, args.force) else _exits.OK


def run_gc(args: argparse.Namespace) -> int:
    from tsm.env.manage import older_than
    from tsm.errors import InvalidRunOptionError, UsageError
    from tsm.schedulers.common.durations import parse_duration

    try:
        seconds = parse_duration(args.older_than, "--older-than")
    except InvalidRunOptionError as e:
        raise UsageError(str(e)) from None
    old = [e.key for e in older_than(_cache(), seconds)]
    if args.dry_run:
        sys.stdout.write("".join(f"would remove {k}\n" for k in old))
        return _exits.OK
    from tsm.env.manage import stale_builds

    for name in stale_builds(_cache()):
        sys.stdout.write(f"removed the remains of a build that died: {_p(name)}\n")
    _remove(old, force=False)
    return _exits.OK


def _p(text: object) -> str:
    """``text`` as a terminal should show it: control characters written as escapes."""
    s = text if isinstance(text, str) else str(text)
    return s if s.isprintable() else "".join(c if c.isprintable() else repr(c)[1:-1] for c in s)
