"""What ``tsm env list | show | rm | gc`` do to a cache root: list ready environments, remove them safely.

Removal takes the key's build lock (so never during its build), moves the folder aside in one rename (a
launch sees it whole or not at all) and then deletes it. An environment that a running app of this
``$TSM_HOME`` uses is kept unless forced: its replicas still import from it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from tsm.env.build import MARKER, EnvCache


@dataclass(frozen=True)
class EnvEntry:
    """One ready environment: its key, its record, its size on disk and when it was last used."""

    key: str
    info: dict[str, Any]
    size: int
    last_used: float


def entries(cache: EnvCache) -> list[EnvEntry]:
    """The ready environments of ``cache``, most recently used first."""
    out = []
    try:
        names = os.listdir(cache.root)
    except FileNotFoundError:
        return []
    for name in names:
        if name.startswith(".") or not (cache.root / name).is_dir():
            continue
        info = cache.info(name)
        if info is None:
            continue
        marker = cache.root / name / MARKER
        out.append(EnvEntry(name, info, _size(cache.root / name), marker.stat().st_mtime))
    return sorted(out, key=lambda e: -e.last_used)


def find(cache: EnvCache, prefix: str) -> EnvEntry:
    """The one ready environment whose key starts with ``prefix``; a :class:`LookupError` says why not."""
    hits = [e for e in entries(cache) if e.key.startswith(prefix)] if prefix else []
    if len(hits) != 1:
        what = "no environment" if not hits else f"{len(hits)} environments"
        raise LookupError(f"{what} in {cache.root} with a key starting {prefix!r}; `tsm env list` shows the keys")
    return hits[0]


def remove(cache: EnvCache, key: str) -> bool:
    """Remove ``key``'s environment (under its lock, moved aside first); False when it was not there."""
    with cache.locked(key):
        path = cache.path(key)
        if not path.exists():
            return False
        trash = cache.root / ".building" / f"{key}-removed-{os.getpid()}"
        trash.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.rename(path, trash)
        shutil.rmtree(trash, ignore_errors=True)
    return True


def older_than(cache: EnvCache, seconds: float, now: float | None = None) -> list[EnvEntry]:
    """The ready environments not used for ``seconds``."""
    limit = (time.time() if now is None else now) - seconds
    return [e for e in entries(cache) if e.last_used < limit]


def stale_builds(cache: EnvCache) -> list[str]:
    """Remove what builds that died left in ``.building`` (a key's folder whose lock nobody holds); their names."""
    import fcntl

    building = cache.root / ".building"
    try:
        names = sorted(os.listdir(building))
    except FileNotFoundError:
        return []
    removed = []
    for name in names:
        key = name.split("-", 1)[0]
        lock = cache.root / ".locks" / f"{key}.lock"
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue  # a build of that key is running: its folder is not stale
        try:
            shutil.rmtree(building / name, ignore_errors=True)
            removed.append(name)
        finally:
            os.close(fd)
    return removed


def in_use(app_dirs: Iterable[str]) -> set[str]:
    """The keys the requests in ``app_dirs`` (apps still running) run in."""
    keys: set[str] = set()
    for d in app_dirs:
        try:
            with open(os.path.join(d, "request.json"), "rb") as f:
                req = json.load(f)
        except (OSError, ValueError):
            continue
        keys.update(p["key"] for p in (req.get("environments") or {}).values() if isinstance(p, dict))
    return keys


def _size(path: os.PathLike[str]) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total
