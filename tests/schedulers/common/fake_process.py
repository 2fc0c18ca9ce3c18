"""A fake container's process, for the fake Docker engine and the fake Kubernetes cluster.

A "container" of the fakes is a real local process (its image is ignored): the replica's command with exactly
the env it was given (plus ``PATH``), in its own process group, its stdout and stderr recorded piece by piece
with the time each piece came (as an engine's log keeps them). So the conformance suite's checks that need
a process (its pid, its tree, its bytes) hold on the fakes as they do on the real engines.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Piece:
    """A run of bytes one stream wrote (a line, or the part of one a read gave), and when."""

    when: float
    stream: str
    data: bytes


@dataclass
class FakeProcess:
    """One start of a container's command; :meth:`start` it, then read :attr:`pieces` or :meth:`follow`."""

    command: list[str]
    env: dict[str, str]
    #: combine stderr into stdout (a Kubernetes log) instead of keeping them apart (Docker)
    combined: bool = False
    pieces: list[Piece] = field(default_factory=list)
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    finished: float = 0.0
    returncode: int | None = None
    error: str = ""
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _readers: list[threading.Thread] = field(default_factory=list)

    def start(self) -> bool:
        """Start the command; False (with :attr:`error`) when it cannot be run."""
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **self.env}
        try:
            self.proc = subprocess.Popen(
                self.command, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT if self.combined else subprocess.PIPE, start_new_session=True,
            )
        except OSError as e:
            self.error = f"exec: {e.strerror}: {self.command[0]}"
            self.returncode, self.finished = 127, time.time()
            return False
        self.started = time.time()
        streams = [("stdout", self.proc.stdout)] + ([] if self.combined else [("stderr", self.proc.stderr)])
        t = threading.Thread(target=self._read, args=(streams,), daemon=True)
        t.start()
        self._readers.append(t)
        return True

    def _read(self, streams: list[tuple[str, Any]]) -> None:
        """One reader for both pipes (as one runtime reads a container's streams), recording pieces in order.

        When both pipes have data at once (this thread was starved: the machine is loaded), their true order
        is unknown; whole lines are recorded before an unterminated one, which a program writes last.
        """
        import select

        open_fds = {pipe.fileno(): name for name, pipe in streams}
        while open_fds:
            ready, _, _ = select.select(list(open_fds), [], [])
            got: list[tuple[str, bytes]] = []
            for fd in ready:
                data = os.read(fd, 65536)
                if not data:
                    del open_fds[fd]
                    continue
                got.append((open_fds[fd], data))
            now = time.time()
            lines = [(name, line) for name, data in got for line in data.splitlines(keepends=True)]
            lines.sort(key=lambda nl: not nl[1].endswith(b"\n"))  # stable: whole lines first
            with self._lock:
                for name, line in lines:
                    self.pieces.append(Piece(now, name, line))

    def wait(self) -> int:
        """Wait for the end (and the last output); the exit code as Docker gives it (128+signal)."""
        if self.proc is None:
            return self.returncode if self.returncode is not None else 127
        rc = self.proc.wait()
        for t in self._readers:
            t.join(timeout=5)
        self.returncode = 128 - rc if rc < 0 else rc
        self.finished = time.time()
        return self.returncode

    @property
    def running(self) -> bool:
        return self.proc is not None and self.returncode is None

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the whole process group (what a runtime does to a container's processes)."""
        if self.proc is not None and self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)

    def signal_handlers(self, sig: int) -> bool:
        """Send ``sig`` to each process of the container that handles it, as the warning's script
        (:func:`tsm.schedulers.common.warn.handlers_script`) does inside a real one; False when none does."""
        from tsm.schedulers.common.warn import catches
        from tsm.schedulers.local import _os

        if self.proc is None or self.returncode is not None:
            return False
        sent = False
        for name in os.listdir("/proc"):
            if name.isdigit() and (_os.ids(int(name)) or (0, 0))[1] == self.proc.pid and catches(int(name), sig):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(name), sig)
                    sent = True
        return sent

    def stop(self, grace: float) -> None:
        """SIGTERM, then SIGKILL after ``grace`` seconds (the end is seen by whoever waits)."""
        self.signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        while self.running and time.monotonic() < deadline:
            time.sleep(0.01)
        self.signal(signal.SIGKILL)

    def output(self, streams: tuple[str, ...], since: float | None = None, until: float | None = None,
               timestamps: bool = False) -> bytes:
        """What the chosen streams wrote (in the order written), optionally within a time window."""
        return b"".join(self.output_pieces(streams, since, until, timestamps))

    def output_pieces(self, streams: tuple[str, ...], since: float | None = None, until: float | None = None,
                      timestamps: bool = False) -> Iterator[bytes]:
        """:meth:`output` piece by piece (a streamed read: never all of it at once)."""
        with self._lock:
            pieces = list(self.pieces)
        for p in pieces:
            if p.stream not in streams or (since is not None and p.when < since) or (until is not None and p.when > until):
                continue
            yield (stamp(p.when) + b" " if timestamps else b"") + p.data

    def follow(self, streams: tuple[str, ...], since: float | None = None) -> Iterator[bytes]:
        """The chosen streams' bytes as they come, until the process has ended and everything is given."""
        given = 0
        while True:
            done = not self.running
            with self._lock:
                new = self.pieces[given:]
            given += len(new)
            data = b"".join(p.data for p in new if p.stream in streams and (since is None or p.when >= since))
            if data:
                yield data
            if done:
                return
            time.sleep(0.02)


def stamp(when: float) -> bytes:
    """An RFC 3339 time with nanoseconds, as Docker and the kubelet stamp log lines."""
    base = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(when))
    return f"{base}.{int((when % 1) * 1e9):09d}Z".encode()


def rfc3339(when: float) -> str:
    """An RFC 3339 time (to the nanosecond, as Docker's inspect gives it)."""
    return stamp(when).decode()
