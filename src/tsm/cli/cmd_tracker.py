"""``tsm tracker list | show RUN | lineage RUN``: what jobs recorded through the built-in ``tsm`` tracker.

Reads the store the ``tsm`` tracker writes (``$TSM_HOME``, or the file ``$TSM_TRACKER_TSM_CONFIG``
names). ``list`` shows recorded runs newest first with counts; ``show`` a run's metadata, artifacts,
sources and children (``--json`` for scripts); ``lineage`` its ancestors and descendants, each run
printed once (a run reached again, such as an ancestor shared by two parents, is referenced as
``(shown above)``). A run id nothing was recorded for is a usage error (exit 2), like an unknown app handle.

What jobs recorded is untrusted text: every run id, key, value, artifact name and path printed for people
has its control characters written as escapes (``\x1b``), so none acts on the terminal. ``--json`` is
strict JSON: a float that JSON cannot hold (NaN, infinities) is written as the string ``"NaN"``,
``"Infinity"`` or ``"-Infinity"``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from tsm.cli import _exits
from tsm.util.text import escaped


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


def _p(text: object) -> str:
    """``text`` as a terminal should show it: control characters (escapes, CR, newlines) written as escapes."""
    return escaped(text if isinstance(text, str) else str(text))


def _strict(value: Any) -> Any:
    """``value`` with every float JSON cannot hold replaced by its name, walked without recursion."""
    top: list[Any] = [value]
    stack: list[tuple[Any, Any]] = [(top, 0)]
    while stack:
        box, key = stack.pop()
        v = box[key]
        if isinstance(v, float) and (v != v or v in (float("inf"), float("-inf"))):
            box[key] = "NaN" if v != v else ("Infinity" if v > 0 else "-Infinity")
        elif isinstance(v, dict):
            box[key] = v = dict(v)
            stack.extend((v, k) for k in v)
        elif isinstance(v, (list, tuple)):
            box[key] = v = list(v)
            stack.extend((v, i) for i in range(len(v)))
    return top[0]


def _dumps(value: Any) -> str:
    return json.dumps(_strict(value), indent=2, default=str, allow_nan=False)


def _when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def _unknown(e: Exception) -> int:
    sys.stderr.write(f"error: {_p(e)}\n")
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
        (_p(r["run_id"]), _when(r["created"]), str(r["metadata"]), str(r["artifacts"]), str(r["sources"]), str(r["children"]))
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
        sys.stdout.write(_dumps(data) + "\n")
        return _exits.OK
    out = [f"run: {_p(args.run_id)}", "metadata:"]
    out += [f"  {_p(k)} = {_p(json.dumps(v, default=str))}" for k, v in data["metadata"].items()] or ["  (none)"]
    out.append("artifacts:")
    out += [
        f"  {_p(n)}: {_p(a['path'])}" + (f"  {_p(json.dumps(a['metadata'], default=str))}" if a["metadata"] else "")
        for n, a in data["artifacts"].items()
    ] or ["  (none)"]
    out.append("sources:")
    out += [f"  {_p(s['run_id'])}" + (f" ({_p(s['artifact_name'])})" if s["artifact_name"] else "")
            for s in data["sources"]] or ["  (none)"]
    out.append("children:")
    out += [f"  {_p(c)}" for c in data["children"]] or ["  (none)"]
    sys.stdout.write("\n".join(out) + "\n")
    return _exits.OK


def _as_dict(root: Any) -> dict[str, Any]:
    """The lineage as nested JSON, each run's subtree given once; a run met again is ``{"run_id", "ref": true}``.

    Built without recursion (the lineage may be :data:`~tsm.tracker.store.MAX_DEPTH` levels deep each way).
    """
    def fresh(node: Any) -> dict[str, Any]:
        return {"run_id": node.run_id, "artifact_name": node.artifact_name, "parents": [], "children": []}

    out = fresh(root)
    for key in ("parents", "children"):
        seen = {id(root)}
        stack = [(root, out)]
        while stack:
            node, d = stack.pop()
            for other in getattr(node, key):
                if id(other) in seen:
                    d[key].append({"run_id": other.run_id, "artifact_name": other.artifact_name, "ref": True})
                    continue
                seen.add(id(other))
                od = fresh(other)
                d[key].append(od)
                stack.append((other, od))
    return out


def _lineage_lines(lineage: Any) -> list[str]:
    """The lineage as text, each run printed once: ancestors farthest first, then the run, then descendants.

    A run reached again (a shared ancestor, a diamond) is one line ``... (shown above)`` and is not
    expanded again, so the output grows with the runs and edges, never with the number of paths.
    """
    def label(node: Any) -> str:
        return _p(node.run_id) + (f" ({_p(node.artifact_name)})" if node.artifact_name else "")

    lines: list[str] = []
    if lineage.parents:
        lines.append("parents (nearest last):")
        shown = {id(lineage)}
        # iterative post-order: a node's ancestors print before it
        stack: list[tuple[Any, int, bool]] = [(p, 1, False) for p in reversed(lineage.parents)]
        while stack:
            node, depth, expanded = stack.pop()
            if expanded:
                lines.append(f"{'  ' * depth}^ {label(node)}")
            elif id(node) in shown:
                lines.append(f"{'  ' * depth}^ {label(node)} (shown above)")
            else:
                shown.add(id(node))
                stack.append((node, depth, True))
                stack.extend((p, depth + 1, False) for p in reversed(node.parents))
    lines.append(f"* {label(lineage)}")
    shown = {id(lineage)}
    down: list[tuple[Any, int]] = [(c, 1) for c in reversed(lineage.children)]
    while down:
        node, depth = down.pop()
        if id(node) in shown:
            lines.append(f"{'  ' * depth}└─ {label(node)} (shown above)")
            continue
        shown.add(id(node))
        lines.append(f"{'  ' * depth}└─ {label(node)}")
        down.extend((c, depth + 1) for c in reversed(node.children))
    return lines


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
        sys.stdout.write(_dumps(_as_dict(lineage)) + "\n")
        return _exits.OK
    sys.stdout.write("\n".join(_lineage_lines(lineage)) + "\n")
    return _exits.OK
