"""MkDocs hook: fills the command-line reference page from the argparse parsers at build time."""

from __future__ import annotations

from typing import Any

MARKER = "<!-- cli-reference -->"


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    """Replace :data:`MARKER` with the reference :func:`tsm.cli.reference.markdown` makes from the code."""
    if MARKER not in markdown:
        return markdown
    from tsm.cli.reference import markdown as reference

    return markdown.replace(MARKER, reference())
