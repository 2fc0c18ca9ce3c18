"""Replica logs of the local scheduler: plain files per replica and stream, plus a time index.

Layout, per replica: ``<log_dir>/<role>/<k>/stdout``, ``.../stderr`` (what the process wrote, byte
for byte, appended across restarts) and ``.../index``. The supervisor appends one :data:`RECORD` per
observed growth: ``(stream, end_offset, time)``. The index gives each line a time (for
``since``/``until``) and the order in which the two streams grew (for ``combined``). Bytes past the
last record (the supervisor died, or has not caught up yet) are read as if recorded at the file's
modification time.

**Attempts.** A replica restarted by a retry policy appends to the same files. Two control records
in the index mark it: :data:`RESTART` when the supervisor decides the restart (so a follower knows
the ended replica will write again) and :data:`ATTEMPT` (end field: the attempt's number, 1 for the
first retry) right before the new attempt starts, after records covering all that the previous
attempt wrote. Readers cut lines at attempt boundaries (an unfinished last line of one attempt is
its own line, never glued to the next attempt's first) and can select one attempt. Readers skip
records they do not know, so an older reader still reads the logs.

**What a line is.** Lines end at ``\\n``. A line longer than :data:`MAX_LINE` bytes comes out in
pieces of at most :data:`MAX_LINE` bytes (cut between UTF-8 characters), the last piece with the
``\\n``: readers keep linear time and bounded memory whatever a replica writes, and the pieces
concatenate to the log byte for byte (``regex``, ``since`` and ``until`` apply to each piece).
Followers (tailing) also end a line at ``\\r`` and keep the ``\\r``, so a progress bar that redraws
itself with ``\\r`` shows each redraw as it is completed instead of nothing until its final ``\\n``.
Text is decoded as UTF-8; other bytes survive as surrogate escapes (``os.fsencode`` restores them).
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import struct
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Generator, Iterable, Iterator
    from typing import Any, BinaryIO

#: stream code (1 stdout, 2 stderr; control records below), 7 pad bytes, end offset, unix time
RECORD = struct.Struct("<B7xQd")
STDOUT, STDERR = 1, 2
#: control record: a restart of the replica is decided; end field: the attempt that will follow
RESTART = 8
#: control record: attempt ``end`` starts here; every byte indexed before belongs to earlier attempts
ATTEMPT = 9
STREAM_FILES = {STDOUT: "stdout", STDERR: "stderr"}

#: bytes: a longer line is returned in pieces of at most this size (see the module docstring)
MAX_LINE = 1 << 20
#: the most bytes read from a log file at a time (:data:`SPLIT_CHUNK` while no long line is held, see
#: :meth:`LineSplitter.read_size`); at most MAX_LINE, so only a line that began in an earlier block can
#: be longer than MAX_LINE within one block
BLOCK = 1 << 20
#: index bytes read at a time (whole records)
_INDEX_BLOCK = RECORD.size * 4096


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


def mark_restart(rdir: str, attempt: int) -> bool:
    """Record that the replica will be restarted as ``attempt``; False if the index could not be written.

    The supervisor calls it when it decides the restart, before the replica's ended state reaches the
    store: a follower that sees the replica ended then finds this record and keeps following.
    """
    try:
        append_records(rdir, [(RESTART, attempt, time.time())])
    except OSError:
        return False
    return True


def mark_attempt(rdir: str, attempt: int) -> bool:
    """Record that ``attempt`` starts now (call it right before launching it); False if not written.

    The record is preceded, in the same write, by records of both files' current sizes, so what the
    earlier attempts wrote is attributed to them even if their last growth was never indexed.
    """
    now = time.time()
    records: list[tuple[int, int, float]] = []
    for stream, name in STREAM_FILES.items():
        with contextlib.suppress(OSError):
            records.append((stream, os.stat(os.path.join(rdir, name)).st_size, now))
    records.append((ATTEMPT, attempt, now))
    try:
        append_records(rdir, records)
    except OSError:
        return False
    return True


def _decode(line: bytes) -> str:
    """Text of a log line; bytes that are not UTF-8 survive as surrogate escapes (``os.fsencode`` restores them)."""
    return line.decode("utf-8", "surrogateescape")


#: What ``str.splitlines`` breaks at besides ``\n``: in ASCII text, and beyond it.
_ASCII_BREAKS = ("\r", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e")
_OTHER_BREAKS = ("\x85", "\u2028", "\u2029")


def _split_newlines(text: str) -> list[str]:
    r"""``text`` (which ends with ``\n``) cut after each ``\n`` only, each line keeping its ``\n``.

    ``str.splitlines`` does that in one pass and makes each line once, but it also breaks at ``\r``,
    ``\v``, ``\f``, ``\x1c``-``\x1e``, ``\x85``, U+2028 and U+2029: it is used only when the block
    holds none of those (a few fast ``in`` scans; logs almost never do), else split and re-append.
    """
    if not any(c in text for c in _ASCII_BREAKS) and (text.isascii() or not any(c in text for c in _OTHER_BREAKS)):
        return text.splitlines(True)
    lines = text.split("\n")
    lines.pop()
    return [ln + "\n" for ln in lines]


def _utf8_cut(data: bytes, limit: int) -> int:
    """A cut point at most ``limit`` (>0) that does not split a UTF-8 character (``limit`` if none is near)."""
    i = limit
    while i > limit - 4 and i > 0 and data[i] & 0xC0 == 0x80:
        i -= 1
    return i if i > limit - 4 and i > 0 else limit


def _pieces(data: bytes, whole: bool) -> tuple[list[str], bytes]:
    """Cut ``data`` into decoded pieces of at most MAX_LINE bytes.

    With ``whole`` every byte goes into a piece; otherwise the rest (at most MAX_LINE bytes) is
    returned undecoded, to be continued.
    """
    out = []
    start = 0
    while len(data) - start > MAX_LINE:
        cut = start + _utf8_cut(data[start : start + MAX_LINE + 1], MAX_LINE)
        out.append(_decode(data[start:cut]))
        start = cut
    if whole:
        if start < len(data):
            out.append(_decode(data[start:]))
        return out, b""
    return out, data[start:]


#: bytes of complete lines decoded and split at a time: the lines of a 1 MiB block, made all at once,
#: no longer fit in the CPU's caches by the time the caller walks them; 64 KiB batches do (measured:
#: about 1.5x the lines per second).
SPLIT_CHUNK = 1 << 16


def _line_batches(head: bytes) -> list[list[str]]:
    r"""Complete lines ``head`` (ending with ``\n``, none longer than MAX_LINE) in batches of about
    :data:`SPLIT_CHUNK` bytes, cut after a ``\n`` (which never falls inside a UTF-8 character, and
    decoding stops at it whatever came before, so the text is the same as decoding the whole)."""
    if len(head) <= SPLIT_CHUNK:
        return [_split_newlines(_decode(head))]
    out = []
    start, n = 0, len(head)
    while start < n:
        stop = head.rfind(b"\n", start, start + SPLIT_CHUNK) + 1
        if stop <= start:  # one line longer than a chunk: up to its end (head ends with a newline)
            stop = head.find(b"\n", start + SPLIT_CHUNK) + 1
        out.append(_split_newlines(_decode(head[start:stop])))
        start = stop
    return out


class LineSplitter:
    """Cuts one stream's bytes into lines as text, in linear time with at most MAX_LINE bytes held.

    :meth:`feed` takes the next bytes (at most :data:`BLOCK`) and returns the lines they complete,
    each with its terminator (``\\n``; also ``\\r`` when ``cr``), and pieces of a line that grew past
    :data:`MAX_LINE`. :meth:`flush` returns the unfinished rest, if any.
    """

    __slots__ = ("carry", "cr")

    def __init__(self, cr: bool = False) -> None:
        self.carry = b""
        self.cr = cr

    def feed(self, block: bytes) -> list[str]:
        out: list[str] = []
        for batch in self.feed_batches(block):
            out += batch
        return out

    def feed_batches(self, block: bytes) -> list[list[str]]:
        """:meth:`feed`'s lines in batches (non-empty lists, in order), for a reader to pass on one by one."""
        data = self.carry + block if self.carry else block
        end = (max(data.rfind(b"\n"), data.rfind(b"\r")) if self.cr else data.rfind(b"\n")) + 1
        out: list[list[str]] = []
        start = 0
        if end:
            # The carry and a block are at most MAX_LINE bytes each, so only the first line can be
            # longer than MAX_LINE.
            first = data.find(b"\n") + 1
            if self.cr:
                r = data.find(b"\r") + 1
                first = r if r and (not first or r < first) else first
            if first > MAX_LINE:
                out.append(_pieces(data[:first], whole=True)[0])
                start = first
            if end > start:
                head = data[start:end] if start or end < len(data) else data
                if self.cr and b"\r" in head:
                    out.append([_decode(ln) for ln in head.splitlines(True)])
                else:
                    out += _line_batches(head)
        rest = data[end:] if end else data
        if len(rest) > MAX_LINE:
            pieces, rest = _pieces(rest, whole=False)
            if pieces:
                out.append(pieces)
        self.carry = rest
        return out

    def read_size(self) -> int:
        """How many bytes to read next: :data:`SPLIT_CHUNK` (what stays in the CPU's caches) while no long
        line is being held, :data:`BLOCK` once one is (so a long line is not copied over and over)."""
        return BLOCK if len(self.carry) >= SPLIT_CHUNK else SPLIT_CHUNK

    def flush(self) -> str | None:
        """The unfinished last line (no terminator), or None; the splitter is empty afterwards."""
        if not self.carry:
            return None
        text, self.carry = _decode(self.carry), b""
        return text


