"""The bytes a function job travels as: the call going out, each replica's outcome coming back.

Both are cloudpickle pickles behind a one-line header, ``TSMF1 <python major.minor> <cloudpickle version>``,
so a replica whose Python cannot run the pickled bytecode says so (:class:`FunctionVersionError`) instead of
failing somewhere inside the unpickler. An outcome is a plain tuple::

    ("ok", value)
    ("error", pickled exception or None, type name, message, traceback text)

(the exception is pickled on its own, so a reader that cannot load its class still has its text; None when
it could not be pickled at all).

How the bytes travel is the channel's business (:mod:`tsm.functions.channel`): as words of URL-safe base64 in
the app's arguments, as files in a directory the replicas share, or as lines in a replica's output. Lines
are :func:`frames`: ``@@tsm-result@@ <nonce> <rank> <seq>/<count> <base64>``, each far below the 16 KiB a
container runtime cuts a log line at; :class:`FrameReader` puts them back together from a log in which other
lines (the function's own prints) may sit between them, and checks the count and a SHA-256 of the whole.
"""

from __future__ import annotations

import base64
import hashlib
import sys
from collections.abc import Iterable, Iterator
from typing import Any

from tsm.functions.errors import FunctionError, FunctionPickleError, FunctionVersionError

MAGIC = b"TSMF1"
#: the marker that starts every result line in a replica's output
FRAME = "@@tsm-result@@"
#: base64 characters per argument word: under Linux's 128 KiB limit on one argument
WORD = 100_000
#: base64 characters per result line
LINE = 3_000

OK, ERROR = "ok", "error"


def cloudpickle() -> Any:
    """The cloudpickle module, or a :class:`FunctionError` saying which extra to install."""
    try:
        import cloudpickle as cp  # type: ignore[import-untyped,unused-ignore]
    except ImportError:
        raise FunctionError("functions as jobs need cloudpickle: pip install 'tsm[functions]'") from None
    return cp


def python_version() -> str:
    """``3.11``: the major.minor whose bytecode a pickle of a function carries."""
    return f"{sys.version_info[0]}.{sys.version_info[1]}"


def header() -> bytes:
    return b"%s %s %s\n" % (MAGIC, python_version().encode(), str(cloudpickle().__version__).encode())


def dumps(obj: object, what: str) -> bytes:
    """``obj`` as header + cloudpickle; :class:`FunctionPickleError` naming ``what`` when it cannot be pickled."""
    cp = cloudpickle()
    try:
        pickled: bytes = cp.dumps(obj, protocol=5)
        return header() + pickled
    except Exception as e:  # noqa: BLE001 - any pickling failure is the same one-line error
        raise FunctionPickleError(f"cannot pickle {what}: {type(e).__name__}: {e}") from e


def check_header(data: bytes) -> tuple[str, str]:
    """The (python, cloudpickle) versions ``data`` was written with; refuses what this process cannot load."""
    line, sep, _ = data[:200].partition(b"\n")
    parts = line.split()
    if not sep or len(parts) != 3 or parts[0] != MAGIC:
        raise FunctionError("not a tsm function payload (no TSMF1 header): was it written by another tool?")
    py, cp = parts[1].decode(), parts[2].decode()
    if py != python_version():
        raise FunctionVersionError(
            f"pickled by Python {py}, loaded by Python {python_version()} ({sys.executable}): the function's bytecode "
            f"does not travel between Python versions; run the replicas with Python {py}"
        )
    return py, cp


def loads(data: bytes) -> Any:
    """What :func:`dumps` wrote, after :func:`check_header`."""
    check_header(data)
    cp = cloudpickle()
    return cp.loads(data[data.index(b"\n") + 1:])


def to_words(data: bytes) -> list[str]:
    """``data`` as URL-safe base64 words of at most :data:`WORD` characters (argument-sized)."""
    text = base64.urlsafe_b64encode(data).decode("ascii")
    return [text[i:i + WORD] for i in range(0, len(text), WORD)] or [""]


