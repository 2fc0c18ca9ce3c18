"""Helpers the tests share: waiting for a condition, starting forked workers, finding a test's processes.

On the import path through ``pythonpath = ["tests"]`` in pyproject.toml: ``from testutil import ...``.
"""

from __future__ import annotations

import itertools
import multiprocessing as mp
import os
import select
import time
from collections.abc import Callable
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
