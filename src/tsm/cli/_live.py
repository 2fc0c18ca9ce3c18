"""A live status line on a terminal's stderr: ``tsm run``'s per-role replica counts and long steps' spinners.

Plain ANSI, no dependency: one line, drawn as ``\\r`` + erase-line + text, redrawn at most every
:data:`REDRAW` seconds. A log line never mixes with it: :meth:`StatusLine.write_out` erases the line,
writes the log text to stdout byte for byte, and only then may redraw (after flushing stdout, so the
log text lands first). Nothing here runs unless stderr is a terminal (:func:`enabled`): piped or
redirected output is exactly what it is without this module.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, TextIO

from tsm.runner.logs import start_thread as start_thread  # a thread that never takes Ctrl-C

if TYPE_CHECKING:
    from tsm.specs.api import AppStatus

#: Seconds between two redraws at most (about 4 Hz).
REDRAW = 0.25
#: Seconds between two status queries of an attached run at most.
POLL = 0.5

_ERASE = "\r\x1b[K"
_SPIN = "|/-\\"


def enabled(stream: TextIO | None = None) -> bool:
    """True when ``stream`` (default stderr) is a terminal that understands ANSI erase-line."""
    stream = sys.stderr if stream is None else stream
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):
        return False
    return tty and os.environ.get("TERM", "") != "dumb"


def elapsed(seconds: float) -> str:
    """``4.2s``, ``3m07s``, ``2h05m``: short enough for a status line."""
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    return f"{minutes // 60}h{minutes % 60:02d}m"


def status_text(status: AppStatus, since: float, started: frozenset[str] | set[str] = frozenset()) -> str:
    """``tsm: 3.1s | trainer: 2 running, 0 done, 0 failed | reader: ...``: one app's replicas per role.

    ``started`` names replicas (``role/k``) whose output has been seen: a replica that printed a line is
    running, whatever an older status query said, so the line never shows "1 pending" under its output.
    """
    from tsm.specs.api import AppState

    parts = []
    waiting = True
    for rs in status.roles:
        counts = dict.fromkeys(("running", "done", "failed", "cancelled", "pending"), 0)
        for rep in rs.replicas:
            key = {
                AppState.RUNNING: "running", AppState.SUCCEEDED: "done", AppState.FAILED: "failed",
                AppState.CANCELLED: "cancelled",
            }.get(rep.state, "pending")
            if key == "pending" and f"{rs.role}/{rep.id}" in started:
                key = "running"
            counts[key] += 1
        waiting = waiting and counts["pending"] == len(rs.replicas)
        shown = [f"{counts[k]} {k}" for k in ("running", "done", "failed")]
        shown += [f"{counts[k]} {k}" for k in ("cancelled", "pending") if counts[k]]
        parts.append(f"{rs.role}: {', '.join(shown)}")
    head = f"tsm: {'waiting for the app to start ' if waiting else ''}{elapsed(time.monotonic() - since)}"
    return " | ".join([head, *parts])


class StatusLine:
    """One line at the bottom of the terminal (on ``stream``, stderr), kept apart from the log lines.

    Thread-safe: the log follower writes through :meth:`write_out` / :meth:`write_err` while another
    thread calls :meth:`set` and :meth:`tick`. Invariant: while the line is shown, stdout's buffer is
    empty, so a flush of stdout from anywhere never prints over it.
    """

    def __init__(self, stream: TextIO | None = None, out: TextIO | None = None) -> None:
        self._stream = sys.stderr if stream is None else stream
        self._out = sys.stdout if out is None else out
        self._lock = threading.Lock()
        self._text = ""
        self._shown = False
        self._closed = False
        self._drawn_at = 0.0
        self._status: tuple[AppStatus, float] | None = None
        #: replicas (``role/k``) whose log lines went through :meth:`write_out`
        self.started: set[str] = set()

    def _width(self) -> int:
        try:
            cols = os.get_terminal_size(self._stream.fileno()).columns
        except (OSError, ValueError, AttributeError):
            cols = 0
        return cols if cols > 0 else 120

    def _draw(self) -> None:
        """Draw the text (lock held); the last column stays free so the terminal never wraps the line."""
        if self._status is not None:  # an app's counts: made now, with the replicas seen writing since
            self._text = status_text(self._status[0], self._status[1], self.started)
        if self._closed or not self._text:
            return
        self._out.flush()  # log text written while the line was hidden comes first
        self._stream.write(_ERASE + self._text[: self._width() - 1])
        self._stream.flush()
        self._shown = True
        self._drawn_at = time.monotonic()

    def _erase(self) -> None:
        if self._shown:
            self._stream.write(_ERASE)
            self._stream.flush()
            self._shown = False

    def _due(self) -> bool:
        return time.monotonic() - self._drawn_at >= REDRAW

    def set(self, text: str, force: bool = False) -> None:
        """Replace the text; drawn now if ``force`` or the last draw was :data:`REDRAW` ago or more."""
        with self._lock:
            self._text = text
            if force or self._due():
                self._draw()

    def show_status(self, status: AppStatus, since: float, force: bool = False) -> None:
        """Show ``status``'s replica counts (:func:`status_text`), redrawn with every replica seen writing."""
        with self._lock:
            self._status = (status, since)
            if force or self._due():
                self._draw()

    def tick(self) -> None:
        """Redraw if due (a line hidden by log output comes back, the elapsed time moves)."""
        with self._lock:
            if self._due() or not self._shown:
                self._draw()

    def write_out(self, text: str) -> None:
        """Write ``text`` (a log line) to stdout unchanged, with the status line out of its way."""
        with self._lock:
            self._erase()
            self._out.write(text)
            tag = text.partition(" ")[0]  # an attached run prefixes every line with its replica, role/k
            fresh = "/" in tag and tag not in self.started
            if fresh:
                self.started.add(tag)
            # a replica's first line under an app's counts: its count moves from pending at once
            if (fresh and self._status is not None) or self._due():
                self._draw()

    def write_err(self, text: str) -> None:
        """Write ``text`` (a whole line) to stderr, with the status line out of its way."""
        with self._lock:
            self._erase()
            self._out.flush()
            self._stream.write(text)
            self._stream.flush()
            if self._due():
                self._draw()

    def close(self) -> None:
        """Erase the line for good: later writes go straight through, nothing is drawn again."""
        with self._lock:
            self._erase()
            self._closed = True


