"""``tsm.schedulers.local._os``: the /proc readers the supervisor's stop and the launcher's checks use."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tsm.schedulers.local import _os

# A parent that starts one `sleep` from its main thread and, when asked, one from a second thread that stays
# alive: that child is listed in the second thread's own /proc/PID/task/TID/children file only.
PARENT = textwrap.dedent("""
    import subprocess, sys, threading
    kids = [subprocess.Popen(["sleep", "60"])]
    if sys.argv[1] == "threaded":
        done, hold = threading.Event(), threading.Event()
        def start():
            kids.append(subprocess.Popen(["sleep", "60"]))
            done.set()
            hold.wait()
        threading.Thread(target=start, daemon=True).start()
        done.wait()
    print(" ".join(str(k.pid) for k in kids), flush=True)
    sys.stdin.read()
    for k in kids:
        k.kill()
        k.wait()
""")


def _children_of(mode: str) -> tuple[list[int], list[int]]:
    proc = subprocess.Popen([sys.executable, "-c", PARENT, mode], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout is not None
        kids = [int(p) for p in proc.stdout.readline().split()]
        return sorted(kids), sorted(_os.children(proc.pid))
    finally:
        proc.communicate("", timeout=30)


def test_children_of_a_single_threaded_process() -> None:
    started, found = _children_of("plain")
    assert len(started) == 1 and found == started


def test_children_started_by_another_thread_are_found_too() -> None:
    """The shortcut for one thread (one children file, no listing) must not hide a second thread's children."""
    started, found = _children_of("threaded")
    assert len(started) == 2 and found == started


def test_children_of_a_gone_process_is_empty() -> None:
    proc = subprocess.Popen(["true"])
    proc.wait()
    assert _os.children(proc.pid) == []


def test_read_proc_reads_the_whole_file(tmp_path: Path) -> None:
    data = bytes(range(256)) * 1000  # more than one read's 64 KiB
    (tmp_path / "f").write_bytes(data)
    assert _os.read_proc(str(tmp_path / "f")) == data
    assert _os.read_proc("/proc/self/stat").startswith(str(os.getpid()).encode())
