"""py-spy's outcomes as every backend reads them: its JSON, and one line for each way it fails."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from tsm.schedulers.common import pyspy


def test_a_real_dump_parses(tmp_path) -> None:  # type: ignore[no-untyped-def]
    exe = pyspy.local_pyspy()
    assert exe is not None, "make test installs py-spy (the test extra includes tsm[debug])"
    ready = tmp_path / "ready"
    code = f"import time\ndef parked_here():\n    open({str(ready)!r}, 'w').close()\n    time.sleep(600)\nparked_here()\n"
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        while not ready.exists():
            assert proc.poll() is None
            time.sleep(0.01)
        r = subprocess.run(pyspy.dump_argv(proc.pid, pyspy=exe), capture_output=True, text=True, timeout=60)
        threads, why = pyspy.parse_dump(r.returncode, r.stdout, r.stderr)
    finally:
        proc.kill()
        proc.wait()
    assert why == ""
    assert [f["name"] for f in threads[0]["frames"]] == ["parked_here", "<module>"]


@pytest.mark.parametrize(("code", "text", "says"), [
    (127, "sh: 1: py-spy: not found", "py-spy is not installed: pip install 'tsm[debug]'"),
    (1, "Error: Permission Denied: Try running again with elevated permissions", "SYS_PTRACE"),
    (1, "Error: Operation not permitted (os error 1)", "ptrace"),
    (1, "Error: No such process (os error 3)", "the process ended"),
    (2, "something else\nmore", "py-spy failed (exit 2): something else"),
])
def test_failures_are_one_line_saying_what_to_change(code: int, text: str, says: str) -> None:
    threads, why = pyspy.parse_dump(code, "", text)
    assert threads == [] and says in why and "\n" not in why


def test_join_processes_keeps_what_was_dumped_and_reports_only_real_failures() -> None:
    ok = json.dumps([{"frames": []}])
    assert pyspy.join_processes([(1, "a", 0, ok, ""), (2, "b", 1, "", "No such process")]) == ([(1, "a", [{"frames": []}])], "")
    assert pyspy.join_processes([(2, "b", 1, "", "No such process"), (3, "c", 1, "", "Permission denied")])[1] == pyspy.PTRACE_HINT
    assert pyspy.is_python("/usr/bin/python3.11") and pyspy.is_python("/opt/x/bin/app", "7f.. /usr/lib/libpython3.11.so")
    assert not pyspy.is_python("/bin/sleep")