def watch(runner: Any, handle: str, line: StatusLine, since: float) -> None:
    """Keep ``line`` showing ``handle``'s replicas until the app is terminal or unknown.

    Asks ``runner.status`` at most every :data:`POLL` seconds (never per log line) and redraws about
    every :data:`REDRAW` seconds in between, so the elapsed time moves. Returns without the final
    status: the caller asks ``runner.wait``, which then answers at once.
    """
    polls = max(1, round(POLL / REDRAW))
    while True:
        status = runner.status(handle)
        if status is None or status.state.is_terminal:
            return
        for _ in range(polls):
            line.show_status(status, since)
            time.sleep(REDRAW)


@contextlib.contextmanager
def step(label: str, stream: TextIO | None = None) -> Iterator[None]:
    """Show ``| label 1.2s`` (a spinner and the time so far) on a terminal while the block runs.

    Nothing at all when ``stream`` (default stderr) is not a terminal. The line is erased when the
    block ends, whatever it raised, so the next message starts on a clean line.
    """
    if not enabled(stream):
        yield
        return
    line = StatusLine(stream)
    stop = threading.Event()
    start = time.monotonic()

    def spin() -> None:
        i = 0
        while not stop.wait(REDRAW):  # nothing for a quick step: no flash of a line that is gone at once
            line.set(f"{_SPIN[i % len(_SPIN)]} {label} {elapsed(time.monotonic() - start)}")
            i += 1

    t = start_thread(spin)
    try:
        yield
    finally:
        stop.set()
        t.join()
        line.close()
