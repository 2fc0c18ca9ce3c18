"""The runnable examples run to success (``make demo`` runs ``examples/seed_style.py``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
HANG = 300  # seconds: a guard against a hang, never a performance claim


def test_seed_style_example_succeeds(tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, str(EXAMPLES / "seed_style.py")],
        capture_output=True, text=True, timeout=HANG, cwd=tmp_path, stdin=subprocess.DEVNULL,
    )
    assert r.returncode == 0, (r.stdout, r.stderr)
    out = r.stdout.splitlines()
    handle = out[0].removeprefix("launched ")
    assert handle.startswith("local://seed_demo/seed_demo-")
    # status.format() prints TorchX's layout (AppStatus: / State: / *role[k]:STATE), as TorchX users expect
    assert "State: SUCCEEDED" in [ln.strip() for ln in out]
    for role, k in (("trainer", 0), ("trainer", 1), ("ps", 0), ("reader", 0)):
        assert f"{role}[{k}]:SUCCEEDED" in r.stdout
        replica = f"{role}/{k}"
        lines = [ln for ln in out if ln.startswith(f"{replica} ")]
        assert lines and lines[-1].endswith("done"), (replica, lines)
    assert f"trainer/1 trainer 1/2 of {handle}" in out  # each replica knows its rank and the app's handle
    assert any(ln.startswith("ps/0 ps: serving 2 shard(s) on port ") for ln in out)


def test_example_scripts_run_alone(tmp_path: Path) -> None:
    """The replicas' scripts are plain Python: each runs and exits 0 outside tsm too."""
    for script in ("trainer.py", "ps.py", "reader.py"):
        r = subprocess.run(
            [sys.executable, str(EXAMPLES / "app" / script)], capture_output=True, text=True, timeout=HANG, cwd=tmp_path
        )
        assert r.returncode == 0, (script, r.stderr)
        assert r.stdout.rstrip().endswith("done")
