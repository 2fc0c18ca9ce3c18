"""A tiny training component for sweep tests: records its loss through the tracker, leaves a marker file."""

from __future__ import annotations

from pathlib import Path

import pytest

COMPONENT = '''
import sys
from tsm import AppDef, Role


def train(lr: float = 0.1, batch: int = 32, fail: int = 0, sleep: float = 0.0, markers: str = "") -> AppDef:
    """Record loss = |lr - 0.01| * 100 + 64 / batch, append a marker line, exit ``fail``."""
    code = (
        "import os, sys, time\\n"
        "from tsm.tracker import AppRun\\n"
        f"time.sleep({sleep})\\n"
        f"open(os.path.join({markers!r}, 'lr{lr}-b{batch}'), 'a').write(os.environ['TSM_JOB_ID'] + '\\\\n')\\n"
        f"AppRun.run_from_env().add_metadata(loss=abs({lr} - 0.01) * 100 + 64 / {batch}, lr_seen={lr})\\n"
        f"sys.exit({fail})\\n"
    )
    return AppDef(name="train", roles=[Role(name="trainer", image="", entrypoint=sys.executable, args=["-c", code])])
'''


@pytest.fixture
def train_component(tmp_path: Path) -> tuple[str, Path]:
    """``(component ref, markers dir)``: ``train.py:train`` in a temporary folder."""
    path = tmp_path / "train.py"
    path.write_text(COMPONENT)
    markers = tmp_path / "markers"
    markers.mkdir()
    return f"{path}:train", markers
