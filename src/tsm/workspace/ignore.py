"""Which workspace paths stay out of a snapshot: gitignore-style patterns from ``.torchxignore`` and ``.tsmignore``.

Both files are read from the workspace root, ``.torchxignore`` first and ``.tsmignore`` second, so a
``.tsmignore`` line overrides a ``.torchxignore`` one. The syntax is git's (``man gitignore``):

* blank lines and lines starting with ``#`` are skipped; ``\\#`` and ``\\!`` start a literal ``#`` / ``!``;
  trailing spaces are dropped unless escaped with a backslash;
* ``!pattern`` re-includes what an earlier pattern excluded; **the last matching line wins**;
* a trailing ``/`` matches directories only (``build/``);
* a pattern with a ``/`` at the start or in the middle is relative to the root (``/data``, ``src/gen``);
  one without a ``/`` matches a name at any depth (``*.pyc``, ``__pycache__``);
* ``*`` matches anything but ``/``, ``?`` one character but ``/``, ``[a-z]`` / ``[!a-z]`` a class;
  ``**/x`` matches ``x`` in any directory, ``x/**`` everything inside ``x``, ``a/**/b`` zero or more
  directories between.

As in git, a path inside an excluded directory cannot be re-included (the directory is never
entered): to keep ``build/keep.txt`` write ``build/*`` and ``!build/keep.txt``, not ``build/``.
Matching is pure string work on ``/``-separated paths relative to the root; nothing here touches disk
except :func:`load_ignore_files`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

#: Ignore files read from the workspace root, lowest precedence first.
IGNORE_FILES = (".torchxignore", ".tsmignore")


@dataclass(frozen=True)
class Pattern:
    """One parsed line: the compiled regex, whether it negates (``!``), whether it is for directories only."""

    text: str
    regex: re.Pattern[str]
    negate: bool
    dir_only: bool
    origin: str


def _translate(glob: str) -> str:
    """The regex body for one gitignore glob (already stripped of ``!``, leading and trailing ``/``)."""
    out: list[str] = []
    i, n = 0, len(glob)
    while i < n:
        c = glob[i]
        if c == "*":
            if glob.startswith("**", i):
                before_ok = i == 0 or glob[i - 1] == "/"
                after = glob[i + 2 : i + 3]
                if before_ok and after == "/":  # "**/": zero or more whole directories
                    out.append("(?:[^/]*/)*")
                    i += 3
                    continue
                if before_ok and i + 2 == n:  # trailing "/**" (or a lone "**"): everything below
                    out.append(".*")
                    i += 2
                    continue
                out.append("[^/]*")  # any other run of stars is a plain star
                while i < n and glob[i] == "*":
                    i += 1
                continue
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            j = i + 1
            if j < n and glob[j] in "!^":
                j += 1
            if j < n and glob[j] == "]":
                j += 1
            while j < n and glob[j] != "]":
                j += 1
            if j >= n:  # no closing bracket: a literal "["
                out.append(re.escape(c))
            else:
                body = glob[i + 1 : j]
                negate = body[:1] in ("!", "^")
                if negate:
                    body = body[1:]
                body = body.replace("\\", "\\\\").replace("[", "\\[")
                out.append(f"[^/{body}]" if negate else f"[{body}]")
                i = j
        elif c == "\\" and i + 1 < n:
            i += 1
            out.append(re.escape(glob[i]))
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


def parse_line(line: str, origin: str = "") -> Pattern | None:
    """Parse one line of an ignore file; None for a blank line or a comment."""
    line = line.rstrip("\r\n")
    # Trailing spaces go unless escaped ("foo\ " keeps one space).
    stripped = line.rstrip(" ")
    if stripped.endswith("\\") and len(stripped) < len(line):
        stripped += " "
    line = stripped
    if not line or line.startswith("#"):
        return None
    negate = line.startswith("!")
    if negate or line.startswith(("\\!", "\\#")):  # "!x" negates; "\\!x" / "\\#x" are literal
        line = line[1:]
    dir_only = line.endswith("/") and not line.endswith("\\/")
    body = line.rstrip("/") if dir_only else line
    if not body:
        return None
    anchored = "/" in body
    body = body.lstrip("/")
    if not body:
        return None
    prefix = "" if anchored else "(?:.*/)?"
    regex = re.compile(f"^{prefix}{_translate(body)}$", re.DOTALL)
    return Pattern(text=("!" if negate else "") + line, regex=regex, negate=negate, dir_only=dir_only, origin=origin)


class IgnoreRules:
    """An ordered list of patterns; :meth:`ignored` says whether a relative path is left out."""

    def __init__(self, patterns: list[Pattern] | None = None) -> None:
        self.patterns: list[Pattern] = list(patterns or [])

    @classmethod
    def from_lines(cls, lines: list[str], origin: str = "") -> IgnoreRules:
        """Rules from the lines of one ignore file."""
        return cls([p for p in (parse_line(line, origin) for line in lines) if p is not None])

    def extend(self, other: IgnoreRules) -> None:
        """Append ``other``'s patterns (they win over ours)."""
        self.patterns.extend(other.patterns)

    def ignored(self, relpath: str, is_dir: bool) -> bool:
        """True when the last pattern that matches ``relpath`` (``/``-separated, relative) excludes it."""
        result = False
        for p in self.patterns:
            if p.dir_only and not is_dir:
                continue
            if p.regex.match(relpath):
                result = not p.negate
        return result

    def __len__(self) -> int:
        return len(self.patterns)


def load_ignore_files(root: Path) -> IgnoreRules:
    """The rules of ``root``'s ``.torchxignore`` then ``.tsmignore`` (either may be missing).

    An ignore file that is not UTF-8 is read with replacement characters rather than refused: a
    stray byte in a comment must not stop a launch. An ignore file that is a symlink is not followed.
    """
    rules = IgnoreRules()
    for name in IGNORE_FILES:
        path = root / name
        if path.is_symlink() or not path.is_file():
            continue
        text = path.read_bytes().decode("utf-8", errors="replace")
        rules.extend(IgnoreRules.from_lines(text.splitlines(), origin=name))
    return rules
