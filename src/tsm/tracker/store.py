"""The built-in tracker ``tsm``: runs recorded in the local store (``$TSM_HOME/tsm.db``), no server.

Four tables, created on first use (``CREATE TABLE IF NOT EXISTS``) beside the store's own::

    tracker_runs       run_id, created, updated             every run anything was recorded for
    tracker_metadata   run_id, key, value (JSON), updated   one row per key; a later value replaces it
    tracker_artifacts  run_id, name, path, metadata (JSON)  one row per artifact name
    tracker_sources    run_id, source_id, artifact_name     the lineage edges (child -> parent)

Values are stored as JSON; a value JSON cannot hold (a set, an object) is stored as its ``str()``.
Writes are one transaction each and idempotent where that makes sense (recording the same source
twice keeps one edge). The config string, if given, is the path of another SQLite file to use (for
example one on a file system that Slurm nodes share); by default the job's ``$TSM_HOME`` store.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from tsm.errors import StoreError
from tsm.tracker.api import (
    Lineage,
    TrackerArtifact,
    TrackerBase,
    TrackerError,
    TrackerSource,
    UnknownRunError,
)

_TABLES = (
    "CREATE TABLE IF NOT EXISTS tracker_runs (run_id TEXT PRIMARY KEY, created REAL NOT NULL, updated REAL NOT NULL)",
    "CREATE TABLE IF NOT EXISTS tracker_metadata (run_id TEXT NOT NULL, key TEXT NOT NULL, value TEXT NOT NULL, "
    "updated REAL NOT NULL, PRIMARY KEY (run_id, key))",
    "CREATE TABLE IF NOT EXISTS tracker_artifacts (run_id TEXT NOT NULL, name TEXT NOT NULL, path TEXT NOT NULL, "
    "metadata TEXT, updated REAL NOT NULL, PRIMARY KEY (run_id, name))",
    "CREATE TABLE IF NOT EXISTS tracker_sources (run_id TEXT NOT NULL, source_id TEXT NOT NULL, "
    "artifact_name TEXT NOT NULL DEFAULT '', created REAL NOT NULL, PRIMARY KEY (run_id, source_id, artifact_name))",
    "CREATE INDEX IF NOT EXISTS tracker_sources_source ON tracker_sources(source_id)",
)
#: How deep :meth:`StoreTracker.lineage` follows parents and children (a guard against huge graphs).
MAX_DEPTH = 64


#: How deeply a recorded value may nest (lists in dicts in lists ...): deeper is refused with TrackerError,
#: so neither the JSON encoder nor a later reader recurses without bound.
MAX_NESTING = 100


def _nesting(value: object) -> int:
    """How deeply ``value``'s lists, tuples and dicts nest (0 for a scalar), counted without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, dict):
            items: Iterable[object] = v.values()
        elif isinstance(v, (list, tuple)):
            items = v
        else:
            continue
        deepest = max(deepest, depth)
        if depth > MAX_NESTING:
            return depth
        stack.extend((x, depth + 1) for x in items)
    return deepest


def _json(value: object, what: str) -> str:
    if _nesting(value) > MAX_NESTING:
        raise TrackerError(f"cannot store {what}: it nests deeper than {MAX_NESTING} levels")
    try:
        return json.dumps(value, default=str, allow_nan=True)
    except (TypeError, ValueError, RecursionError) as e:  # circular structures
        raise TrackerError(f"cannot store {what}: {e}") from e


