"""Replica output inside the supervisor: pipes to log files, and the log index.

Owns where an attempt's stdout and stderr go (pipes while descriptors allow, else the files
themselves), moving pipe contents into the log files in bounded batches, and indexing log growth so
followers and ``since``/``until`` queries find lines. Split from ``supervisor.py`` to keep each
module readable; behaviour is the supervisor's (see its module docstring).
"""

from __future__ import annotations

import contextlib
import os
import time

from tsm.schedulers.local.logs import STDERR, STDOUT, append_records
from tsm.schedulers.local.state import (
    FD_RESERVE,
    FILE_INDEX_INTERVAL,
    FILE_INDEX_SHARE,
    INDEX_INTERVAL,
    PIPE_BATCH,
    Pipe,
    Replica,
    SupervisorState,
)


class OutputPump(SupervisorState):
    """Moves replica output to the log files and keeps the log index current."""

    def _room_for_pipes(self) -> bool:
        """True while one more attempt's pipes (2 read ends, 2 files held, 2 write ends for a moment)
        leave :data:`FD_RESERVE` descriptors free."""
        return self.fd_base + 2 * len(self.pipes) + len(self.clients) + 6 + FD_RESERVE <= self.fd_limit

    def _outputs(self, rep: Replica) -> tuple[int, int, list[tuple[int, int]]]:
        """The descriptors the attempt writes to (stdout, stderr), and ``(read end, log file)`` to watch.

        Pipes while descriptors allow, else the files themselves (``O_APPEND``) and nothing to watch.
        """
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
        files = [os.path.join(rep.rdir, "stdout"), os.path.join(rep.rdir, "stderr")]
        if self._room_for_pipes():
            made: list[int] = []
            try:
                r1, w1 = os.pipe2(os.O_CLOEXEC)
                made += [r1, w1]
                r2, w2 = os.pipe2(os.O_CLOEXEC)
                made += [r2, w2]
                f1 = os.open(files[0], flags, 0o600)
                made.append(f1)
                f2 = os.open(files[1], flags, 0o600)
            except OSError:
                for fd in made:
                    os.close(fd)
            else:
                return w1, w2, [(r1, f1), (r2, f2)]
        out = os.open(files[0], flags, 0o600)
        try:
            err = os.open(files[1], flags, 0o600)
        except OSError:
            os.close(out)
            raise
        return out, err, []

    def _write(self, fd: int, path: str, data: bytes) -> None:
        """Append ``data`` to the log file open at ``fd``; a failure (a full disk) is noted once per file."""
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        except OSError as e:
            if path not in self.write_failed:
                self.write_failed.add(path)
                self._note(f"output lost: cannot write {path}: {e.strerror or e}")

    def _read_pipe(self, pipe: Pipe, drain: bool = False) -> None:
        """Move what is in ``pipe`` to its file (up to :data:`PIPE_BATCH`, or all that is there with ``drain``)."""
        chunks: list[bytes] = []
        total = 0
        eof = False
        while total < (PIPE_BATCH * 16 if drain else PIPE_BATCH):
            try:
                data = os.read(pipe.fd, 65536)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                data = b""
            if not data:
                eof = True
                break
            chunks.append(data)
            total += len(data)
        if chunks:
            self._write(pipe.out, pipe.path, b"".join(chunks))
            self.log_pending[id(pipe.rep)] = pipe.rep
            self._schedule_index()
        if eof:
            self._close_pipe(pipe)

    def _close_pipe(self, pipe: Pipe) -> None:
        if self.pipes.pop(pipe.fd, None) is None:
            return
        with contextlib.suppress(KeyError, ValueError):
            self.sel.unregister(pipe.fd)
        os.close(pipe.fd)
        os.close(pipe.out)
        with contextlib.suppress(ValueError):
            pipe.rep.pipes.remove(pipe)

    def _index(self, rep: Replica) -> None:
        now = time.time()
        records = []
        for stream, name in ((STDOUT, "stdout"), (STDERR, "stderr")):
            try:
                size = os.stat(os.path.join(rep.rdir, name)).st_size
            except OSError:
                continue
            if size > rep.sizes[stream]:
                rep.sizes[stream] = size
                records.append((stream, size, now))
        if records:
            try:
                append_records(rep.rdir, records)
            except OSError as e:  # a full disk: the index only speeds up since/until; the logs are intact
                self._note(f"log index of {rep.name} not updated: {e}")
            self.log_dirty = True

    def _schedule_index(self) -> None:
        """Index pending replicas now, or within INDEX_INTERVAL if they just were (bounds a busy log)."""
        now = time.monotonic()
        if self.log_pending and self.index_due is None:
            if now - self.last_index >= INDEX_INTERVAL:
                self._index_pending()
            else:
                self.index_due = self.last_index + INDEX_INTERVAL

    def _index_pending(self) -> None:
        pending, self.log_pending = self.log_pending, {}
        self.index_due = None
        self.last_index = time.monotonic()
        for rep in pending.values():
            self._index(rep)

    def _index_direct(self) -> None:
        """Index the replicas that write their files themselves (their growth raises no event here).

        A replica signalled to stop since the last pass is left out of this one: most end at once, and their
        end indexes them (``_replica_ended``); one that outlives the signal is indexed from the next pass on.
        On a cancel of thousands of replicas a pass over them all (two ``stat`` each) was a quarter of the
        supervisor's time between the cancel and the last exit.
        """
        self.file_index_due = None
        start = time.monotonic()
        direct = [r for r in self.replicas if r.direct and r.live()]
        skip, self.just_stopped = self.just_stopped, set()
        for rep in direct:
            if id(rep) not in skip:
                self._index(rep)
        if direct:
            now = time.monotonic()
            self.file_index_due = now + max(FILE_INDEX_INTERVAL, FILE_INDEX_SHARE * (now - start))