#: what a reader yields: ``(time, lines)`` (a batch of lines of that time), or ``(time, n)`` where
#: attempt ``n`` begins
Item = tuple[float, "list[str] | int"]


class ReplicaLogReader:
    """Reads one replica's lines in order, incrementally, so a follower can call :meth:`poll` again.

    ``streams`` is a set of stream codes. :meth:`poll` yields ``(time, lines)`` batches and
    ``(time, n)`` where attempt ``n`` begins; :attr:`attempt` is the attempt of the last batch yielded
    and :attr:`restart_pending` says the replica is to be restarted. No file stays open between calls,
    so a follower of thousands of replicas holds no descriptor per replica.
    """

    def __init__(self, rdir: str, streams: frozenset[int], cr: bool = False) -> None:
        self.rdir = rdir
        self.streams = streams
        self.attempt = 0
        self.restart_pending = False
        self._index_pos = 0
        self._pos = {STDOUT: 0, STDERR: 0}
        self._split = {STDOUT: LineSplitter(cr), STDERR: LineSplitter(cr)}
        self._files: dict[int, BinaryIO] = {}

    def _records(self) -> Iterator[tuple[int, int, float]]:
        path = os.path.join(self.rdir, "index")
        try:
            if os.stat(path).st_size - self._index_pos < RECORD.size:
                return
            f = open(path, "rb")  # noqa: SIM115
        except FileNotFoundError:
            return
        with f:
            f.seek(self._index_pos)
            while True:
                data = f.read(_INDEX_BLOCK)
                usable = len(data) - len(data) % RECORD.size
                if not usable:
                    return
                self._index_pos += usable
                yield from RECORD.iter_unpack(data[:usable])
                if usable < _INDEX_BLOCK:
                    return

    def _read(self, stream: int, end: int, t: float) -> Iterator[Item]:
        start = self._pos[stream]
        self._pos[stream] = end
        if stream not in self.streams:
            return
        f = self._files.get(stream)
        if f is None:
            try:
                f = self._files[stream] = open(os.path.join(self.rdir, STREAM_FILES[stream]), "rb")  # noqa: SIM115
            except FileNotFoundError:
                return
        f.seek(start)
        left = end - start
        split = self._split[stream]
        while left > 0:
            block = f.read(min(split.read_size(), left))
            if not block:  # shorter than recorded (the disk filled up): nothing more to read here
                return
            left -= len(block)
            for lines in split.feed_batches(block):
                yield t, lines

    def _end_attempt(self, t: float) -> Iterator[Item]:
        for stream in (STDOUT, STDERR):
            last = self._split[stream].flush()
            if last is not None:
                yield t, [last]

    def poll(self, drain: bool = False) -> Iterator[Item]:
        """Lines that arrived since the last call; ``drain`` also reads bytes not indexed yet."""
        try:
            for code, end, t in self._records():
                if code in self._pos:
                    if end > self._pos[code]:
                        yield from self._read(code, end, t)
                elif code == RESTART:
                    self.restart_pending = True
                elif code == ATTEMPT:
                    yield from self._end_attempt(t)
                    self.attempt, self.restart_pending = end, False
                    yield t, end
            if drain:  # bytes the index never covered: the supervisor died or had not caught up
                for stream, name in STREAM_FILES.items():
                    try:
                        st = os.stat(os.path.join(self.rdir, name))
                    except FileNotFoundError:
                        continue
                    if st.st_size > self._pos[stream]:
                        yield from self._read(stream, st.st_size, st.st_mtime)
        finally:
            self.close()

    def finish(self) -> Iterator[Item]:
        """The final line of each stream that ended without a newline (once the replica ended)."""
        for stream in (STDOUT, STDERR):
            last = self._split[stream].flush()
            if last is not None:
                try:
                    t = os.stat(os.path.join(self.rdir, STREAM_FILES[stream])).st_mtime
                except OSError:
                    t = 0.0
                yield t, [last]

    def close(self) -> None:
        """Close the files :meth:`poll` opened (it does so itself when it finishes)."""
        for f in self._files.values():
            f.close()
        self._files.clear()


