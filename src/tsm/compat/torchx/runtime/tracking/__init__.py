"""TorchX's ``runtime.tracking``: results an app records under a key, read back by whoever launched it.

``tracker[key] = {"accuracy": 0.9}`` saves a JSON object at ``<tracker_base>/<key>``; ``tracker[key]``
reads it back (``{}`` when nothing was saved). A plain path or ``file://`` URL is written with the
standard library; any other URL (``s3://...``) through ``fsspec``, which must then be installed. The
``utils.booth`` builtin writes its result this way.
"""

from __future__ import annotations

import abc
import json
import os
from typing import Any

__all__ = ["FsspecResultTracker", "ResultTracker"]

KeyType = int | str
ResultType = int | float | str


class ResultTracker(abc.ABC):
    """Results by key: ``put``/``get``, also as ``tracker[key] = {...}`` and ``tracker[key]``."""

    def __getitem__(self, key: KeyType) -> dict[str, ResultType]:
        return self.get(key)

    def __setitem__(self, key: KeyType, results: dict[str, ResultType]) -> None:
        self.put(key, **results)

    @abc.abstractmethod
    def put(self, key: KeyType, **results: ResultType) -> None:
        """Save ``results`` under ``str(key)`` (replacing what was there)."""

    @abc.abstractmethod
    def get(self, key: KeyType) -> dict[str, ResultType]:
        """The results saved under ``str(key)``, or ``{}``."""


class FsspecResultTracker(ResultTracker):
    """Results as one JSON file per key under ``tracker_base`` (a folder or an fsspec URL)."""

    def __init__(self, tracker_base: str) -> None:
        self._base = tracker_base[len("file://"):] if tracker_base.startswith("file://") else tracker_base

    def _remote(self) -> bool:
        return "://" in self._base

    def put(self, key: KeyType, **results: ResultType) -> None:
        """Write ``results`` as JSON to ``<tracker_base>/<key>``."""
        text = json.dumps(results, indent=2)
        if self._remote():
            fsspec: Any = __import__("fsspec")
            fsspec.get_mapper(self._base, create=True)[str(key)] = text.encode()
            return
        path = os.path.join(self._base, str(key))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)

    def get(self, key: KeyType) -> dict[str, ResultType]:
        """The JSON object at ``<tracker_base>/<key>``, or ``{}`` when there is none."""
        if self._remote():
            fsspec: Any = __import__("fsspec")
            mapper = fsspec.get_mapper(self._base)
            return json.loads(mapper[str(key)]) if str(key) in mapper else {}
        path = os.path.join(self._base, str(key))
        if not os.path.isfile(path):
            return {}
        with open(path, encoding="utf-8") as f:
            data: dict[str, ResultType] = json.load(f)
        return data
