"""Helpers the tests share: waiting for a condition, starting forked workers, finding a test's processes.

On the import path through ``pythonpath = ["tests"]`` in pyproject.toml: ``from testutil import ...``.
"""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing as mp
import os
import select
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: seconds: a guard against a hang, never a performance claim
HANG = 120.0

FORK = mp.get_context("fork")
_marker = itertools.count()


def wait_until(pred: Callable[[], bool], what: str = "a condition", timeout: float = 30.0) -> None:
    """Return once ``pred()`` is true; fail naming ``what`` if it is not within ``timeout`` seconds."""
    end = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def spawn(target: Callable[..., None], *args: Any) -> Any:
    """Start ``target(*args)`` in a forked daemon process."""
    p = FORK.Process(target=target, args=args, daemon=True)
    p.start()
    return p


def sleep_marker() -> str:
    """A ``sleep`` duration no other process uses, so a test can find the replica's processes by it."""
    return f"1000.{os.getpid()}{next(_marker)}"


def procs_with(marker: str) -> list[int]:
    """Live processes whose command line contains ``marker``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    found.append(int(entry))
        except OSError:
            continue
    return found


def wait_all_gone(pids: list[int], timeout: float = HANG) -> float:
    """Block on pidfds until every pid has exited; return when the last one went (time.monotonic())."""
    fds = []
    for pid in pids:
        try:
            fds.append(os.pidfd_open(pid))
        except ProcessLookupError:
            continue
    end = time.monotonic() + timeout
    try:
        while fds:
            ready, _, _ = select.select(fds, [], [], max(0.0, end - time.monotonic()))
            if not ready:
                raise AssertionError(f"processes {pids} still alive after {timeout}s")
            for fd in ready:
                fds.remove(fd)
                os.close(fd)
    finally:
        for fd in fds:
            os.close(fd)
    return time.monotonic()


def assert_all_end(marker: str) -> None:
    """Every process whose command line holds ``marker`` ends by itself (waited on by pidfd; HANG is a guard)."""
    wait_all_gone(procs_with(marker))
    assert not procs_with(marker)


def py(code: str, name: str = "r", **kw: Any) -> Any:
    """A role running ``python -c code`` (dedented) with this interpreter; ``kw`` are further Role fields."""
    import sys
    import textwrap

    from tsm.specs import Role

    return Role(name, entrypoint=sys.executable, args=["-c", textwrap.dedent(code)], **kw)


class MemoryCgroup:
    """A memory cgroup with a limit, standing for a node whose memory its processes share: what runs in it
    past the limit is ended by the kernel's own OOM killer (a real one, counted in ``/proc/vmstat``).

    Made under the root of the memory hierarchy (cgroup v1's ``memory`` controller, or v2 with ``memory``
    enabled), so it needs root; :func:`memory_cgroup_unavailable` says why not where it cannot be made.
    ``close`` moves what is left back to the root group and removes the group.
    """

    def __init__(self, name: str, limit_bytes: int) -> None:
        v1 = "/sys/fs/cgroup/memory"
        self.v2 = not os.path.isdir(v1)
        self.root = "/sys/fs/cgroup" if self.v2 else v1
        self.path = os.path.join(self.root, name)
        self.origin: dict[int, str] = {}
        os.makedirs(self.path, exist_ok=True)
        limit_file = "memory.max" if self.v2 else "memory.limit_in_bytes"
        with open(os.path.join(self.path, limit_file), "w") as f:
            f.write(str(limit_bytes))
        if not self.v2:  # no swap either: over the limit is an OOM kill, not a crawl
            with contextlib.suppress(OSError), open(os.path.join(self.path, "memory.memsw.limit_in_bytes"), "w") as f:
                f.write(str(limit_bytes))

    @property
    def procs(self) -> str:
        """The file a pid is written to, to move that process (and what it starts later) into the group."""
        return os.path.join(self.path, "cgroup.procs")

    def add(self, pid: int) -> None:
        """Move ``pid`` into the group; ``close`` puts it back where it was."""
        self.origin.setdefault(pid, self._group_of(pid))
        with open(self.procs, "w") as f:
            f.write(str(pid))

    def _group_of(self, pid: int) -> str:
        with contextlib.suppress(OSError), open(f"/proc/{pid}/cgroup") as f:
            for line in f:
                _, ctl, path = line.rstrip("\n").split(":", 2)
                if (self.v2 and ctl == "") or (not self.v2 and "memory" in ctl.split(",")):
                    return path
        return "/"

    def close(self) -> None:
        for _ in range(50):
            with contextlib.suppress(OSError), open(self.procs) as f:
                for pid in f.read().split():
                    back = self.origin.get(int(pid), "/")  # what it started since went in with it: back too
                    with contextlib.suppress(OSError), open(f"{self.root}{back.rstrip('/')}/cgroup.procs", "w") as out:
                        out.write(pid)
            try:
                os.rmdir(self.path)
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.1)


def memory_cgroup_unavailable() -> str | None:
    """Why a :class:`MemoryCgroup` cannot be made on this machine, or None when it can."""
    if os.geteuid() != 0:
        return "making a memory cgroup needs root"
    v2 = "/sys/fs/cgroup/cgroup.controllers"
    if os.path.isdir("/sys/fs/cgroup/memory"):
        if not os.access("/sys/fs/cgroup/memory", os.W_OK):
            return "the cgroup v1 memory hierarchy is read-only here"
    elif not (os.path.exists(v2) and "memory" in Path(v2).read_text().split()):
        return "no cgroup memory controller here"
    try:
        MemoryCgroup(f"tsm-probe-{os.getpid()}", 64 << 20).close()
    except OSError as e:
        return f"a memory cgroup cannot be made here: {e}"
    return None


#: A fake ``nvidia-smi`` (this machine has no GPU): its first answer is two healthy GPUs (one without ECC);
#: later ones are the file ``after``'s text, with the exit code in ``code`` (what nvidia-smi prints for a GPU
#: fallen off the bus, or more uncorrectable ECC errors). Other arguments than tsm's query are an error.
FAKE_NVIDIA_SMI = """#!/bin/sh
here=$(dirname "$0")
case "$*" in *--query-gpu=pci.bus_id,ecc.errors.uncorrected.volatile.total*--format=csv,noheader,nounits*) ;;
  *) echo "fake nvidia-smi: unexpected arguments: $*" >&2; exit 2 ;; esac
