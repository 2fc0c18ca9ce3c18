"""The process-wide view of a host's queue: many ``describe`` calls share few ``squeue``/``sacct`` calls.

:class:`SlurmQueries` is a :class:`~tsm.schedulers.common.watcher.StatusWatcher` whose snapshot is one
``squeue`` of this user's jobs and whose lookup is one ``sacct -D -j <ids>`` for every job the controller has
forgotten, both in the columns tsm reads (:mod:`.parse`). A cluster without accounting is read from
``squeue`` and the job directories alone.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable, Sequence

from tsm.schedulers.common.watcher import StatusWatcher
from tsm.schedulers.slurm import cli
from tsm.schedulers.slurm.parse import (
    SQUEUE_ARGS,
    SlurmJob,
    id_key,
    parse_sacct_text,
    parse_squeue_text,
    sacct_args,
)

Runner = Callable[[list[str]], subprocess.CompletedProcess[str]]


def _ended(recs: list[SlurmJob]) -> bool:
    return bool(recs) and all(r.state.is_terminal for r in recs)


class SlurmQueries(StatusWatcher[list[SlurmJob]]):
    """One process-wide, thread-safe view of a host's queue, so many ``describe`` calls share few Slurm calls.

    ``squeue`` lists every job the controller holds; one answer is reused by every caller for ``max_age``
    seconds (default 1 s) and, while one thread asks Slurm, the others wait for its answer rather than ask
    again. Jobs the controller has forgotten are looked up with ``sacct -D``, all the ids wanted in the last
    minute in one call; ended jobs are cached for good, missing ones are asked again at most every 5 s.
    ``runner`` runs the commands (a login node's over SSH; default :func:`tsm.schedulers.slurm.cli.run`).
    """

    def __init__(self, runner: Runner | None = None) -> None:
        super().__init__(self._squeue_snapshot, self._sacct_lookup, is_terminal=_ended, lookup_interval=5.0)
        self._runner = runner
        self.sacct_available = True

    def _run(self, args: list[str]) -> subprocess.CompletedProcess[str]:
        return self._runner(args) if self._runner is not None else cli.run(args)

    def _squeue_snapshot(self) -> dict[str, list[SlurmJob]]:
        return parse_squeue_text(cli.check(self._run(SQUEUE_ARGS), "squeue"))

    def _sacct_lookup(self, ids: list[str]) -> dict[str, list[SlurmJob]]:
        if not self.sacct_available:
            return {}
        proc = self._run(sacct_args("-D", "-j", ",".join(sorted(ids, key=id_key))))
        if proc.returncode != 0:
            if "accounting storage is disabled" in proc.stderr.lower() or "slurmdbd" in proc.stderr.lower():
                self.sacct_available = False  # no accounting: squeue and the job directory are all there is
                return {}
            cli.check(proc, "sacct")
        return parse_sacct_text(proc.stdout)

    def job(self, app_id: str, max_age: float = 1.0) -> list[SlurmJob] | None:
        """The component records of app ``app_id`` (sorted by offset), or None when Slurm does not know it."""
        return self.get(app_id, max_age)

    def jobs(self, app_ids: Sequence[str], max_age: float = 1.0) -> dict[str, list[SlurmJob]]:
        """The records of each of ``app_ids`` Slurm knows, from at most one ``squeue`` and one ``sacct``.

        What a view's tick asks (:mod:`tsm.schedulers.slurm.view`): the snapshot (no older than ``max_age``)
        answers the jobs the controller holds; the others, those not known to have ended, are looked up
        in *one* ``sacct`` for all of them, each at most every ``lookup_interval`` seconds (``get`` would
        ask one at a time). Ended jobs are remembered for good, as by :meth:`job`.
        """
        out: dict[str, list[SlurmJob]] = {}
        with self._lock:
            now = time.monotonic()
            if now - self._snapshot_at > max_age or any(
                self._submitted.get(i, float("-inf")) >= self._snapshot_began for i in app_ids
            ):
                self._refresh()
            missing = []
            for app_id in app_ids:
                found = self._final.get(app_id) or self._snapshot.get(app_id)
                if found:
                    out[app_id] = found
                else:
                    missing.append(app_id)
            due = [i for i in missing if now - self._lookup_at.get(i, float("-inf")) > self.lookup_interval]
            if due:
                self._refresh_lookup(due)  # one sacct for every job the controller no longer holds
            for app_id in missing:
                found = self._final.get(app_id) or self._looked.get(app_id)
                if found:
                    out[app_id] = found
        return out

    def queue(self, max_age: float = 1.0) -> dict[str, list[SlurmJob]]:
        """Every job ``squeue`` shows for this user, by app id."""
        return self.all(max_age)

    def listing(self, since: str = "now-7days", max_age: float = 1.0) -> dict[str, list[SlurmJob]]:
        """This user's jobs ``sacct`` recorded since ``since``, as ``squeue`` shows them where it does: the
        two are asked at the same time (the ``sacct`` in a thread), so a list waits for the slower one only."""
        got: list[dict[str, list[SlurmJob]]] = []
        failed: list[BaseException] = []

        def ask_sacct() -> None:
            try:
                got.append(self.recent(since))
            except BaseException as e:  # noqa: BLE001 - raised again in the caller's thread
                failed.append(e)

        t = threading.Thread(target=ask_sacct, name="tsm-slurm-sacct", daemon=True)
        t.start()
        try:
            queued = self.queue(max_age)
        finally:
            t.join()
        if failed:
            raise failed[0]
        return {**(got[0] if got else {}), **queued}

    def recent(self, since: str = "now-7days") -> dict[str, list[SlurmJob]]:
        """This user's jobs that ``sacct`` recorded since ``since`` (empty without accounting)."""
        if not self.sacct_available:
            return {}
        proc = self._run(sacct_args("-S", since))
        if proc.returncode != 0:
            return {}
        return parse_sacct_text(proc.stdout)


_queries: SlurmQueries | None = None
_queries_lock = threading.Lock()


def queries() -> SlurmQueries:
    """The process-wide :class:`SlurmQueries`."""
    global _queries
    with _queries_lock:
        if _queries is None:
            _queries = SlurmQueries()
        return _queries
