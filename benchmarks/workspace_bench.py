"""Workspace snapshots of a large tree: first snapshot, unchanged re-run, one changed file; JSON out.

    python benchmarks/workspace_bench.py              # 200 MB tree (quick on a 2-core CI box)
    python benchmarks/workspace_bench.py --mb 1024    # the 1 GB tree of the workspaces issue

The tree is ``--files`` files (default 2000) of random bytes totalling ``--mb`` MB, in 20 directories,
under a fresh temporary ``$TSM_HOME`` on the same file system. Measured, each with the builder's own
counters (files/bytes copied, files hashed):

* ``first``      the first snapshot: every file hashed and copied into the object store, then linked
* ``unchanged``  the same tree again: stat cache only, snapshot reused (copies nothing)
* ``one_changed`` one file rewritten: one file hashed and copied, a new snapshot of hard links

Beside them, the physical baselines on the same tree: ``cp -r`` (copy every byte, what a naive
snapshot costs) and ``cp -al`` (hard-link every file, the floor for making a fresh tree of links),
plus ``sha256sum`` of every file (the cost of hashing without a stat cache). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def make_tree(root: Path, total_mb: int, files: int) -> int:
    size = max(1, total_mb * (1 << 20) // files)
    written = 0
    for i in range(files):
        d = root / f"dir{i % 20:02d}"
        d.mkdir(parents=True, exist_ok=True)
        with open(d / f"file{i:05d}.bin", "wb") as f:
            f.write(os.urandom(size))
        written += size
    old = time.time() - 60  # older than the stat cache's racy window, as a real checkout is
    for p in root.rglob("*.bin"):
        os.utime(p, (old, old))
    return written


def timed(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return round(time.perf_counter() - t0, 4)


def drop_counts(report: Any) -> dict[str, Any]:
    keys = ("seconds", "reused", "files_copied", "bytes_copied", "files_linked", "files_hashed", "bytes_hashed")
    return {k: getattr(report, k) for k in keys}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=200, help="total size of the tree in MB (default 200; 1024 for 1 GB)")
    ap.add_argument("--files", type=int, default=2000, help="number of files (default 2000)")
    ap.add_argument("--dir", default=None, help="where to make the temporary tree (default: the system temp dir)")
    ap.add_argument("--tiny", "--smoke", action="store_true", help="tiny sizes: checks that the benchmark still runs")
    args = ap.parse_args()
    if args.tiny:
        args.mb, args.files = 1, 20
    base = Path(tempfile.mkdtemp(prefix="tsm-wsbench-", dir=args.dir))
    os.environ["TSM_HOME"] = str(base / "home")
    from tsm.workspace.dir import DirWorkspace, remove_tree

    try:
        ws = base / "ws"
        total = make_tree(ws, args.mb, args.files)
        out: dict[str, Any] = {"tree": {"files": args.files, "bytes": total, "path": str(base)}}
        out["baseline_cp_r_s"] = timed(["cp", "-r", str(ws), str(base / "cp_r")])
        out["baseline_cp_al_s"] = timed(["cp", "-al", str(ws), str(base / "cp_al")])
        t0 = time.perf_counter()
        subprocess.run(f"find {ws} -type f -print0 | xargs -0 sha256sum", shell=True, check=True, stdout=subprocess.DEVNULL)
        out["baseline_sha256sum_s"] = round(time.perf_counter() - t0, 4)
        shutil.rmtree(base / "cp_r")
        shutil.rmtree(base / "cp_al")

        builder = DirWorkspace()
        out["first"] = drop_counts(builder.build(ws))
        out["unchanged"] = drop_counts(builder.build(ws))
        victim = ws / "dir07" / "file00007.bin"
        with open(victim, "r+b") as f:
            f.write(os.urandom(64))
        out["one_changed"] = drop_counts(builder.build(ws))
        out["unchanged_vs_cp_r"] = round(out["unchanged"]["seconds"] / max(out["baseline_cp_r_s"], 1e-9), 4)
        out["one_changed_vs_cp_al"] = round(out["one_changed"]["seconds"] / max(out["baseline_cp_al_s"], 1e-9), 4)
        out["python"] = sys.version.split()[0]
        out["cpus"] = os.cpu_count()
        print(json.dumps(out, indent=1))
    finally:
        for snap in (base / "home" / "workspaces" / "snapshots").glob("*"):
            remove_tree(snap)
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