if [ -e "$here/asked" ]; then cat "$here/after"; exit "$(cat "$here/code")"; fi
touch "$here/asked"
printf '00000000:3B:00.0, 0\\n00000000:86:00.0, [N/A]\\n'
"""

#: What nvidia-smi prints for a GPU fallen off the bus.
GPU_LOST = "Unable to determine the device handle for GPU 0000:3B:00.0: GPU is lost. Reboot the system to recover this GPU"

#: Two healthy GPUs, as the fake's first answer.
GPUS_HEALTHY = "00000000:3B:00.0, 0\n00000000:86:00.0, [N/A]\n"


def fake_nvidia_smi(folder: Path, after: str, code: int) -> Path:
    """Write :data:`FAKE_NVIDIA_SMI` into ``folder`` (made), answering ``after`` with ``code`` from its second
    call on; the folder, to put first on ``PATH``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "nvidia-smi").write_text(FAKE_NVIDIA_SMI)
    (folder / "nvidia-smi").chmod(0o755)
    (folder / "after").write_text(after)
    (folder / "code").write_text(str(code))
    return folder


def everything_under(home: Path) -> str:
    """Every byte under ``home``, with :func:`store_text`: what a test searches for a value that must be kept
    nowhere. A file removed meanwhile is skipped."""
    text = []
    for p in home.rglob("*"):
        with contextlib.suppress(OSError):
            if p.is_file():
                text.append(p.read_bytes().decode(errors="replace"))
    return "\n".join([*text, store_text(home)])


def store_text(home: Path) -> str:
    """Every row of every table of every SQLite store under ``home`` (``tsm.db``), as text, read through
    SQLite so what is still in a WAL counts; a store another process is checkpointing is read again."""
    import sqlite3

    text: list[str] = []
    for db in home.rglob("*.db"):
        for tries in itertools.count():
            try:
                con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
                try:
                    tables = [t for (t,) in con.execute("SELECT name FROM sqlite_master WHERE type='table'")]
                    text += [repr(row) for t in tables for row in con.execute(f'SELECT * FROM "{t}"')]  # noqa: S608
                finally:
                    con.close()
                break
            except sqlite3.OperationalError as e:
                if tries >= 20:
                    raise sqlite3.OperationalError(f"{db}: {e}") from e
                time.sleep(0.1)
    return "\n".join(text)
