"""A file that carries secrets' values (:mod:`tsm.specs.secrets`) from the submitting process to the one
that starts replicas: JSON ``{name: value}``, created owner-read-only (0400, never replaced in place), read
once by its reader and removed by it, so the value lives on in memory and the replicas' environment only."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping

#: Its name in an app's directory.
NAME = "secrets.json"


def write(path: str, values: Mapping[str, str]) -> None:
    """Create ``path`` (which must not exist) holding ``values``; removed again if the write fails."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o400)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(json.dumps(dict(values)).encode())
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise


def take(path: str) -> dict[str, str]:
    """The values of ``path`` (none when it is not there), removing it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return {}
    try:
        with os.fdopen(fd, "rb") as f:
            data = json.loads(f.read())
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}
