"""Entry points of tsm's plugin groups, without paying for :mod:`importlib.metadata` when there are none.

``importlib.metadata.entry_points(group=...)`` imports about 12 ms of modules (``email``, ``zipfile``,
``csv``, ...) and then reads and parses the metadata of every installed distribution, about 7 ms per group
with a hundred distributions installed. Every ``tsm`` command paid that for the event sinks alone, though
almost no installation registers any plugin.

:func:`entry_points` first looks, with a plain directory scan, which groups any distribution on
``sys.path`` names in its ``entry_points.txt`` (one ``scandir`` per path entry, one small read per
distribution). Only when a requested group is named (or the scan cannot tell: a zip or egg on the path,
or an import hook that finds distributions itself) does it ask :mod:`importlib.metadata`, so what it
returns is exactly what that returns; otherwise it returns ``[]`` without importing it. Nothing is cached
here: callers keep their own caches, as before, and a plugin added to ``sys.path`` later is still found.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # keeps typing out of start-up; type checkers treat it as True
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

#: The metadata directories importlib.metadata reads a distribution's ``entry_points.txt`` from.
_META_SUFFIXES = (".dist-info", ".egg-info")


def named_groups() -> set[str] | None:
    """Every entry-point group some distribution on ``sys.path`` names, or None when a scan cannot tell.

    A superset of what :mod:`importlib.metadata` would list (shadowed distributions count here too),
    which is what makes the shortcut safe: a group not in it has no entry point.
    """
    from importlib.machinery import PathFinder

    for finder in sys.meta_path:  # a hook that finds distributions elsewhere: only importlib knows
        if finder is not PathFinder and getattr(finder, "find_distributions", None) is not None:
            return None
    groups: set[str] = set()
    for entry in sys.path:
        if not isinstance(entry, str):
            return None
        base = entry or "."
        if base.lower().endswith(".egg"):
            return None  # an egg keeps its metadata in EGG-INFO (or in a zip): rare, leave it to importlib
        try:
            children = os.scandir(base)
        except OSError:
            if os.path.isfile(base):
                return None  # a zip on the path (python311.zip, a zipapp): importlib reads those
            continue  # missing or unreadable: importlib finds nothing there either
        with children:
            for child in children:
                if not child.name.lower().endswith(_META_SUFFIXES):
                    continue
                try:
                    with open(os.path.join(child.path, "entry_points.txt"), "rb") as f:
                        text = f.read().decode("utf-8", "replace")
                except OSError:  # no entry points (or an .egg-info file, which has none)
                    continue
                for line in text.splitlines():
                    line = line.strip()
                    if line.startswith("[") and line.endswith("]"):
                        groups.add(line.strip("[]"))
    return groups


def entry_points(groups: Sequence[str]) -> list[Any]:
    """The entry points of each group in ``groups``, in that order: ``importlib.metadata.entry_points(group=g)``
    for each, concatenated, or ``[]`` without importing :mod:`importlib.metadata` when no distribution names
    any of them."""
    named = named_groups()
    if named is not None and not named.intersection(groups):
        return []
    from importlib.metadata import entry_points as _entry_points

    # ``group`` checked again: a test that patches ``importlib.metadata.entry_points`` may answer every group
    return [ep for group in groups for ep in _entry_points(group=group) if getattr(ep, "group", group) == group]
