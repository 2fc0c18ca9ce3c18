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
Matching is pure string work on ``/``-separated paths relative to the root, linear in the path's length
whatever the pattern (a state set, no backtracking); nothing here touches disk except
:func:`load_ignore_files`. An invalid pattern (a reversed range ``[z-a]``) is refused with its file and
line number.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from tsm.workspace.api import WorkspaceError

#: Ignore files read from the workspace root, lowest precedence first.
IGNORE_FILES = (".torchxignore", ".tsmignore")

# Token kinds of a compiled glob. Matching runs them as a set of states over the path's characters
# (a Thompson simulation), never by backtracking, so its cost is linear in the path's length for any
# pattern: ``*a*a*a*a*a*a*a*a*b`` against a 64-character name is 64 steps, not billions.
_LIT, _ONE, _CLASS, _STAR, _ALL, _DIRS = range(6)
Token = tuple[int, str, bool]
#: Most (state set, character) steps a pattern remembers before starting over.
_DFA_CACHE = 4096  # (kind, literal or class ranges as "a-zx-y", class negated)


class PatternError(WorkspaceError):
    """A line of an ignore file is not a valid pattern (e.g. a reversed range ``[z-a]``)."""


def _class(body: str) -> str:
    """The ranges of a ``[...]`` body as ``"aabbzz"`` pairs (``a-z`` -> ``"az"``, ``x`` -> ``"xx"``)."""
    pairs: list[str] = []
    i = 0
    while i < len(body):
        lo = body[i]
        if i + 2 < len(body) and body[i + 1] == "-":
            hi = body[i + 2]
            if hi < lo:
                raise PatternError(f"range {lo}-{hi} is reversed in [{body}]")
            pairs.append(lo + hi)
            i += 3
        else:
            pairs.append(lo + lo)
            i += 1
    return "".join(pairs)


def _tokens(glob: str) -> list[Token]:
    """The tokens of one gitignore glob (already stripped of ``!``, leading and trailing ``/``)."""
    out: list[Token] = []
    i, n = 0, len(glob)
    while i < n:
        c = glob[i]
        if c == "*":
            j = i
            while j < n and glob[j] == "*":
                j += 1
            before_ok = i == 0 or glob[i - 1] == "/"
            if j - i == 2 and before_ok and glob[j : j + 1] == "/":  # "**/": zero or more whole directories
                out.append((_DIRS, "", False))
                i = j + 1
                continue
            if j - i == 2 and before_ok and j == n:  # trailing "/**" (or a lone "**"): everything below
                out.append((_ALL, "", False))
                i = j
                continue
            if not out or out[-1][0] != _STAR:  # any other run of stars is one plain star
                out.append((_STAR, "", False))
            i = j
            continue
        if c == "?":
            out.append((_ONE, "", False))
        elif c == "[":
            j = i + 1
            if j < n and glob[j] in "!^":
                j += 1
            if j < n and glob[j] == "]":
                j += 1
            while j < n and glob[j] != "]":
                j += 1
            if j >= n:  # no closing bracket: a literal "["
                out.append((_LIT, c, False))
            else:
                body = glob[i + 1 : j]
                negate = body[:1] in ("!", "^")
                out.append((_CLASS, _class(body[1:] if negate else body), negate))
                i = j
        elif c == "\\" and i + 1 < n:
            i += 1
            out.append((_LIT, glob[i], False))
        else:
            out.append((_LIT, c, False))
        i += 1
    return out


def _in_class(c: str, ranges: str) -> bool:
    return any(ranges[k] <= c <= ranges[k + 1] for k in range(0, len(ranges), 2))


def _match(tokens: tuple[Token, ...], anchored: bool, path: str, cache: dict[tuple[frozenset[int], str], frozenset[int]]) -> bool:
    """Whether ``path`` matches the whole token list: a set of states advanced one character at a time.

    A state is a token index (``2*i``) or, for ``**/``, "inside a directory name" (``2*i+1``); ``len`` tokens
    (``2*len``) accepts. Unanchored patterns also start after every ``/`` (git's "at any depth"). Each
    (state set, character) step is computed once and kept in ``cache`` (a lazily built DFA, bounded).
    """
    n = len(tokens)

    def close(states: set[int]) -> frozenset[int]:
        # epsilon moves: a star, "**" or "**/" may match nothing
        todo = list(states)
        while todo:
            st = todo.pop()
            i, inner = divmod(st, 2)
            if not inner and i < n and tokens[i][0] in (_STAR, _ALL, _DIRS) and 2 * (i + 1) not in states:
                states.add(2 * (i + 1))
                todo.append(2 * (i + 1))
        return frozenset(states)

    def step(states: frozenset[int], c: str) -> frozenset[int]:
        nxt: set[int] = set()
        for st in states:
            i, inner = divmod(st, 2)
            if i >= n:
                continue
            kind, arg, neg = tokens[i]
            if inner:  # inside "**/": more name characters, or the "/" that ends the directory
                nxt.add(2 * i if c == "/" else 2 * i + 1)
            elif kind == _LIT:
                if c == arg:
                    nxt.add(2 * (i + 1))
            elif kind == _ONE:
                if c != "/":
                    nxt.add(2 * (i + 1))
            elif kind == _CLASS:
                if c != "/" and _in_class(c, arg) != neg:
                    nxt.add(2 * (i + 1))
            elif kind == _STAR:
                if c != "/":
                    nxt.add(2 * i)
            elif kind == _ALL:
                nxt.add(2 * i)
            else:  # _DIRS
                nxt.add(2 * i if c == "/" else 2 * i + 1)
        if not anchored and c == "/":
            nxt.add(0)
        return close(nxt)

    states = close({0})
    for c in path:
        key = (states, c)
        got = cache.get(key)
        if got is None:
            if len(cache) > _DFA_CACHE:
                cache.clear()
            got = cache[key] = step(states, c)
        states = got
        if not states and anchored:
            return False  # unanchored: a later "/" starts it again
    return 2 * n in states


