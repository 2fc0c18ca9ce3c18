"""TorchX's ``util.io``: :func:`read_conf_file`, the text of a file the linter and finder read."""

from __future__ import annotations

__all__ = ["read_conf_file"]


def read_conf_file(conf_file: str) -> str:
    """The text of ``conf_file`` (a path; relative to the working directory)."""
    with open(conf_file, encoding="utf-8") as f:
        return f.read()
