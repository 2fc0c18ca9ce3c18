"""Hostile input to the tracker: huge lineages, terminal escapes in what jobs record, JSON that is not JSON.

Each case is a row of the README's reliability table (``make harden``). What a job records is untrusted: a
run id, key, artifact name or path may hold escape codes, a value may be NaN or nested a thousand deep, and a
sweep's lineage may share ancestors along exponentially many paths.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import pytest

from testutil import HANG
from tsm.tracker import TrackerError
from tsm.tracker.store import StoreTracker

TSM = [sys.executable, "-m", "tsm.cli.main"]


def tsm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*TSM, *args], capture_output=True, text=True, timeout=HANG, stdin=subprocess.DEVNULL)


@pytest.fixture
def tracker() -> Iterator[StoreTracker]:
    t = StoreTracker()
    yield t
    t.close()


def ladder(tracker: StoreTracker, generations: int) -> tuple[str, str]:
    """Two runs per generation, each a child of both runs of the one before: 2**generations paths."""
    prev = ["g0"]
    for g in range(1, generations + 1):
        cur = [f"g{g}a", f"g{g}b"]
        for c in cur:
            for p in prev:
                tracker.add_source(c, p)
        prev = cur
    return "g0", prev[0]


@pytest.mark.reliability(
    "a lineage of shared ancestors is printed once",
    expect="33 runs, 62 edges (2^16 paths): each run printed once, lines grow with the edges, not the paths",
    group="Hostile input",
)
def test_lineage_prints_each_run_once(tracker: StoreTracker, figure) -> None:  # type: ignore[no-untyped-def]
    top, bottom = ladder(tracker, 16)
    lin = tracker.lineage(bottom)
    assert len(lin.ancestors()) == len(set(lin.ancestors())) == 31
    out = tsm("tracker", "lineage", bottom)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    figure("lines printed", len(lines), "", limit=100)
    assert len(lines) <= 2 + 62 + 1
    printed = [ln.split()[1] for ln in lines if ln.strip().startswith("^") and "(shown above)" not in ln]
    assert sorted(printed) == sorted(lin.ancestors())  # every ancestor expanded exactly once
    down = tsm("tracker", "lineage", top, "--json")
    assert down.returncode == 0 and len(down.stdout) < 200_000
    assert json.loads(down.stdout)["run_id"] == "g0"
    assert tracker.lineage(top).descendants().count(bottom) == 1


ESC = "\x1b]0;pwned\x07\x1b[2J\r"


@pytest.mark.reliability(
    "escape codes recorded by a job never reach the terminal",
    expect="run ids, keys, values, artifact names and paths with ESC/BEL/CR print escaped in list, show, lineage",
    group="Hostile input",
)
def test_control_characters_are_escaped_everywhere(tracker: StoreTracker) -> None:
    run = f"evil{ESC}run"
    tracker.add_metadata(run, **{f"k{ESC}": f"v{ESC}"})
    tracker.add_artifact(run, f"art{ESC}", f"/p{ESC}ath")
    tracker.add_source(f"kid{ESC}", run, f"ckpt{ESC}")
    outputs = [tsm("tracker", "list"), tsm("tracker", "show", run), tsm("tracker", "lineage", run),
               tsm("tracker", "show", f"kid{ESC}"), tsm("tracker", "show", "no\x1b[31mpe")]
    for out in outputs:
        text = out.stdout + out.stderr
        assert not any(c in text for c in "\x1b\x07\r"), repr(text)
    assert "\\x1b" in outputs[1].stdout and outputs[4].returncode == 2


@pytest.mark.reliability(
    "tracker show --json is always JSON",
    expect="NaN/Infinity become strings; metadata nested 10,000 deep is a one-line TrackerError, not RecursionError",
    group="Hostile input",
)
def test_show_json_is_strict_and_deep_nesting_is_refused(tracker: StoreTracker) -> None:
    tracker.add_metadata("r", nan=float("nan"), inf=[float("inf"), {"x": float("-inf")}], ok=1.5)
    out = tsm("tracker", "show", "r", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
    assert data["metadata"] == {"nan": "NaN", "inf": ["Infinity", {"x": "-Infinity"}], "ok": 1.5}
    deep: object = 1
    for _ in range(10_000):
        deep = [deep]
    with pytest.raises(TrackerError, match="nests deeper"):
        tracker.add_metadata("r", deep=deep)
    with pytest.raises(TrackerError):
        tracker.add_artifact("r", "a", "/p", {"deep": deep})
    # a value written deep by another tool is refused at read time with the same error
    raw = "[" * 100_000 + "]" * 100_000
    tracker._db().write([("INSERT OR REPLACE INTO tracker_metadata (run_id, key, value, updated) VALUES (?,?,?,?)",
                          ("r", "raw", raw, 0.0))])
    with pytest.raises(TrackerError):
        tracker.metadata("r")
    shown = tsm("tracker", "show", "r")
    assert shown.returncode == 1 and shown.stderr.count("\n") == 1 and "Traceback" not in shown.stderr


def test_list_includes_parents_known_only_as_sources_with_their_children(tracker: StoreTracker) -> None:
    """Issue 30 item 9: a job that launched children but recorded nothing itself is listed, CHILDREN counted."""
    tracker.add_source("local://default/child-1", "local://default/parent")
    tracker.add_source("local://default/child-2", "local://default/parent")
    tracker.add_source("local://default/child-2", "local://default/parent", "ckpt")  # 2 edges, 1 child
    rows = {r["run_id"]: r for r in tracker.runs()}
    assert set(rows) == {"local://default/parent", "local://default/child-1", "local://default/child-2"}
    assert rows["local://default/parent"]["children"] == 2 and rows["local://default/child-1"]["children"] == 0
    out = tsm("tracker", "list")
    parent_line = next(ln for ln in out.stdout.splitlines() if ln.startswith("local://default/parent"))
    assert parent_line.split()[-1] == "2"
