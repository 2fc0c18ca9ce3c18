"""The check every engine's ``--after`` test runs: apps on the engine held by tsm's watcher behind local apps.

Two local apps blocked on fifos (events, not sleeps) are the dependencies; the engine's apps wait for them
PENDING and unknown to the engine, then one runs when its dependency succeeds and the other ends CANCELLED,
never created, when its dependency fails.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from tsm.components.utils import sh
from tsm.runner.api import Runner
from tsm.specs.api import AppDef, AppState, Role
from tsm.specs.handles import parse_app_handle

HANG = 240.0  # seconds: a guard against a hang, never a performance claim


def _gate(folder: Path) -> Path:
    fifo = folder / f"gate-{os.urandom(3).hex()}"
    os.mkfifo(fifo)
    return fifo


def _open(fifo: Path) -> None:
    with open(fifo, "w") as f:  # blocks until the local replica reads it
        f.write("go\n")


def waits_for_local_apps(runner: Runner, scheduler: str, role: Role, cfg: dict[str, Any], folder: Path) -> None:
    """``role`` (printing ``ran``) run on ``scheduler`` after a local app that succeeds, and after one that fails."""
    ok, bad = _gate(folder), _gate(folder)
    a_ok = runner.run(sh(f"read x < {ok}"), "local")
    a_bad = runner.run(sh(f"read x < {bad}; exit 1"), "local")
    b_ok = runner.run(AppDef("after-ok", [role]), scheduler, cfg=cfg, after=[a_ok])
    b_bad = runner.run(AppDef("after-bad", [role]), scheduler, cfg=cfg, after=[f"{a_bad}:ok"])
    engine = runner.scheduler(scheduler)
    for b, a in ((b_ok, a_ok), (b_bad, a_bad)):
        st = runner.status(b)
        assert st is not None and st.state == AppState.PENDING and f"waiting for {a}:ok" in st.msg, st
        assert engine.describe(parse_app_handle(b).app_id) is None, "submitted before its dependency ended"
    _open(bad)
    st = runner.wait(b_bad, timeout=HANG)
    assert st is not None and st.state == AppState.CANCELLED and f"dependency {a_bad} ended FAILED" in st.msg, st
    assert engine.describe(parse_app_handle(b_bad).app_id) is None, "an app whose dependency failed was submitted"
    assert runner.status(b_ok).state == AppState.PENDING  # type: ignore[union-attr]
    _open(ok)
    st = runner.wait(b_ok, timeout=HANG)
    assert st is not None and st.state == AppState.SUCCEEDED, st
    assert engine.describe(parse_app_handle(b_ok).app_id) is not None
    assert "ran\n" in list(runner.log_lines(b_ok, role.name, 0))