def attempt_bounds(rdir: str, stream: int) -> list[int]:
    """Offsets in ``stream``'s file where attempts 1, 2, ... begin, from the index."""
    bounds: list[int] = []
    reader = ReplicaLogReader(rdir, frozenset())
    pos = 0
    for code, end, _ in reader._records():  # noqa: SLF001 - same module
        if code == stream:
            pos = max(pos, end)
        elif code == ATTEMPT:
            bounds.append(pos)
    return bounds


def read_stream(rdir: str, stream: int, ended: bool, attempt: int | None = None) -> Iterator[list[str] | int]:
    """One whole stream read in large blocks, without the index's times: the common ``tsm log`` path.

    Yields batches of lines, and ``n`` (an int) where attempt ``n`` begins; only ``attempt``'s lines
    when given. The unfinished last line is yielded only when ``ended`` (while the replica runs it is
    still being written).
    """
    try:
        f = open(os.path.join(rdir, STREAM_FILES[stream]), "rb")  # noqa: SIM115
    except FileNotFoundError:
        return
    with f:
        bounds = attempt_bounds(rdir, stream)
        for n in range(len(bounds) + 1):
            start = bounds[n - 1] if n else 0
            stop = bounds[n] if n < len(bounds) else None
            if n:
                yield n
            if attempt is not None and n != attempt:
                continue
            split = LineSplitter()
            f.seek(start)
            left = None if stop is None else stop - start
            while left is None or left > 0:
                size = split.read_size()
                block = f.read(size if left is None else min(size, left))
                if not block:
                    break
                if left is not None:
                    left -= len(block)
                yield from split.feed_batches(block)
            last = split.flush()
            if last is not None and (ended or stop is not None):
                yield [last]


