"""Reliability figures: runs every test marked ``reliability`` and prints one JSON line per case.

Each case (a fault, a load, a hostile input, a security property) is a real test in ``tests/``; this script
runs them with ``--reliability-report``, prints their outcome and measured figures as JSON lines, and with
``--readme README.md`` rewrites the README's "Reliability" table between its two marker comments, so the
table is always what the suite measured, never typed by hand. Exit status: 1 when any case failed or a
figure missed its limit.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BEGIN = "<!-- reliability:begin (written by make harden) -->"
END = "<!-- reliability:end -->"
GROUPS = ["Faults", "Load", "Hostile input", "Security"]


def run_suite(extra: list[str]) -> list[dict[str, Any]]:
    """Run the marked tests (plus ``extra`` pytest arguments) and return the report's rows."""
    # byte-compile tsm first (as `make harden` does): the suite runs with PYTHONDONTWRITEBYTECODE=1, so a module
    # edited since the last compile would otherwise be recompiled by every process a timing case starts
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "src" / "tsm")], check=False,
                   stdout=subprocess.DEVNULL)
    with tempfile.TemporaryDirectory(prefix="tsm-harden-") as tmp:
        report = Path(tmp) / "report.json"
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "reliability",
               f"--reliability-report={report}", *extra]
        proc = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
        if not report.exists():
            sys.stderr.write(proc.stdout[-4000:])
            raise SystemExit(f"harden: pytest wrote no report (exit {proc.returncode})")
        rows: list[dict[str, Any]] = json.loads(report.read_text())
        if proc.returncode not in (0, 1):
            sys.stderr.write(proc.stdout[-4000:])
        return rows


def fmt_value(fig: dict[str, Any]) -> str:
    value, unit = fig["value"], fig["unit"]
    if unit == "s" and value < 1:
        return f"{value * 1000:.0f} ms"
    if unit == "s":
        return f"{value:.3g} s"
    return f"{value:.3g} {unit}".strip()


def measured(row: dict[str, Any]) -> str:
    """The figures of one case as a short phrase: "replicas ended 42 ms (limit 1 s)"."""
    parts = []
    for fig in row["figures"]:
        text = f"{fig['name']} {fmt_value(fig)}"
        if fig["limit"] is not None:
            limit = fmt_value({**fig, "value": fig["limit"]})
            text += f" (limit {limit}{'' if fig['met'] else ', MISSED'})"
        parts.append(text)
    return "; ".join(parts) or "—"


def verdict(row: dict[str, Any]) -> str:
    if row["outcome"] != "passed":
        return f"**{row['outcome'].upper()}**"
    if any(f["met"] is False for f in row["figures"]):
        return "**missed**"
    return "pass"


def table(rows: list[dict[str, Any]]) -> str:
    """The README table: one section row per group, then its cases in suite order."""
    lines = ["| case | what must hold | measured | result |", "|---|---|---|---|"]
    order = {g: i for i, g in enumerate(GROUPS)}
    for group in sorted({r["group"] for r in rows}, key=lambda g: order.get(g, len(order))):
        lines.append(f"| **{group or 'Other'}** | | | |")
        for r in (r for r in rows if r["group"] == group):
            cells = [r["case"], r["expect"], measured(r), verdict(r)]
            lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)


def rewrite_readme(path: Path, rows: list[dict[str, Any]]) -> None:
    text = path.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"harden: {path} has no reliability markers ({BEGIN} ... {END})")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    path.write_text(f"{head}{BEGIN}\n{table(rows)}\n{END}{tail}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--readme", type=Path, help="rewrite the Reliability table of this README")
    ap.add_argument("pytest_args", nargs="*", help="extra pytest arguments (e.g. -k supervisor)")
    ap.add_argument("--tiny", "--smoke", action="store_true", help="only the property cases (checks the script runs)")
    args = ap.parse_args()
    rows = run_suite(args.pytest_args + (["tests/specs/test_properties.py"] if args.tiny else []))
    for r in rows:
        sys.stdout.write(json.dumps({"benchmark": "reliability", **r}) + "\n")
    bad = [r for r in rows if verdict(r) != "pass"]
    sys.stdout.write(json.dumps({"benchmark": "reliability-summary", "cases": len(rows), "not_passing": len(bad)})
                     + "\n")
    if args.readme:
        rewrite_readme(args.readme, rows)
    return 1 if bad or not rows else 0


if __name__ == "__main__":
    raise SystemExit(main())
