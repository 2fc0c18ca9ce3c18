"""``tsm status --json`` carries every key of TorchX's ``torchx status --json`` (tsm's own beside them)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def test_status_json_has_torchxs_keys(tmp_path: Path) -> None:
    tsm = [sys.executable, "-m", "tsm.cli.main"]
    handle = subprocess.run([*tsm, "run", "--detach", "utils.echo"], cwd=tmp_path, capture_output=True, text=True,
                            timeout=120).stdout.strip()
    subprocess.run([*tsm, "wait", handle], cwd=tmp_path, capture_output=True, timeout=120)
    data = json.loads(subprocess.run([*tsm, "status", "--json", handle], cwd=tmp_path, capture_output=True,
                                     text=True, timeout=120).stdout)
    assert {"state", "num_restarts", "roles", "msg", "structured_error_msg", "url"} <= set(data)
    assert data["state"] == "SUCCEEDED" and data["url"] == data["ui_url"] and data["url"]
    assert {"id", "state", "role", "hostname", "structured_error_msg"} <= set(data["roles"][0]["replicas"][0])
