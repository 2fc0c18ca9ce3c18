"""``tsm tracker list | show RUN | lineage RUN``: what jobs recorded through the built-in ``tsm`` tracker.

Reads the store the ``tsm`` tracker writes (``$TSM_HOME``, or the file ``$TSM_TRACKER_TSM_CONFIG``
names). ``list`` shows recorded runs newest first with counts; ``show`` a run's metadata, artifacts,
sources and children (``--json`` for scripts); ``lineage`` its ancestors and descendants as a tree.
A run id nothing was recorded for is a usage error (exit 2), like an unknown app handle.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from tsm.cli import _exits


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "tracker", help="show what jobs recorded (metadata, artifacts, lineage)",
        description="Runs recorded by the built-in tsm tracker (AppRun.run_from_env() in a job).",
    )
    cmds = p.add_subparsers(dest="tracker_command", metavar="{list,show,lineage}")
    cmds.required = True
    ls = cmds.add_parser("list", help="recorded runs, newest first")
    ls.add_argument("--limit", type=int, default=200, metavar="N", help="show the N newest runs (default 200)")
    ls.set_defaults(func=run_list)
    show = cmds.add_parser("show", help="a run's metadata, artifacts, sources and children")
    show.add_argument("run_id", metavar="RUN", help="run id (the app handle, e.g. local://default/app-1234)")
    show.add_argument("--json", action="store_true", help="print JSON instead of text")
    show.set_defaults(func=run_show)
    lin = cmds.add_parser("lineage", help="a run's ancestors and descendants")
    lin.add_argument("run_id", metavar="RUN", help="run id (the app handle)")
    lin.add_argument("--json", action="store_true", help="print JSON instead of a tree")
    lin.set_defaults(func=run_lineage)
    p.set_defaults(func=lambda args: (p.print_usage(sys.stderr), _exits.USAGE)[1])


def _tracker() -> Any:
    from tsm.tracker.api import tracker_config_env_var_name
    from tsm.tracker.store import create

    return create(os.environ.get(tracker_config_env_var_name("tsm")) or os.environ.get(
        tracker_config_env_var_name("tsm", "TORCHX")))


def _when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def _unknown(e: Exception) -> int:
    sys.stderr.write(f"error: {e}\n")
    return _exits.USAGE


def run_list(args: argparse.Namespace) -> int:
    if args.limit < 1:
        sys.stderr.write("error: --limit must be 1 or more\n")
        return _exits.USAGE
    tracker = _tracker()
    try:
        runs = tracker.runs(limit=args.limit)
    finally:
        tracker.close()
    if not runs:
        sys.stdout.write("no tracked runs\n")
        return _exits.OK
    rows = [("RUN", "CREATED", "METADATA", "ARTIFACTS", "SOURCES", "CHILDREN")]
    rows += [
        (r["run_id"], _when(r["created"]), str(r["metadata"]), str(r["artifacts"]), str(r["sources"]), str(r["children"]))
        for r in runs
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    sys.stdout.write("\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows) + "\n")
    return _exits.OK


def run_show(args: argparse.Namespace) -> int:
    from tsm.tracker.api import UnknownRunError

    tracker = _tracker()
    try:
        try:
            tracker.require(args.run_id)
        except UnknownRunError as e:
            return _unknown(e)
        data = {
            "run_id": args.run_id,
            "metadata": dict(tracker.metadata(args.run_id)),
            "artifacts": {n: {"path": a.path, "metadata": a.metadata} for n, a in tracker.artifacts(args.run_id).items()},
            "sources": [{"run_id": s.source_run_id, "artifact_name": s.artifact_name} for s in tracker.sources(args.run_id)],
            "children": list(tracker.children(args.run_id)),
        }
    finally:
        tracker.close()
    if args.json:
        sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
        return _exits.OK
    out = [f"run: {args.run_id}", "metadata:"]
    out += [f"  {k} = {json.dumps(v, default=str)}" for k, v in data["metadata"].items()] or ["  (none)"]
    out.append("artifacts:")
    out += [
        f"  {n}: {a['path']}" + (f"  {json.dumps(a['metadata'], default=str)}" if a["metadata"] else "")
        for n, a in data["artifacts"].items()
    ] or ["  (none)"]
    out.append("sources:")
    out += [f"  {s['run_id']}" + (f" ({s['artifact_name']})" if s["artifact_name"] else "") for s in data["sources"]] or ["  (none)"]
    out.append("children:")
    out += [f"  {c}" for c in data["children"]] or ["  (none)"]
    sys.stdout.write("\n".join(out) + "\n")
    return _exits.OK


def _as_dict(node: Any) -> dict[str, Any]:
    return {
        "run_id": node.run_id, "artifact_name": node.artifact_name,
        "parents": [_as_dict(p) for p in node.parents], "children": [_as_dict(c) for c in node.children],
    }


def run_lineage(args: argparse.Namespace) -> int:
    from tsm.tracker.api import UnknownRunError

    tracker = _tracker()
    try:
        try:
            tracker.require(args.run_id)
        except UnknownRunError as e:
            return _unknown(e)
        lineage = tracker.lineage(args.run_id)
    finally:
        tracker.close()
    if args.json:
        sys.stdout.write(json.dumps(_as_dict(lineage), indent=2) + "\n")
        return _exits.OK
    lines: list[str] = []

    def label(node: Any) -> str:
        return f"{node.run_id}" + (f" ({node.artifact_name})" if node.artifact_name else "")

    def walk_up(nodes: list[Any], depth: int) -> None:
        for n in nodes:  # ancestors: farthest first, so the tree reads top-down
            walk_up(n.parents, depth + 1)
            lines.append(f"{'  ' * depth}^ {label(n)}")

    def walk_down(nodes: list[Any], depth: int) -> None:
        for n in nodes:
            lines.append(f"{'  ' * depth}└─ {label(n)}")
            walk_down(n.children, depth + 1)

    if lineage.parents:
        lines.append("parents (nearest last):")
        walk_up(lineage.parents, 1)
    lines.append(f"* {lineage.run_id}")
    walk_down(lineage.children, 1)
    sys.stdout.write("\n".join(lines) + "\n")
    return _exits.OK