def from_words(words: Iterable[str]) -> bytes:
    return base64.urlsafe_b64decode("".join(words).encode("ascii"))


def frames(nonce: str, rank: int, data: bytes) -> Iterator[str]:
    """The lines that carry ``data`` in a replica's output: a header line (count, digest), then the chunks."""
    text = base64.b64encode(data).decode("ascii")
    chunks = [text[i:i + LINE] for i in range(0, len(text), LINE)]
    digest = hashlib.sha256(data).hexdigest()
    yield f"{FRAME} {nonce} {rank} 0/{len(chunks)} {digest}\n"
    for i, chunk in enumerate(chunks, 1):
        yield f"{FRAME} {nonce} {rank} {i}/{len(chunks)} {chunk}\n"


class FrameReader:
    """Collects one job's result lines out of a log (other lines are skipped) and gives each rank's bytes."""

    def __init__(self, nonce: str) -> None:
        self._prefix = f"{FRAME} {nonce} "
        self._parts: dict[int, dict[int, str]] = {}
        self._count: dict[int, tuple[int, str]] = {}

    def feed(self, line: str) -> None:
        at = line.find(self._prefix)
        if at < 0:
            return
        words = line[at + len(self._prefix):].split()
        if len(words) != 3:
            return
        rank_s, pos, body = words
        seq_s, _, count_s = pos.partition("/")
        if not (rank_s.isdigit() and seq_s.isdigit() and count_s.isdigit()):
            return
        rank, seq = int(rank_s), int(seq_s)
        if seq == 0:
            # a later attempt (a retry) writes its own frames: the last header wins and its chunks replace
            self._count[rank] = (int(count_s), body)
            self._parts[rank] = {}
        else:
            self._parts.setdefault(rank, {})[seq] = body

    def seen(self, rank: int) -> bool:
        """Whether any header for ``rank`` came (else the replica wrote no result at all)."""
        return rank in self._count

    def data(self, rank: int) -> bytes:
        """The whole bytes of ``rank``; :class:`TransportError` when chunks are missing or do not add up."""
        from tsm.functions.errors import TransportError

        count, digest = self._count[rank]
        parts = self._parts.get(rank, {})
        missing = [i for i in range(1, count + 1) if i not in parts]
        if missing:
            raise TransportError(
                f"the result of rank {rank} came back in part: {len(missing)} of {count} lines of the replica's "
                "output are missing (a log cut or rotated by the engine?); return a smaller value, or write large "
                "results to storage the replicas share and return its path"
            )
        data = base64.b64decode("".join(parts[i] for i in range(1, count + 1)))
        if hashlib.sha256(data).hexdigest() != digest:
            raise TransportError(f"the result of rank {rank} does not match its checksum: the replica's output was "
                                 "altered on its way back")
        return data


def error_outcome(exc: BaseException, tb_text: str) -> tuple[Any, ...]:
    """The outcome of a call that raised ``exc``: the exception pickled on its own (None when it will not
    pickle), so a reader that cannot load it still has its type's name, message and traceback."""
    type_name = f"{type(exc).__module__}.{type(exc).__qualname__}"
    try:
        kept: bytes | None = cloudpickle().dumps(exc, protocol=5)
    except Exception:  # noqa: BLE001 - an exception that will not pickle still comes back as text
        kept = None
    return (ERROR, kept, type_name, str(exc), tb_text)


def dump_outcome(outcome: tuple[Any, ...]) -> bytes:
    """An outcome's bytes; a value that cannot be pickled becomes an error outcome saying so."""
    try:
        return dumps(outcome, "the outcome")
    except FunctionPickleError as e:
        value = outcome[1]
        err = FunctionPickleError(f"the function returned a {type(value).__module__}.{type(value).__qualname__} "
                                  f"that cannot be pickled: {e.__cause__ or e}")
        return dumps(error_outcome(err, ""), "the outcome")
