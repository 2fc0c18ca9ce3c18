"""Regenerate the Slurm test data in this folder from a real cluster (run scripts/slurm-up first).

    .venv/bin/python tests/schedulers/data/capture_slurm_data.py

Submits a handful of small tsm apps that end in each way the unit tests parse (completed, failed,
requeued then failed, cancelled, timed out, pending for resources, running) and saves what ``squeue`` and
``sacct -D`` said about them in the columns tsm asks for (``SQUEUE_ARGS``, ``sacct_args``). Takes about 2
minutes (the time-limit job needs Slurm's one-minute minimum). Output: squeue_<version>.txt,
sacct_<version>.txt and jobs_<version>.json (which app id is which case).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tsm.schedulers.slurm import SQUEUE_ARGS, create_scheduler, sacct_args
from tsm.schedulers.slurm.parse import SEP, SQUEUE_FIELDS
from tsm.specs.api import AppDef, Resource, Role

HERE = Path(__file__).parent


def only(ids: set[str], squeue_text: str) -> str:
    """Keep the records of the captured apps (their het components too); drop everything else queued."""
    keep = []
    for line in squeue_text.splitlines(keepends=True):
        f = dict(zip(SQUEUE_FIELDS, line.split(SEP), strict=False))
        if f.get("JobID") in ids or f.get("HetJobID") in ids:
            keep.append(line)
    return "".join(keep)


def main() -> None:
    home = tempfile.mkdtemp(prefix="tsm-capture-")
    os.environ["TSM_HOME"] = home  # removed at the end: tests must not find these job directories
    s = create_scheduler("capture")
    small = Resource(cpu=1, memMB=100)
    whole = Resource(cpu=2, memMB=100)

    def role(name: str, script: str, n: int = 1, **kw: object) -> Role:
        return Role(name, entrypoint="bash", args=["-c", script], num_replicas=n, resource=kw.pop("res", small), **kw)  # type: ignore[arg-type]

    ids: dict[str, str] = {}
    ids["completed"] = s.submit(AppDef("ok", [role("trainer", "echo hi", 2), role("ps", "echo ps")]))
    ids["failed"] = s.submit(
        AppDef("bad", [role("trainer", '[ "$TSM_REPLICA_ID" = 1 ] && exit 3; sleep 30', 2), role("ps", "sleep 30")])
    )
    ids["requeued"] = s.submit(AppDef("retry", [role("w", "exit 5", max_retries=1)]))
    ids["timeout"] = s.submit(AppDef("slow", [role("w", "sleep 300")]), {"time": "1"})
    ids["cancelled"] = s.submit(AppDef("stop", [role("w", "sleep 300", 2)]))
    ids["running"] = s.submit(AppDef("busy", [role("trainer", "sleep 25", 2), role("ps", "sleep 25")]))
    time.sleep(3)
    ids["pending"] = s.submit(AppDef("big", [role("w", "sleep 1", 4, res=whole)]))
    s.wait(ids["completed"], timeout=60)
    s.wait(ids["failed"], timeout=60)
    while s.describe(ids["cancelled"]).state.name != "RUNNING":  # type: ignore[union-attr]
        time.sleep(0.5)
    s.cancel(ids["cancelled"])
    time.sleep(3)
    squeue_text = subprocess.run(SQUEUE_ARGS, capture_output=True, text=True, check=True).stdout
    for app_id in ids.values():
        s.wait(app_id, timeout=240)
    time.sleep(2)
    sacct_text = subprocess.run(sacct_args("-D", "-j", ",".join(ids.values())), capture_output=True, text=True,
                                check=True).stdout  # fmt: skip
    version = subprocess.run(["sbatch", "--version"], capture_output=True, text=True, check=True).stdout.split()[-1]
    tag = ".".join(version.split(".")[:2])
    squeue_text = only(set(ids.values()), squeue_text)
    (HERE / f"squeue_{tag}.txt").write_text(squeue_text)
    (HERE / f"sacct_{tag}.txt").write_text(sacct_text)
    (HERE / f"jobs_{tag}.json").write_text(json.dumps({"sbatch_version": version, "apps": ids}, indent=1) + "\n")
    print(json.dumps(ids), file=sys.stderr)
    shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
