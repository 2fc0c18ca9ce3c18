"""CPU, memory and GPU samples of running replicas, kept in the store so an ended app still shows its curves.

Who samples: the process that refreshes a view (``tsm serve``) calls :meth:`SampleRecorder.record` on
each snapshot; the recorder keeps at most one row per running replica per ``interval`` seconds
(default 5), written in one transaction. An app is therefore charted over the part of its life during
which a ``tsm serve`` was running; its samples stay after it ends and go when ``tsm rm`` forgets the app
(:meth:`SampleRecorder.forget_removed`, run when a recorder starts and then once a minute).

The table, ``view_samples``, belongs to this module alone and is created on first use.
"""

from __future__ import annotations

import time
from typing import Any

from tsm.views.snapshot import Snapshot

#: Seconds between two samples of one replica.
DEFAULT_INTERVAL = 5.0
#: At most this many samples of one app are returned (the newest), so a week-long app stays cheap to chart.
MAX_POINTS = 5000

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS view_samples (handle TEXT NOT NULL, role TEXT NOT NULL, idx INTEGER NOT NULL, "
    "t REAL NOT NULL, cpu REAL, mem_mb REAL, gpu_mem_mb REAL)",
    "CREATE INDEX IF NOT EXISTS view_samples_handle ON view_samples(handle, t)",
)


class SampleRecorder:
    """Writes and reads ``view_samples`` in ``store`` (a :class:`tsm.store.Store`)."""

    def __init__(self, store: Any, interval: float = DEFAULT_INTERVAL) -> None:
        self.store = store
        self.interval = interval
        self._last = float("-inf")
        self._last_gc = time.monotonic()
        store.write([(sql, ()) for sql in _SCHEMA])
        self.forget_removed()

    def record(self, snap: Snapshot) -> int:
        """Store one sample per running replica of ``snap`` if ``interval`` has passed; returns rows written."""
        now = time.monotonic()
        if now - self._last < self.interval:
            return 0
        rows = [
            (a.handle, r.role, r.idx, snap.taken, r.cpu_used, r.mem_used_mb, r.gpu_mem_mb)
            for a in snap.apps if not a.terminal
            for r in a.replicas if r.cpu_used is not None or r.mem_used_mb is not None
        ]
        if rows:
            self.store.executemany("INSERT INTO view_samples VALUES (?,?,?,?,?,?,?)", rows)
            self._last = now
        if now - self._last_gc > 60:
            self._last_gc = now
            self.forget_removed()
        return len(rows)

    def samples(self, handle: str) -> dict[str, list[list[float | None]]]:
        """``"role/idx"`` -> ``[[t, cpu, mem_mb, gpu_mem_mb], ...]`` oldest first (the newest MAX_POINTS)."""
        rows = self.store.query(
            "SELECT role, idx, t, cpu, mem_mb, gpu_mem_mb FROM (SELECT * FROM view_samples WHERE handle=? "
            "ORDER BY t DESC LIMIT ?) ORDER BY t", (handle, MAX_POINTS),
        )
        out: dict[str, list[list[float | None]]] = {}
        for r in rows:
            out.setdefault(f"{r['role']}/{r['idx']}", []).append([r["t"], r["cpu"], r["mem_mb"], r["gpu_mem_mb"]])
        return out

    def forget_removed(self) -> None:
        """Delete the samples of apps no longer in the history (removed with ``tsm rm``)."""
        self.store.write([("DELETE FROM view_samples WHERE handle NOT IN (SELECT handle FROM apps)", ())])
