"""Read a Google-style docstring into what a command line needs: a description and one help text per argument.

Only the parts a component's ``--help`` shows are read::

    Launch a script on N nodes.          <- description: every line before the first section

    Longer text, kept as written.

    Args:
        script: the script to run         <- args["script"]
        j: ``[min:]NxM``, nodes times     <- continuation lines (indented deeper) are joined
            processes per node
        *args: passed to the script       <- args["args"] (the stars are dropped)

    Returns:
        the app                          <- other sections end the description and are ignored

Used both by :mod:`tsm.components.cmdline` (on ``fn.__doc__``) and by :mod:`tsm.components.linter`
(on ``ast.get_docstring``), so the help a user sees and the documentation the linter checks are the same.
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass, field

#: Section headers that end the description (Google style and the usual Napoleon aliases).
_SECTIONS = frozenset(
    {
        "args",
        "arguments",
        "parameters",
        "params",
        "keyword args",
        "keyword arguments",
        "other parameters",
        "returns",
        "return",
        "yields",
        "yield",
        "raises",
        "raise",
        "example",
        "examples",
        "note",
        "notes",
        "see also",
        "warning",
        "warnings",
        "todo",
        "attributes",
        "references",
    }
)
_ARG_SECTIONS = frozenset({"args", "arguments", "parameters", "params", "keyword args", "keyword arguments"})
_HEADER_RE = re.compile(r"^([A-Za-z][A-Za-z ]*):\s*$")
# "name: text", "*args: text", "name (int): text", "name (Optional[str], optional): text"
_ARG_RE = re.compile(r"^\*{0,2}([A-Za-z_][A-Za-z0-9_]*)\s*(?:\([^)]*\))?\s*:\s*(.*)$")


@dataclass
class Docstring:
    """What a docstring says: ``description`` (free text, may span lines) and ``args`` (name to help)."""

    description: str = ""
    args: dict[str, str] = field(default_factory=dict)

    @property
    def summary(self) -> str:
        """The first line of the description (what ``tsm builtins`` shows), or ``""``."""
        return self.description.split("\n", 1)[0].strip()


def parse_docstring(doc: str | None) -> Docstring:
    """Parse ``doc`` (raw ``__doc__`` or an already-cleaned docstring); ``None`` gives an empty result."""
    if not doc:
        return Docstring()
    lines = inspect.cleandoc(doc).splitlines()
    description: list[str] = []
    args: dict[str, str] = {}
    section: str | None = None
    arg_indent: int | None = None
    current: str | None = None
    for line in lines:
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        header = _HEADER_RE.match(line) if indent == 0 else None
        if header and header.group(1).strip().lower() in _SECTIONS:
            section = header.group(1).strip().lower()
            arg_indent = None
            current = None
            continue
        if section is None:
            description.append(line.rstrip())
            continue
        if section not in _ARG_SECTIONS or not stripped:
            continue
        if indent == 0:  # text back at the left margin ends the argument list
            section = ""
            continue
        if arg_indent is None:
            arg_indent = indent
        m = _ARG_RE.match(stripped) if indent <= arg_indent else None
        if m:
            current = m.group(1)
            args[current] = m.group(2).strip()
        elif current is not None:
            args[current] = f"{args[current]} {stripped}".strip()
    return Docstring(description="\n".join(description).strip(), args=args)