def _load(text: str, what: str) -> Any:
    """A stored JSON value; TrackerError (never RecursionError) for one nested beyond the parser's reach."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as e:
        raise TrackerError(f"cannot read {what}: {type(e).__name__}") from e


def _reaches(start: Lineage, goal: Lineage, up: bool) -> bool:
    """Whether ``goal`` is ``start`` or lies beyond it (its parents when ``up``, else its children)."""
    stack, seen = [start], set()
    while stack:
        n = stack.pop()
        if n is goal:
            return True
        if id(n) not in seen:
            seen.add(id(n))
            stack.extend(n.parents if up else n.children)
    return False


def _check_id(value: object, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise TrackerError(f"{what} must be a non-empty string, not {value!r}")
    if "\0" in value:
        raise TrackerError(f"{what} must not contain NUL characters")
    return value


class StoreTracker(TrackerBase):
    """Tracker backend on the local SQLite store; see the module doc for what it stores."""

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path else None
        self._store: Any = None
        self._ready = False

    def _db(self) -> Any:
        if self._store is None:
            from tsm.store import Store

            self._store = Store(self.path)
        return self._store

    def _write(self, run_id: str, statements: list[tuple[str, tuple[Any, ...]]]) -> None:
        now = time.time()
        head: list[tuple[str, tuple[Any, ...]]] = [] if self._ready else [(sql, ()) for sql in _TABLES]
        head.append((
            "INSERT INTO tracker_runs (run_id, created, updated) VALUES (?,?,?) "
            "ON CONFLICT(run_id) DO UPDATE SET updated=excluded.updated",
            (run_id, now, now),
        ))
        self._db().write(head + statements)
        self._ready = True

    def _query(self, sql: str, params: tuple[Any, ...] = ()) -> list[Any]:
        try:
            rows: list[Any] = self._db().query(sql, params)
            return rows
        except StoreError as e:
            if "no such table" in str(e):
                return []  # nothing was ever recorded in this store
            raise

    # -- writes ---------------------------------------------------------------------------------
    def add_metadata(self, run_id: str, **kwargs: object) -> None:
        _check_id(run_id, "run id")
        if not kwargs:
            return
        now = time.time()
        self._write(run_id, [
            ("INSERT OR REPLACE INTO tracker_metadata (run_id, key, value, updated) VALUES (?,?,?,?)",
             (run_id, key, _json(value, f"metadata {key!r}"), now))
            for key, value in kwargs.items()
        ])

    def add_artifact(self, run_id: str, name: str, path: str, metadata: Mapping[str, object] | None = None) -> None:
        _check_id(run_id, "run id")
        _check_id(name, "artifact name")
        if not isinstance(path, str):
            raise TrackerError(f"artifact path must be a string, not {path!r}")
        meta = None if metadata is None else _json(dict(metadata), f"metadata of artifact {name!r}")
        self._write(run_id, [(
            "INSERT OR REPLACE INTO tracker_artifacts (run_id, name, path, metadata, updated) VALUES (?,?,?,?,?)",
            (run_id, name, path, meta, time.time()),
        )])

    def add_source(self, run_id: str, source_id: str, artifact_name: str | None = None) -> None:
        _check_id(run_id, "run id")
        _check_id(source_id, "source id")
        if source_id == run_id:
            raise TrackerError(f"run {run_id} cannot be its own source")
        self._write(run_id, [(
            "INSERT OR IGNORE INTO tracker_sources (run_id, source_id, artifact_name, created) VALUES (?,?,?,?)",
            (run_id, source_id, artifact_name or "", time.time()),
        )])

    # -- reads ----------------------------------------------------------------------------------
    def metadata(self, run_id: str) -> Mapping[str, object]:
        rows = self._query("SELECT key, value FROM tracker_metadata WHERE run_id=? ORDER BY key", (run_id,))
        return {r["key"]: _load(r["value"], f"metadata {r['key']!r} of {run_id}") for r in rows}

    def artifacts(self, run_id: str) -> Mapping[str, TrackerArtifact]:
        rows = self._query("SELECT name, path, metadata FROM tracker_artifacts WHERE run_id=? ORDER BY name", (run_id,))
        return {
            r["name"]: TrackerArtifact(r["name"], r["path"],
                                       None if r["metadata"] is None else _load(r["metadata"], f"artifact {r['name']!r}"))
            for r in rows
        }

    def sources(self, run_id: str, artifact_name: str | None = None) -> Iterable[TrackerSource]:
        sql = "SELECT source_id, artifact_name FROM tracker_sources WHERE run_id=?"
        params: tuple[Any, ...] = (run_id,)
        if artifact_name is not None:
            sql += " AND artifact_name=?"
            params += (artifact_name,)
        rows = self._query(sql + " ORDER BY created, source_id", params)
        return [TrackerSource(r["source_id"], r["artifact_name"] or None) for r in rows]

    def children(self, run_id: str) -> Iterable[str]:
        rows = self._query(
            "SELECT run_id, MIN(created) AS c FROM tracker_sources WHERE source_id=? GROUP BY run_id ORDER BY c, run_id",
            (run_id,),
        )
        return [r["run_id"] for r in rows]

    def _child_links(self, run_id: str) -> list[tuple[str, str | None]]:
        rows = self._query(
            "SELECT run_id, artifact_name FROM tracker_sources WHERE source_id=? ORDER BY created, run_id", (run_id,)
        )
        return [(r["run_id"], r["artifact_name"] or None) for r in rows]

    def lineage(self, run_id: str) -> Lineage:
        """Ancestors and descendants of ``run_id`` as a DAG, followed at most :data:`MAX_DEPTH` levels.

        Breadth first, one query per run: each run is one node however many paths reach it (a shared
        ancestor is referenced, not copied, so 33 runs cost 33 nodes, not one per path). An edge that
        would close a cycle is left out, so the result is always acyclic and every walk of it ends.
        """
        root = Lineage(run_id)

        def grow(up: bool) -> None:
            nodes = {run_id: root}
            level = [root]
            for _ in range(MAX_DEPTH):
                nxt: list[Lineage] = []
                for node in level:
                    links = ([(s.source_run_id, s.artifact_name) for s in self.sources(node.run_id)] if up
                             else self._child_links(node.run_id))
                    for other_id, kind in links:
                        other = nodes.get(other_id)
                        if other is None:
                            other = nodes[other_id] = Lineage(other_id, kind)
                            nxt.append(other)
                        elif _reaches(other, node, up):
                            continue  # a cycle: shown once, never followed round
                        edges = node.parents if up else node.children
                        if all(e is not other for e in edges):
                            edges.append(other)
                level = nxt
                if not level:
                    return

        grow(up=True)
        grow(up=False)
        return root

    def run_ids(self, **kwargs: str) -> Iterable[str]:
        """Recorded run ids, newest first; ``source_id=ID`` keeps the runs with that source."""
        unknown = set(kwargs) - {"source_id"}
        if unknown:
            raise TrackerError(f"unknown run_ids filter(s) {sorted(unknown)}; the tsm tracker filters by source_id")
        if "source_id" in kwargs:
            return list(self.children(kwargs["source_id"]))
        return [r["run_id"] for r in self._query("SELECT run_id FROM tracker_runs ORDER BY created DESC, run_id")]

    # -- for the CLI ----------------------------------------------------------------------------
    def runs(self, limit: int = 200) -> list[dict[str, Any]]:
        """Recorded runs newest first with counts: run_id, created, updated, metadata, artifacts, sources, children.

        A run known only as another's source (a job that launched children but recorded nothing itself, or
        an external id) is listed too, created when its first child named it.
        """
        rows = self._query(
            "WITH ids(run_id, created, updated) AS ("
            "SELECT run_id, created, updated FROM tracker_runs UNION ALL "
            "SELECT source_id, MIN(created), MAX(created) FROM tracker_sources "
            "WHERE source_id NOT IN (SELECT run_id FROM tracker_runs) GROUP BY source_id) "
            "SELECT r.run_id, r.created, r.updated, "
            "(SELECT COUNT(*) FROM tracker_metadata m WHERE m.run_id=r.run_id) AS metadata, "
            "(SELECT COUNT(*) FROM tracker_artifacts a WHERE a.run_id=r.run_id) AS artifacts, "
            "(SELECT COUNT(*) FROM tracker_sources s WHERE s.run_id=r.run_id) AS sources, "
            "(SELECT COUNT(DISTINCT s.run_id) FROM tracker_sources s WHERE s.source_id=r.run_id) AS children "
            "FROM ids r ORDER BY r.created DESC, r.run_id LIMIT ?",
            (limit,),
        )
        return [dict(r) for r in rows]

    def exists(self, run_id: str) -> bool:
        """True when anything names ``run_id``: a record of its own, or a run that lists it as a source."""
        return bool(
            self._query("SELECT 1 FROM tracker_runs WHERE run_id=?", (run_id,))
            or self._query("SELECT 1 FROM tracker_sources WHERE source_id=? LIMIT 1", (run_id,))
        )

    def require(self, run_id: str) -> None:
        """Raise :class:`UnknownRunError` unless :meth:`exists`."""
        if not self.exists(run_id):
            raise UnknownRunError(f"no tracked run {run_id!r}: nothing was recorded for it; `tsm tracker list` shows runs")

    def close(self) -> None:
        """Close the store connection."""
        if self._store is not None:
            self._store.close()
            self._store = None


def create(config: str | None = None) -> StoreTracker:
    """Factory of the ``tsm`` tracker (entry-point shape): ``config`` is an optional SQLite file path."""
    return StoreTracker(config or None)
