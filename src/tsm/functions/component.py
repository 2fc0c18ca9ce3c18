"""The component every trial of a :func:`tsm.functions.map` is made from (the sweep machinery runs components).

The sweep's one axis is ``item`` (``<index>:<the item's pickled arguments>``); the words after ``--`` are the
map's :class:`~tsm.functions.app.Plan`, pickled. Kept to this one function: the sweep controller and the
Slurm array import this file by path.
"""

from __future__ import annotations

import pickle

from tsm.functions import payload
from tsm.functions.app import app_of
from tsm.specs.api import AppDef


def trial(item: str, *plan: str) -> AppDef:
    """One item of a map as an app.

    Args:
        item: the item's index and pickled arguments, as ``<index>:<base64>``
        plan: the map's plan, pickled, in base64 words
    """
    index, _, words = item.partition(":")
    loaded = pickle.loads(payload.from_words(plan))  # noqa: S301 - the plan tsm.functions.map wrote itself
    return app_of(loaded, int(index), words or None)
