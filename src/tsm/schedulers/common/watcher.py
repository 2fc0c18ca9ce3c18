"""StatusWatcher: many ``describe`` calls, from many threads, served by few calls to the backend.

A backend gives two batched functions:

* ``snapshot()`` -> ``{app id: status}`` for every app the backend lists now (one ``squeue``, one
  label-selected list of pods or containers);
* ``lookup(ids)`` -> ``{app id: status}`` for apps the snapshot no longer shows (``sacct`` for jobs the
  controller forgot, an events API); optional.

and :meth:`StatusWatcher.get` answers one app:

1. An app seen in a terminal state is answered from the cache for good (terminal states are sticky).
2. A snapshot younger than ``max_age`` seconds is reused; otherwise one caller takes a new one while the
   others wait on the lock and reuse its answer (single flight), so N waiting threads cost one call a tick.
3. An app submitted after the snapshot began cannot be in it, so it forces a new one (:meth:`submitted`).
4. Apps not in the snapshot are looked up together: every id asked for in the last minute, at most once
   per ``lookup_interval`` (5 s) each, in one ``lookup`` call.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

S = TypeVar("S")

#: Ids asked for within this many seconds are looked up together.
WANTED_FOR = 60.0


class StatusWatcher(Generic[S]):
    """A thread-safe, process-wide cache of app statuses fed by batched backend calls (see the module doc)."""

    def __init__(
        self,
        snapshot: Callable[[], dict[str, S]],
        lookup: Callable[[list[str]], dict[str, S]] | None = None,
        *,
        is_terminal: Callable[[S], bool],
        lookup_interval: float = 5.0,
    ) -> None:
        self._take_snapshot = snapshot
        self._lookup = lookup
        self._is_terminal = is_terminal
        self.lookup_interval = lookup_interval
        self._lock = threading.Lock()
        self._snapshot: dict[str, S] = {}
        self._snapshot_at = float("-inf")
        self._snapshot_began = float("-inf")
        self._final: dict[str, S] = {}
        self._looked: dict[str, S] = {}
        self._lookup_at: dict[str, float] = {}
        self._wanted: dict[str, float] = {}
        self._submitted: dict[str, float] = {}

    def invalidate(self) -> None:
        """Forget the snapshot (after a cancel, so the next look is fresh)."""
        with self._lock:
            self._snapshot_at = float("-inf")

    def submitted(self, app_id: str) -> None:
        """Note an app this process just submitted: a snapshot begun before now cannot show it."""
        with self._lock:
            self._submitted[app_id] = time.monotonic()
            self._snapshot_at = float("-inf")

    def _refresh(self) -> None:
        self._snapshot_began = time.monotonic()
        self._snapshot = self._take_snapshot()
        self._snapshot_at = time.monotonic()

    def _refresh_lookup(self, ids: list[str]) -> None:
        if not ids or self._lookup is None:
            return
        now = time.monotonic()
        for i in ids:
            self._lookup_at[i] = now
        for i in [i for i, t in self._wanted.items() if now - t > WANTED_FOR]:
            del self._wanted[i]  # nobody asked for a minute
        for app_id, status in self._lookup(ids).items():
            self._looked[app_id] = status
            if self._is_terminal(status):
                self._final[app_id] = status
                self._wanted.pop(app_id, None)

    def get(self, app_id: str, max_age: float = 1.0) -> S | None:
        """The status of ``app_id`` no older than ``max_age`` seconds (terminal: cached), or None if unknown."""
        with self._lock:
            if app_id in self._final:
                return self._final[app_id]
            now = time.monotonic()
            if now - self._snapshot_at > max_age:
                self._refresh()
            status = self._snapshot.get(app_id)
            if not status and self._submitted.get(app_id, float("-inf")) >= self._snapshot_began:
                self._refresh()  # the snapshot began before this app was submitted
                status = self._snapshot.get(app_id)
            if status:
                return status
            self._wanted[app_id] = now
            last = self._lookup_at.get(app_id)
            if last is None or now - last > max(max_age, self.lookup_interval):
                ids = [i for i, t in self._wanted.items() if now - t < WANTED_FOR and i not in self._snapshot]
                ids = [i for i in ids if i == app_id or now - self._lookup_at.get(i, float("-inf")) > max_age]
                self._refresh_lookup(ids)
            return self._final.get(app_id) or self._looked.get(app_id)

    def all(self, max_age: float = 1.0) -> dict[str, S]:
        """Every app of the snapshot (no older than ``max_age`` seconds)."""
        with self._lock:
            if time.monotonic() - self._snapshot_at > max_age:
                self._refresh()
            return dict(self._snapshot)
