"""Log reading every backend shares: which replica and stream, following, filtering, splitting lines.

* :func:`check_replica` refuses a role or replica the app does not have, naming the valid ones;
  :func:`check_log_target` does it for a ``log_iter`` (an unknown app first), :func:`replica_counts` gives
  the roles it checks against for backends that keep the submitted shape.
* :func:`stream_names` turns a :class:`~tsm.schedulers.api.Stream` into the outputs to read.
* :func:`follow` turns "read what is new" and "has it ended" into a line iterator that stops at the end.
* :func:`filter_regex`, :func:`in_window` filter; :func:`split_lines`, :func:`split_lines_iterator` split;
  :func:`utf8_chunks` re-cuts a byte stream so each chunk decodes on its own.

Lines are ``str`` that end with ``\\n`` (except possibly the last of a log); bytes that are not UTF-8 are
kept as surrogate escapes, so nothing a replica printed is lost.
"""

from __future__ import annotations

import enum
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from tsm.errors import UnknownAppError

TYPE_CHECKING = False
if TYPE_CHECKING:  # kept out of the import: tsm.schedulers.api imports this module, and start-up counts
    from datetime import datetime
    from os import PathLike


class Stream(str, enum.Enum):
    """Which output of a replica to read: stdout, stderr, or both in the order they were written (also
    :class:`tsm.schedulers.api.Stream`, its home in the interface)."""

    STDOUT = "stdout"
    STDERR = "stderr"
    COMBINED = "combined"


def check_replica(app_id: str, roles: Mapping[str, int], role_name: str, replica_id: int) -> None:
    """Raise :class:`UnknownAppError` unless ``role_name`` is one of ``roles`` (name -> replica count) and
    ``replica_id`` one of its replicas; the message lists the valid ones."""
    if role_name not in roles:
        raise UnknownAppError(f"app '{app_id}' has no role '{role_name}' (roles: {', '.join(roles)})")
    n = roles[role_name]
    if not 0 <= replica_id < n:
        raise UnknownAppError(f"role '{role_name}' of '{app_id}' has replicas 0..{n - 1}, not {replica_id}")


def check_log_target(
    backend: str, app_id: str, roles: Mapping[str, int] | None, role_name: str, replica_id: int
) -> None:
    """The check a ``log_iter`` starts with: :class:`UnknownAppError` ``no <backend> app '<id>'`` when
    ``roles`` is None (the backend does not know the app), then :func:`check_replica`."""
    if roles is None:
        raise UnknownAppError(f"no {backend} app '{app_id}'")
    check_replica(app_id, roles, role_name, replica_id)


def replica_counts(shape: Iterable[Sequence[Any]] | None, describe: Callable[[], Any]) -> dict[str, int] | None:
    """``{role: replica count}`` of an app, for :func:`check_log_target`: from ``shape`` (the submitted
    ``[role, n, ...]`` rows, when this machine kept the request), else from ``describe()`` (a
    ``DescribeAppResponse``, for an app submitted elsewhere); None when neither knows the app."""
    if shape is not None:
        return {str(row[0]): int(row[1]) for row in shape}
    d = describe()
    if d is None:
        return None
    return {rs.role: len(rs.replicas) for rs in d.roles_statuses}


def stream_names(streams: Stream | str | None) -> list[str]:
    """The outputs to read for ``streams``: ``["stdout"]``, ``["stderr"]`` or both (COMBINED, the default)."""
    stream = Stream(streams) if streams is not None else Stream.COMBINED
    return {Stream.STDOUT: ["stdout"], Stream.STDERR: ["stderr"]}.get(stream, ["stdout", "stderr"])


def filter_regex(regex: str | None, lines: Iterable[str]) -> Iterator[str]:
    """Yield the lines that contain a match of ``regex`` (all lines when None)."""
    if not regex:
        yield from lines
        return
    pattern = re.compile(regex)
    for line in lines:
        if pattern.search(line):
            yield line


def in_window(when: float | None, since: datetime | None, until: datetime | None) -> bool:
    """True when epoch time ``when`` lies in ``[since, until]`` (open ends; an unknown time is kept)."""
    if when is None:
        return True
    if since is not None and when < since.timestamp():
        return False
    return not (until is not None and when > until.timestamp())


def split_lines(text: str) -> list[str]:
    """Split on ``\\n`` only, keeping the newline; a last line without one is kept as is."""
    parts = text.split("\n")
    out = [p + "\n" for p in parts[:-1]]
    if parts[-1]:
        out.append(parts[-1])
    return out


def split_lines_iterator(chunks: Iterable[str]) -> Iterator[str]:
    """Re-cut text arriving in arbitrary chunks into lines (as :func:`split_lines` would cut the whole)."""
    buf = ""
    for chunk in chunks:
        buf += chunk
        *lines, buf = buf.split("\n")
        for line in lines:
            yield line + "\n"
    if buf:
        yield buf


def utf8_chunks(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """Re-cut byte chunks so none ends inside a UTF-8 sequence (each can then be decoded on its own)."""
    held = b""
    for chunk in chunks:
        data = held + chunk
        cut = len(data)
        for back in range(1, min(4, len(data)) + 1):
            b = data[-back]
            if b & 0xC0 == 0x80:
                continue
            if b >= 0xC0 and back < (2 if b < 0xE0 else 3 if b < 0xF0 else 4):
                cut = len(data) - back
            break
        held = data[cut:]
        if cut:
            yield data[:cut]
    if held:
        yield held


def decode(raw: bytes) -> str:
    """Bytes of a log as text; what is not UTF-8 is kept as surrogate escapes."""
    return raw.decode("utf-8", errors="surrogateescape")


def read_files(paths: Iterable[str | PathLike[str]]) -> Iterator[str]:
    """The lines of each file in turn; a missing file gives none."""
    for p in paths:
        try:
            with open(p, "rb") as f:
                data = f.read()
        except OSError:
            continue
        yield from split_lines(decode(data))


def file_reader(path: str | PathLike[str]) -> Callable[[], bytes]:
    """A ``read_new`` for :func:`follow`: each call returns what was appended to ``path`` since the last."""
    offset = 0

    def read_new() -> bytes:
        nonlocal offset
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                data = f.read()
        except OSError:
            return b""
        offset += len(data)
        return data

    return read_new


def follow(
    read_new: Sequence[Callable[[], bytes]],
    ended: Callable[[], bool],
    *,
    busy: float = 0.1,
    idle: float = 1.0,
) -> Iterator[str]:
    """Yield complete lines from each source as they are written until ``ended()``; then drain and stop.

    ``ended()`` is asked *before* each read, so whatever was written before the end is still read. For
    sources that give no event to wait on (files on a shared filesystem, a log API), this polls: every
    ``busy`` seconds while lines keep coming, backing off by 1.5x to every ``idle`` seconds when quiet.
    A source's unfinished last line is held until its newline comes (or given as is at the end).
    """
    partial = [b""] * len(read_new)
    delay = busy
    while True:
        done = ended()
        got = False
        for i, read in enumerate(read_new):
            data = read()
            if not data:
                continue
            got = True
            *lines, partial[i] = (partial[i] + data).split(b"\n")
            for line in lines:
                yield decode(line) + "\n"
        if done:
            for rest in partial:
                if rest:
                    yield decode(rest)
            return
        delay = busy if got else min(delay * 1.5, idle)
        time.sleep(delay)
