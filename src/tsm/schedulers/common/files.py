"""Private files and directories for what a backend keeps of an app (requests, records, logs).

Everything tsm writes about an app may hold secrets from its env, so directories are made 0700 and files
0600 whatever the umask; cleaning up never fails on what is already gone or not ours.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from collections.abc import Iterable
from pathlib import Path


def make_private_dirs(path: Path) -> None:
    """``mkdir -p`` where every directory made is 0700 (``Path.mkdir(parents=True)`` leaves parents 0755)."""
    missing = []
    p = path
    while not p.exists():
        missing.append(p)
        if p.parent == p:
            break
        p = p.parent
    for d in reversed(missing):
        try:
            d.mkdir(mode=0o700)
        except FileExistsError:
            continue  # made by someone else meanwhile: left as it is
        d.chmod(0o700)  # mkdir's mode is masked by the umask (e.g. 0o277 would leave 0o500): the owner needs rwx


class NotPrivateError(OSError):
    """A folder that must be this user's alone is not: another owner, a link, or open to others."""


def own_private_dir(path: Path) -> Path:
    """``path`` as a folder only this user can use: made 0700 when missing (its parent must exist), else checked.

    An existing one must be a real directory (not a link to one) owned by this user; its mode is set to 0700
    (the owner's own folder, widened by a umask or by hand). Anything else raises :class:`NotPrivateError`
    naming what is wrong: such a folder is never used, whoever made it.
    """
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise NotPrivateError(f"{path} is not a directory (a link or a file is there)")
    if st.st_uid != os.geteuid():
        raise NotPrivateError(f"{path} belongs to uid {st.st_uid}, not to this user (uid {os.geteuid()})")
    if stat.S_IMODE(st.st_mode) != 0o700:
        os.chmod(path, 0o700, follow_symlinks=False)
    return path


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` (created 0600, truncated); surrogate escapes are written as their bytes."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # the umask may have taken the owner's bits; an existing file may have been wider
    with os.fdopen(fd, "w", encoding="utf-8", errors="surrogateescape") as f:
        f.write(text)


def write_atomic(path: Path, data: str | bytes | Iterable[bytes]) -> int:
    """Replace ``path`` whole with ``data`` (text, bytes, or chunks streamed to disk); returns the bytes written.

    The content goes to a private (0600) temporary file beside ``path``, which is then renamed over it: a
    reader sees the old file or the new one, never half of either, and a crash leaves no partial file under
    the real name. Chunks are written as they come, so a long log is never held in memory whole. Text is
    written as UTF-8 with surrogate escapes as their bytes.
    """
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    written = 0
    try:
        os.fchmod(fd, 0o600)  # the umask may have taken the owner's bits
        with os.fdopen(fd, "wb") as f:
            if isinstance(data, str):
                data = data.encode("utf-8", errors="surrogateescape")
            for chunk in [data] if isinstance(data, bytes) else data:
                f.write(chunk)
                written += len(chunk)
        os.replace(tmp, path)
    except BaseException:
        unlink(tmp)
        raise
    return written


def read_text(path: Path) -> str | None:
    """The file's text, or None when it cannot be read."""
    try:
        return path.read_text()
    except OSError:
        return None


def unlink(path: Path) -> bool:
    """Delete a file; True when it was there and is gone."""
    try:
        path.unlink()
        return True
    except OSError:
        return False


def rmdir(path: Path) -> None:
    """Remove a directory if it is empty; a non-empty (someone else's files) or missing one stays as is."""
    with contextlib.suppress(OSError):
        path.rmdir()