class LogEvent:
    """One thing a follower of many replicas reports: a line of replica ``role``/``k``, or an attempt start.

    ``text`` is the line (with its ``\\n``, or ``\\r`` when following; an unfinished last line or a
    piece of a long line has neither); ``attempt`` is the attempt it belongs to; ``marker`` is True
    for the event that says attempt ``attempt`` begins (its ``text`` is empty).
    """

    __slots__ = ("role", "k", "text", "attempt", "marker")

    def __init__(self, role: str, k: int, text: str, attempt: int, marker: bool = False) -> None:
        self.role, self.k, self.text, self.attempt, self.marker = role, k, text, attempt, marker

    def __repr__(self) -> str:
        what = f"attempt {self.attempt} begins" if self.marker else repr(self.text)
        return f"LogEvent({self.role}/{self.k}: {what})"


#: replica states a follower is told of: still running (or starting); ended, but a retry of another
#: replica may restart it; ended for good (unless its index records a pending restart)
RUNNING, ENDED_MAY_RESTART, ENDED = 0, 1, 2


class _Target:
    __slots__ = ("role", "k", "reader")

    def __init__(self, role: str, k: int, reader: ReplicaLogReader) -> None:
        self.role, self.k, self.reader = role, k, reader


#: seconds of pause, per followed replica, between two passes over their indexes while logs grow:
#: bounds a follower of thousands of replicas to a small share of a core (1,500 replicas: 30 ms)
PASS_PAUSE_PER_REPLICA = 20e-6


class Lines:
    """The lines :func:`follow` yields with ``text_only``, made from its batches at C speed.

    Iterating it (``for``, ``list``, ``sum``) walks each batch (a list of lines) with
    :func:`itertools.chain.from_iterable`, so no Python frame runs per line: about 2.5x the lines per
    second of yielding them one by one through generators. ``next()`` works too (through the same
    iterator, so both can be mixed), and :meth:`close` stops the reading as a generator's would.
    """

    __slots__ = ("_batches", "_it")

    def __init__(self, batches: Generator[list[str], None, None]) -> None:
        self._batches = batches
        self._it: Iterator[str] = itertools.chain.from_iterable(batches)

    def __iter__(self) -> Iterator[str]:
        return self._it

    def __next__(self) -> str:
        return next(self._it)

    def close(self) -> None:
        """Stop reading (what closing the generator did): files and connections are let go at once."""
        self._batches.close()


