"""The warning's script (:func:`tsm.schedulers.common.warn.handlers_script`) in a PID namespace of its own, as it
runs in a container: it signals the processes that handle the signal and spares the others."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tsm.schedulers.common.warn import handlers_script

HANDLER = (
    "import os, signal, sys, time\n"
    "signal.signal(signal.SIGUSR1, lambda *a: (os.write(1, b'warned\\n'), sys.exit(0)))\n"
    "open(sys.argv[1], 'w').close()\n"
    "time.sleep(30)\n"
)
PLAIN = "import time; time.sleep(30)"

#: the container: a process that handles USR1, one that does not (USR1 would end it), then the script
CONTAINER = """
{py} -c "$1" "$4" & handler=$!
{py} -c "$2" & plain=$!
while [ ! -e "$4" ]; do sleep 0.05; done  # the handler is set
{shell} -c "$3"; echo "script exit $?"
wait $handler; echo "handler exit $?"
kill -0 $plain && echo "plain alive"
kill $plain
{shell} -c "$3"; echo "script exit $?"
"""


def _unshare() -> str | None:
    tool = shutil.which("unshare")
    if tool is None or os.geteuid() != 0:
        return None
    probe = subprocess.run([tool, "-pf", "--mount-proc", "true"], capture_output=True)
    return tool if probe.returncode == 0 else None


@pytest.mark.parametrize("shell", ["sh", "bash"])
def test_the_script_signals_the_handlers_and_spares_the_others(shell: str, tmp_path: Path) -> None:
    tool = _unshare()
    if tool is None:
        pytest.skip("a PID namespace of the test's own needs root and unshare(1); the container tests cover it")
    body = CONTAINER.format(py=sys.executable, shell=shell)
    out = subprocess.run([tool, "-pf", "--mount-proc", "bash", "-c", body, "_", HANDLER, PLAIN,
                          handlers_script("USR1"), str(tmp_path / "ready")], capture_output=True, text=True, timeout=60)
    lines = out.stdout.splitlines()
    assert sorted(lines[:2]) == ["script exit 0", "warned"], (lines, out.stderr)  # the handler prints when it runs
    assert lines[2:] == ["handler exit 0", "plain alive", "script exit 1"], (lines, out.stderr)


def test_only_standard_signals_are_warnings() -> None:
    with pytest.raises(ValueError, match="standard"):
        handlers_script("RTMIN")
    assert "kill -s USR2 " in handlers_script("SIGUSR2")