def _regex(tokens: list[Token]) -> re.Pattern[str] | None:
    """A Python regex for ``tokens`` when it cannot backtrack much (at most one unbounded token), else None."""
    if sum(1 for kind, _, _ in tokens if kind in (_STAR, _ALL, _DIRS)) > 1:
        return None
    out = []
    for kind, arg, neg in tokens:
        if kind == _LIT:
            out.append(re.escape(arg))
        elif kind == _ONE:
            out.append("[^/]")
        elif kind == _CLASS:
            ranges = "".join(f"{re.escape(arg[k])}-{re.escape(arg[k + 1])}" for k in range(0, len(arg), 2))
            out.append(f"[^/{ranges}]" if neg else f"(?![/])[{ranges}]")
        elif kind == _STAR:
            out.append("[^/]*")
        elif kind == _ALL:
            out.append(".*")
        else:
            out.append("(?:[^/]*/)*")
    return re.compile("".join(out) + r"\Z", re.DOTALL)


@dataclass(frozen=True)
class Pattern:
    """One parsed line: its tokens, whether it negates (``!``), whether it is for directories only.

    A pattern without ``/`` and without ``**`` can only match a whole last component (nothing else in it
    matches a ``/``), so it is matched against the name alone. One with at most one ``*`` is matched by a
    Python regex (no room to backtrack); any other by the state-set matcher.
    """

    text: str
    tokens: tuple[Token, ...]
    anchored: bool
    negate: bool
    dir_only: bool
    origin: str
    regex: re.Pattern[str] | None = None
    name_only: bool = False
    _dfa: dict[tuple[frozenset[int], str], frozenset[int]] = field(default_factory=dict, compare=False, repr=False)

    def matches(self, relpath: str) -> bool:
        """Whether the ``/``-separated relative path matches (linear in its length)."""
        subject = relpath.rsplit("/", 1)[-1] if self.name_only else relpath
        if self.regex is not None:
            return self.regex.match(subject) is not None
        return _match(self.tokens, self.anchored or self.name_only, subject, self._dfa)


def parse_line(line: str, origin: str = "") -> Pattern | None:
    """Parse one line of an ignore file; None for a blank line or a comment; :class:`PatternError` if invalid."""
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
    tokens = _tokens(body)
    name_only = not anchored and not any(kind in (_ALL, _DIRS) for kind, _, _ in tokens)
    return Pattern(text=("!" if negate else "") + line, tokens=tuple(tokens), anchored=anchored, negate=negate,
                   dir_only=dir_only, origin=origin, name_only=name_only,
                   regex=_regex(tokens if anchored or name_only else [(_DIRS, "", False), *tokens]))


class IgnoreRules:
    """An ordered list of patterns; :meth:`ignored` says whether a relative path is left out."""

    def __init__(self, patterns: list[Pattern] | None = None) -> None:
        self.patterns: list[Pattern] = list(patterns or [])

    @classmethod
    def from_lines(cls, lines: list[str], origin: str = "") -> IgnoreRules:
        """Rules from the lines of one ignore file; :class:`PatternError` names the first bad line's number."""
        patterns = []
        for number, line in enumerate(lines, 1):
            try:
                p = parse_line(line, origin)
            except PatternError as e:
                raise PatternError(f"{origin or 'ignore file'} line {number}: {e}: {line.strip()!r}") from None
            if p is not None:
                patterns.append(p)
        return cls(patterns)

    def extend(self, other: IgnoreRules) -> None:
        """Append ``other``'s patterns (they win over ours)."""
        self.patterns.extend(other.patterns)

    def ignored(self, relpath: str, is_dir: bool) -> bool:
        """True when the last pattern that matches ``relpath`` (``/``-separated, relative) excludes it."""
        result = False
        for p in self.patterns:
            if p.dir_only and not is_dir:
                continue
            if p.matches(relpath):
                result = not p.negate
        return result

    def __len__(self) -> int:
        return len(self.patterns)


def load_ignore_files(root: Path) -> IgnoreRules:
    """The rules of ``root``'s ``.torchxignore`` then ``.tsmignore`` (either may be missing).

    An ignore file that is not UTF-8 is read with replacement characters rather than refused: a
    stray byte in a comment must not stop a launch. An ignore file that is a symlink is not followed.
    One that cannot be read, or holds an invalid pattern, is a :class:`~tsm.workspace.api.WorkspaceError`
    naming the file (and the line): leaving it out silently would ship what it was written to keep out.
    """
    rules = IgnoreRules()
    for name in IGNORE_FILES:
        path = root / name
        if path.is_symlink() or not path.is_file():
            continue
        try:
            text = path.read_bytes().decode("utf-8", errors="replace")
        except OSError as e:
            raise WorkspaceError(f"cannot read {path}: {e.strerror}; fix its permissions or remove it") from e
        rules.extend(IgnoreRules.from_lines(text.splitlines(), origin=name))
    return rules
