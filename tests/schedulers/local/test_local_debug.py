"""Which processes are a local replica's: its group, its session, and descendants that left both."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from tsm.schedulers.local.debug import python_processes


def test_a_child_in_a_session_of_its_own_is_still_the_replicas(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    child = f"import os, time; os.setsid(); open({str(ready)!r}, 'w').close(); time.sleep(600)"
    leader_code = (f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {child!r}]); "
                   "time.sleep(600)")
    leader = subprocess.Popen([sys.executable, "-c", leader_code], start_new_session=True)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    mine: list[int] = []
    try:
        deadline = time.monotonic() + 60  # a hang guard only
        while not ready.exists():
            assert leader.poll() is None and time.monotonic() < deadline
            time.sleep(0.01)
        found = python_processes([leader.pid, other.pid])
        mine = [pid for pid, _ in found[leader.pid]]
        assert mine[0] == leader.pid and len(mine) == 2  # the leader first, then the child that left
        assert [pid for pid, _ in found[other.pid]] == [other.pid]  # another replica's is its own
        assert not set(mine) & {other.pid}
    finally:
        for pid in mine[1:]:  # the child left the group: it is ended by its pid
            os.kill(pid, 9)
        for p in (leader, other):
            os.killpg(p.pid, 9)
            p.wait()
