"""A real ``tsm serve`` process for the web tests: started on a free port, stopped (and reaped) after."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest


@contextmanager
def tsm_serve(*flags: str) -> Iterator[str]:
    """Run ``tsm serve --port 0 FLAGS`` and yield the URL it prints (with its ``?token=``: there always is one)."""
    with serve_process(*flags) as (url, _):
        yield url


@contextmanager
def serve_process(*flags: str) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """As :func:`tsm_serve`, yielding the process too (to measure its memory and threads)."""
    pytest.importorskip("starlette", reason="the web extra is installed by `pip install -e .[test]`")
    proc = subprocess.Popen(
        [sys.executable, "-m", "tsm.cli.main", "serve", "--port", "0", "--interval", "0.2",
         "--sample-interval", "0.3", *flags],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ),
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.startswith("tsm serve: http://"):
            proc.kill()
            raise AssertionError(f"tsm serve did not start: {line!r} {proc.communicate()[1]!r}")
        yield line.split(": ", 1)[1].strip(), proc
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def token(url: str) -> str:
    """The token in a URL ``tsm serve`` printed."""
    return url.split("?token=", 1)[1]


def auth(url: str) -> dict[str, str]:
    """Headers that carry the token of ``url`` (for an HTTP client)."""
    return {"Authorization": f"Bearer {token(url)}"}


def base(url: str) -> str:
    """The URL without its query (``?token=``)."""
    return url.split("?", 1)[0]


def wait_for(fn, timeout: float = 60.0, what: str = "condition"):  # type: ignore[no-untyped-def]
    """Call ``fn`` until it returns something truthy; that value, or an AssertionError after ``timeout``."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(0.1)
    raise AssertionError(f"{what} not met in {timeout}s (last: {last!r})")