def follow(
    targets: Iterable[tuple[str, int, str]],
    streams: frozenset[int],
    states: Callable[[], tuple[bool, dict[tuple[str, int], int]]],
    wait_event: Callable[[], str] | None = None,
    regex: str | None = None,
    since: float | None = None,
    until: float | None = None,
    attempt: int | None = None,
    idle: Callable[[], None] | None = None,
    text_only: bool = False,
) -> Iterator[Any]:
    """The lines of many replicas ``(role, k, replica_dir)`` of one app, in one thread, with no fd each.

    ``states()`` returns ``(app_ended, {(role, k): RUNNING | ENDED_MAY_RESTART | ENDED})``. Without
    ``wait_event`` every log is read once to its end (an unfinished last line only from a replica
    that ended). With it (following), after each pass the follower calls ``wait_event()``, which
    blocks until the app's supervisor reports something and returns what (``"S"``: a state changed,
    ``"L"``: logs grew); a replica is followed across its attempts until it has ended for good (its
    app ended, or it ended with no restart recorded or possible) and its log is drained. ``idle()``
    is called before each wait (a printer flushes its output there rather than after every line).
    Yields :class:`LogEvent` objects, or with ``text_only`` just the lines (for one replica: fast), as
    :class:`Lines`.
    """
    batches = _follow(targets, streams, states, wait_event, regex, since, until, attempt, idle, text_only)
    return Lines(batches) if text_only else batches


def _emit(tg: _Target, batches: Iterable[tuple[float, list[str] | int]], text_only: bool, pattern: Any,
          attempt: int | None, since: float | None, until: float | None) -> Iterator[Any]:
    """What :func:`_follow` yields of a replica's batches: the lines kept by the filters, as batches (lists)
    with ``text_only``, else as events, with a marker event where an attempt begins."""
    reader = tg.reader
    for t, item in batches:
        if isinstance(item, int):
            if not text_only:
                yield LogEvent(tg.role, tg.k, "", item, True)
            continue
        if (attempt is not None and reader.attempt != attempt) or (since is not None and t < since) or (
                until is not None and t > until):  # fmt: skip
            continue
        if pattern is not None:
            item = [ln for ln in item if pattern.search(ln)]
        if text_only:
            if item:
                yield item  # the whole batch: Lines walks it in C
        else:
            n = reader.attempt
            for ln in item:
                yield LogEvent(tg.role, tg.k, ln, n)


def _follow(targets: Iterable[tuple[str, int, str]], streams: frozenset[int],
            states: Callable[[], tuple[bool, dict[tuple[str, int], int]]], wait_event: Callable[[], str] | None,
            regex: str | None, since: float | None, until: float | None, attempt: int | None,
            idle: Callable[[], None] | None, text_only: bool) -> Generator[Any, None, None]:
    """:func:`follow`'s generator: with ``text_only`` it yields batches (lists) of lines, else events."""
    import re

    pattern = re.compile(regex) if regex else None
    tail = wait_event is not None
    live = [_Target(role, k, ReplicaLogReader(rdir, streams, cr=tail)) for role, k, rdir in targets]

    def emit(tg: _Target, batches: Iterable[tuple[float, list[str] | int]]) -> Iterator[Any]:
        return _emit(tg, batches, text_only, pattern, attempt, since, until)

    if not tail and since is None and until is None and len(streams) == 1:
        app_ended, st = states()
        stream = next(iter(streams))
        for tg in live:
            ended = app_ended or st.get((tg.role, tg.k), RUNNING) != RUNNING
            for batch in read_stream(tg.reader.rdir, stream, ended, attempt):
                if isinstance(batch, int):
                    tg.reader.attempt = batch
                yield from emit(tg, ((0.0, batch),))
        return

    check_states = True
    app_ended, st = False, dict[tuple[str, int], int]()
    last_pass = 0.0
    while live:
        if check_states:
            app_ended, st = states()  # before reading the indexes: a restart is recorded before the state
        else:
            pause = PASS_PAUSE_PER_REPLICA * len(live) - (time.monotonic() - last_pass)
            if pause > 0:
                time.sleep(pause)  # coalesce the growth of many replicas into one pass
        last_pass = time.monotonic()
        still = []
        for tg in live:
            state = st.get((tg.role, tg.k), RUNNING)
            reader = tg.reader
            before = reader.attempt
            yield from emit(tg, reader.poll(drain=not tail))
            # Decided only right after reading the states, and read before the index: a restart is recorded
            # before the replica's end reaches the store, and an attempt that started since makes them stale.
            done = app_ended or (
                check_states and state == ENDED and not reader.restart_pending and reader.attempt == before
            )
            if tail and done:
                yield from emit(tg, reader.poll(drain=True))
            if not tail:
                if state != RUNNING or app_ended:
                    yield from emit(tg, tg.reader.finish())
            elif done:
                yield from emit(tg, tg.reader.finish())
            else:
                still.append(tg)
        live = still
        if not live or wait_event is None:
            return
        if idle is not None:
            idle()
        check_states = "S" in wait_event()
