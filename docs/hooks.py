"""MkDocs hook: fills the generated parts of pages at build time, from the code, so no manual is written twice.

* ``<!-- cli-reference -->``: the command-line reference, from the argparse parsers (:func:`tsm.cli.reference.markdown`);
* ``<!-- run-options: NAME -->``: scheduler NAME's run options as a table, from the options it declares
  (:func:`tsm.cli.reference.run_options`, what ``tsm runopts NAME`` prints). Every scheduler's page has one;
  a page for a scheduler the registry does not know fails the build.
"""

from __future__ import annotations

import re
from typing import Any

MARKER = "<!-- cli-reference -->"
RUN_OPTIONS = re.compile(r"<!-- run-options: (?P<name>[A-Za-z0-9_]+) -->")


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    """Replace :data:`MARKER` and every :data:`RUN_OPTIONS` marker with what the code says."""
    if MARKER in markdown:
        from tsm.cli.reference import markdown as reference

        markdown = markdown.replace(MARKER, reference())
    if RUN_OPTIONS.search(markdown):
        from tsm.cli.reference import run_options

        markdown = RUN_OPTIONS.sub(lambda m: run_options(m.group("name")), markdown)
    return markdown
