"""Pure: ``.dockerignore`` rules applied to a build context, as the ``docker`` CLI does before sending it.

The Docker engine itself does not filter a context by ``.dockerignore`` (it only drops the Dockerfile and
the ignore file when they are listed); the client must. Syntax, as Docker's: one pattern a line, ``#``
comments, paths relative to the context root (a leading ``/`` is dropped), ``*`` and ``?`` within one path
part, ``**`` across any number of parts, ``!`` re-includes; the last matching line wins, and a pattern that
matches a directory also matches everything under it.
"""

from __future__ import annotations

import io
import re
import tarfile
from functools import lru_cache


def parse(text: str) -> list[tuple[bool, re.Pattern[str]]]:
    """``[(excluded, regex), ...]`` of a ``.dockerignore`` text, in order."""
    rules = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = line[1:].strip() if negate else line
        pattern = "/".join(p for p in pattern.strip("/").split("/") if p not in ("", "."))
        if pattern:
            rules.append((not negate, _compile(pattern)))
    return rules


@lru_cache(maxsize=256)
def _compile(pattern: str) -> re.Pattern[str]:
    out = []
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
            continue
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        out.append({"*": "[^/]*", "?": "[^/]"}.get(ch, re.escape(ch)))
        i += 1
    return re.compile("".join(out) + "(?:/.*)?")  # a directory's pattern covers what is under it


def excluded(path: str, rules: list[tuple[bool, re.Pattern[str]]]) -> bool:
    """True when the last rule matching ``path`` (relative, ``/``-separated) excludes it."""
    result = False
    for exclude, rx in rules:
        if rx.fullmatch(path):
            result = exclude
    return result


def filter_tar(data: bytes, text: str) -> bytes:
    """The tar ``data`` without the members ``text`` (a ``.dockerignore``) excludes."""
    rules = parse(text)
    if not rules:
        return data
    out = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as src, tarfile.open(
        fileobj=out, mode="w:", format=tarfile.PAX_FORMAT
    ) as dst:
        for member in src:
            if excluded(member.name.strip("/"), rules):
                continue
            dst.addfile(member, src.extractfile(member) if member.isfile() else None)
    return out.getvalue()
