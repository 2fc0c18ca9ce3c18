"""py-spy, as every backend runs it for ``tsm stack``: the command, its JSON, and one line for each way it fails.

py-spy (``pip install 'tsm[debug]'``) reads a live Python process's stacks from outside, without stopping
it for more than a moment and without any code in the process. A backend runs :func:`dump_argv` where the
process lives (this host, ``docker exec``, a Kubernetes exec, ``srun``) and hands its output and exit
status to :func:`parse_dump`, which turns py-spy's refusals into one line saying what to change.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from typing import Any

#: What to install when py-spy is missing (the extra puts it on the PATH of the environment).
INSTALL_HINT = "pip install 'tsm[debug]' (or py-spy) where the replica runs"

#: What to change when the kernel or the container refuses ptrace.
PTRACE_HINT = ("py-spy may not attach (no ptrace permission): run the replica's container with the "
               "SYS_PTRACE capability, or set kernel.yama.ptrace_scope=0 on its host")


#: Where a backend puts this host's py-spy inside a container whose image has none.
PYSPY_IN_CONTAINER = "/tmp/.tsm-py-spy"

#: A ``sh`` loop printing ``pid<TAB>cmdline`` for every Python process of a container, from its ``/proc``
#: (``readlink`` and ``tr``, which busybox has too): what the container backends dump.
LIST_PYTHONS = (
    "for d in /proc/[0-9]*; do e=$(readlink \"$d/exe\" 2>/dev/null) || continue; case \"${e##*/}\" in "
    "python*|pypy*) printf '%s\\t' \"${d#/proc/}\"; tr '\\0\\n' '  ' < \"$d/cmdline\"; echo ;; esac; done"
)


def parse_listing(text: str) -> list[tuple[int, str]]:
    """``(pid, command line)`` from :data:`LIST_PYTHONS`'s output."""
    rows = (line.partition("\t") for line in text.splitlines())
    return [(int(pid), cmdline.strip()) for pid, _, cmdline in rows if pid.isdigit()]


def local_pyspy() -> str | None:
    """The py-spy executable on this host: beside this Python (the extra installs it there), else on PATH."""
    import shutil

    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    if os.access(beside, os.X_OK):
        return beside
    return shutil.which("py-spy")


def dump_argv(pid: int, native: bool = False, pyspy: str = "py-spy") -> list[str]:
    """The command that dumps every thread of ``pid`` as JSON (``native``: C frames too)."""
    argv = [pyspy, "dump", "--json", "--pid", str(pid)]
    if native:
        argv.append("--native")
    return argv


def is_python(exe: str, maps: str = "") -> bool:
    """Whether a process whose executable is ``exe`` (and whose ``/proc/PID/maps`` text is ``maps``, when read)
    runs a Python interpreter py-spy can dump."""
    name = os.path.basename(exe.removesuffix(" (deleted)"))
    return name.startswith(("python", "pypy")) or "libpython" in maps


def parse_dump(returncode: int, stdout: str, stderr: str) -> tuple[list[dict[str, Any]], str]:
    """py-spy's threads (``frames`` innermost first) from one run, and "" or the one line saying why it failed."""
    if returncode == 0:
        try:
            threads = json.loads(stdout)
        except ValueError:
            return [], f"py-spy printed no JSON: {_first_line(stdout)}"
        return [t for t in threads if isinstance(t, dict)] if isinstance(threads, list) else [], ""
    return [], failure_line(returncode, stderr or stdout)


def failure_line(returncode: int, text: str) -> str:
    """One line for a py-spy that failed with ``text``: missing, refused ptrace, or what it said."""
    low = text.lower()
    if returncode == 127 or "not found" in low and "py-spy" in low or "no such file" in low and "py-spy" in low:
        return f"py-spy is not installed: {INSTALL_HINT}"
    if "permission denied" in low or "operation not permitted" in low or "ptrace" in low:
        return PTRACE_HINT
    if "no such process" in low or "failed to find python" in low or "failed to get process" in low:
        return "the process ended or runs no Python interpreter py-spy knows"
    return f"py-spy failed (exit {returncode}): {_first_line(text)}"


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return line.strip()[:300]
    return "(no output)"


def join_processes(rows: Sequence[tuple[int, str, int, str, str]]) -> tuple[list[tuple[int, str, list[dict[str, Any]]]], str]:
    """From ``(pid, cmdline, returncode, stdout, stderr)`` per dumped process: the processes dumped, and "" or
    the first failure when none was (a process that ended between listing and dumping is not a failure)."""
    dumped: list[tuple[int, str, list[dict[str, Any]]]] = []
    errors: list[str] = []
    for pid, cmdline, code, out, err in rows:
        threads, why = parse_dump(code, out, err)
        if why:
            errors.append(why)
        else:
            dumped.append((pid, cmdline, threads))
    if dumped or not errors:
        return dumped, ""
    hard = [e for e in errors if not e.startswith("the process ended")]
    return [], (hard or errors)[0]
