"""Replica logs of the local scheduler: plain files written by the replica, plus a time index.

Layout, per replica: ``<log_dir>/<role>/<k>/stdout``, ``.../stderr`` (what the process wrote, byte
for byte, appended across restarts) and ``.../index``. The replica writes its files directly, so a
slow reader or a dead supervisor can never stall it or lose a line. The supervisor watches the files
with inotify and appends one :data:`RECORD` per observed growth: ``(stream, end_offset, time)``.
The index gives each line a time (for ``since``/``until``) and the order in which the two streams
grew (for ``combined``). Bytes past the last record (the supervisor died, or has not caught up yet)
are read as if recorded at the file's modification time.
"""

from __future__ import annotations

import errno
import os
import struct

TYPE_CHECKING = False
if TYPE_CHECKING:
    import re
    from collections.abc import Callable, Iterator

#: stream code (1 stdout, 2 stderr), 7 pad bytes, end offset, unix time
RECORD = struct.Struct("<B7xQd")
STDOUT, STDERR = 1, 2
STREAM_FILES = {STDOUT: "stdout", STDERR: "stderr"}


def replica_dir(log_dir: str, role: str, k: int) -> str:
    """The directory holding replica ``k`` of ``role``'s files."""
    return os.path.join(log_dir, role, str(k))


def append_records(rdir: str, records: list[tuple[int, int, float]]) -> None:
    """Append index records (one write, O_APPEND so concurrent appends never interleave)."""
    if not records:
        return
    data = b"".join(RECORD.pack(s, end, t) for s, end, t in records)
    fd = os.open(os.path.join(rdir, "index"), os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        # The supervisor is the index's only writer. A record cut short earlier (a crash, a full disk) is
        # dropped first so every record stays aligned; a short write now is undone the same way.
        size = os.fstat(fd).st_size
        aligned = size - size % RECORD.size
        if aligned != size:
            os.ftruncate(fd, aligned)
        try:
            written = os.write(fd, data)
        except OSError:
            os.ftruncate(fd, aligned)
            raise
        if written != len(data):
            os.ftruncate(fd, aligned)
            raise OSError(errno.ENOSPC, "short write to the log index", os.path.join(rdir, "index"))
    finally:
        os.close(fd)


class _Segment:
    __slots__ = ("stream", "start", "end", "time")

    def __init__(self, stream: int, start: int, end: int, time: float) -> None:
        self.stream, self.start, self.end, self.time = stream, start, end, time


class ReplicaLogReader:
    """Reads one replica's lines in order, incrementally, so a tailer can call :meth:`poll` again.

    ``streams`` is a set of stream codes; lines come back as ``(time, text)`` with their newline,
    never split at a read boundary. :meth:`finish` returns the last lines that lacked a newline.
    """

    def __init__(self, rdir: str, streams: frozenset[int]) -> None:
        self.rdir = rdir
        self.streams = streams
        self._index_pos = 0
        self._pos = {STDOUT: 0, STDERR: 0}
        self._carry = {STDOUT: b"", STDERR: b""}
        self._files: dict[int, object] = {}

    def _file(self, stream: int) -> object | None:
        f = self._files.get(stream)
        if f is None:
            try:
                f = open(os.path.join(self.rdir, STREAM_FILES[stream]), "rb")  # noqa: SIM115
            except FileNotFoundError:
                return None
            self._files[stream] = f
        return f

    def _new_segments(self, drain: bool) -> Iterator[_Segment]:
        try:
            with open(os.path.join(self.rdir, "index"), "rb") as f:
                f.seek(self._index_pos)
                data = f.read()
        except FileNotFoundError:
            data = b""
        usable = len(data) - len(data) % RECORD.size
        self._index_pos += usable
        for stream, end, t in RECORD.iter_unpack(data[:usable]):
            if stream in self._pos and end > self._pos[stream]:
                yield _Segment(stream, self._pos[stream], end, t)
                self._pos[stream] = end
        if drain:  # bytes the index never covered: the supervisor died or had not caught up
            for stream, name in STREAM_FILES.items():
                try:
                    st = os.stat(os.path.join(self.rdir, name))
                except FileNotFoundError:
                    continue
                if st.st_size > self._pos[stream]:
                    yield _Segment(stream, self._pos[stream], st.st_size, st.st_mtime)
                    self._pos[stream] = st.st_size

    def poll(self, drain: bool = False) -> Iterator[tuple[float, bytes]]:
        """Complete lines that arrived since the last call; ``drain`` also reads unindexed bytes."""
        for seg in self._new_segments(drain):
            if seg.stream not in self.streams:
                continue
            f = self._file(seg.stream)
            if f is None:
                continue
            f.seek(seg.start)  # type: ignore[attr-defined]
            chunk = f.read(seg.end - seg.start)  # type: ignore[attr-defined]
            carry = self._carry[seg.stream]
            if carry:
                chunk = carry + chunk
            cut = chunk.rfind(b"\n") + 1
            self._carry[seg.stream] = chunk[cut:]
            if cut:
                t = seg.time
                for line in chunk[:cut].split(b"\n")[:-1]:
                    yield t, line

    def finish(self) -> Iterator[tuple[float, bytes]]:
        """The final line of each stream that ended without a newline (once the replica ended)."""
        for stream in (STDOUT, STDERR):
            carry = self._carry[stream]
            if carry:
                self._carry[stream] = b""
                try:
                    t = os.stat(os.path.join(self.rdir, STREAM_FILES[stream])).st_mtime
                except OSError:
                    t = 0.0
                yield t, carry

    def close(self) -> None:
        for f in self._files.values():
            f.close()  # type: ignore[attr-defined]
        self._files.clear()


def _decode(line: bytes) -> str:
    """Text of a log line; bytes that are not UTF-8 survive as surrogate escapes (``os.fsencode`` restores them)."""
    return line.decode("utf-8", "surrogateescape")


def read_lines(
    rdir: str,
    streams: frozenset[int],
    regex: str | None = None,
    since: float | None = None,
    until: float | None = None,
    wait_more: Callable[[], bool] | None = None,
    ended: bool = True,
) -> Iterator[str]:
    """Every line of a replica as text with its newline (the last one possibly without).

    Without ``wait_more`` the log is read once to its end; a last line without a newline is returned
    only when ``ended`` says the replica has ended (while it runs, that line is still being written).
    With ``wait_more`` (tailing), after each pass the reader calls ``wait_more()``, which blocks until
    there may be more and returns False once the replica has ended; a last pass drains what is left.
    """
    import re

    pattern = re.compile(regex) if regex else None
    if wait_more is None and since is None and until is None and len(streams) == 1:
        yield from _fast_single_stream(rdir, next(iter(streams)), pattern, ended)
        return
    reader = ReplicaLogReader(rdir, streams)
    try:
        while True:
            more = wait_more is not None and wait_more()
            batch = reader.poll(drain=not more)
            for t, raw in batch:
                if (since is not None and t < since) or (until is not None and t > until):
                    continue
                text = _decode(raw) + "\n"
                if pattern is None or pattern.search(text):
                    yield text
            if not more:
                break
        if wait_more is None and not ended:
            return
        for t, raw in reader.finish():
            text = _decode(raw)
            if (since is not None and t < since) or (until is not None and t > until):
                continue
            if pattern is None or pattern.search(text):
                yield text
    finally:
        reader.close()


def _fast_single_stream(rdir: str, stream: int, pattern: re.Pattern[str] | None, ended: bool) -> Iterator[str]:
    """One whole stream, read in large blocks: the common ``tsm log`` path for an ended replica."""
    try:
        f = open(os.path.join(rdir, STREAM_FILES[stream]), "rb")  # noqa: SIM115
    except FileNotFoundError:
        return
    with f:
        carry = b""
        while True:
            block = f.read(1 << 20)
            if not block:
                break
            block = carry + block
            cut = block.rfind(b"\n") + 1
            carry = block[cut:]
            if not cut:
                continue
            text = _decode(block[:cut])
            lines = [s + "\n" for s in text.split("\n")[:-1]]
            if pattern is not None:
                lines = [ln for ln in lines if pattern.search(ln)]
            yield from lines
        if carry and ended:
            last = _decode(carry)
            if pattern is None or pattern.search(last):
                yield last
