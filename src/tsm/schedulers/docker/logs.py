"""Docker's logs: reading them live, following them across restarts, and keeping them when a container goes.

Docker keeps a container's stdout and stderr apart (``local`` log driver, bytes as written) until the
container is removed. Before tsm removes one, its output is streamed into the app directory
(``logs/<container>/attempt-N/{stdout,stderr,combined,stdout.ts,stderr.ts}``, then ``done``), chunk by chunk
as Docker sends it, so a long log is never held in memory; ``log_iter`` reads those snapshots for the tries
that are gone and Docker for the container that is there.
"""

from __future__ import annotations

import builtins
import contextlib
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

from tsm.schedulers.common.container import ContainerScheduler
from tsm.schedulers.common.errors import ApiError
from tsm.schedulers.common.logs import (
    decode,
    in_window,
    split_lines,
    split_lines_iterator,
    utf8_chunks,
)
from tsm.schedulers.common.polling import poll_until
from tsm.schedulers.docker.client import DockerClient
from tsm.schedulers.docker.request import DockerRequest, dns_name
from tsm.schedulers.docker.status import AppView, Observed, parse_time

#: the files a snapshot holds: name -> (stdout, stderr, timestamps)
SNAPSHOT_FILES = {
    "stdout": (True, False, False), "stderr": (False, True, False), "combined": (True, True, False),
    "stdout.ts": (True, False, True), "stderr.ts": (False, True, True),
}


class DockerLogs(ContainerScheduler[DockerRequest, AppView]):
    """The log half of :class:`~tsm.schedulers.docker.scheduler.DockerScheduler` (on the container kit's base)."""

    @property
    def client(self) -> DockerClient:
        raise NotImplementedError

    def _snapshot_logs(self, app_id: str, c: Observed) -> None:
        """Stream a container's output into the app directory (once per try; see the module doc)."""
        d = self.app_dir(app_id)
        base = f"logs/{c.name}/attempt-{c.attempt}"
        if d.exists(f"{base}/done"):
            return
        try:
            for name, (out, err, ts) in SNAPSHOT_FILES.items():
                d.write(f"{base}/{name}", self.client.log_chunks(c.id, out, err, timestamps=ts))
        except ApiError as e:
            if e.status == 404:
                return  # removed meanwhile: nothing more to keep
            raise
        d.write(f"{base}/done", "")

    def _lines(self, app_id: str, role: str, k: int, names: builtins.list[str], since: datetime | None,
               until: datetime | None, tail: bool) -> Iterator[str]:
        cname = f"{app_id}-{dns_name(role, k)}"
        live = next((c for c in self.client.list_containers(app_id) if c.name == cname), None)
        logs = self.app_dir(app_id).path / "logs" / cname
        snaps = sorted(logs.glob("attempt-*"), key=lambda p: int(p.name.split("-")[1])) if logs.is_dir() else []
        for snap in snaps:
            if live is not None and snap.name == f"attempt-{live.attempt}":
                continue  # the container is still there: read it from Docker
            yield from _snapshot_lines(snap, names, since, until)
        if live is None:
            return
        out, err = "stdout" in names, "stderr" in names
        s = since.timestamp() if since else None
        if tail and until is None:
            chunks = (decode(b) for b in utf8_chunks(self._follow_restarts(app_id, live, out, err, s)))
            yield from split_lines_iterator(chunks)
            return
        u = until.timestamp() if until else None
        yield from split_lines(decode(self.client.logs(live.id, out, err, since=s, until=u)))

    def _follow_restarts(self, app_id: str, live: Observed, out: bool, err: bool, since: float | None) -> Iterator[bytes]:
        """Docker's follow of one container, continued across the restarts Docker makes (REPLICA retries).

        A follow ends when the container stops; if Docker will start it again, it is followed again and
        the bytes already given are skipped (the container keeps one log across its restarts).
        """
        consumed, last = 0, False
        while True:
            skip = consumed
            for chunk in self.client.follow(live.id, out, err, since=since):
                if skip >= len(chunk):
                    skip -= len(chunk)
                    continue
                chunk, skip = chunk[skip:], 0
                consumed += len(chunk)
                yield chunk
            if last:
                return

            def next_run() -> str | None:
                # None while Docker waits to restart it. A restarted run may be over before a poll sees it
                # "running" (restarts back off from 100 ms), so anything else is read again: "last" once
                # it is final (a read of a stopped container returns its whole log and ends), "gone" if removed.
                now = next((c for c in self.client.list_containers(app_id) if c.id == live.id), None)
                if now is None:
                    return "gone"
                if now.state == "restarting":
                    return None
                return "last" if now.final else "again"

            seen = poll_until(next_run, None, initial=0.05, cap=0.5)
            if seen == "gone":
                return
            last = seen == "last"


def _snapshot_lines(snap: Path, names: list[str], since: datetime | None, until: datetime | None) -> Iterator[str]:
    if since is None and until is None:
        name = names[0] if len(names) == 1 else "combined"
        with contextlib.suppress(OSError):
            yield from split_lines(decode((snap / name).read_bytes()))
        return
    stamped: list[tuple[float, int, str]] = []
    for i, name in enumerate(names):
        try:
            raw = (snap / f"{name}.ts").read_bytes()
        except OSError:
            continue
        for n, line in enumerate(raw.split(b"\n")):
            if not line:
                continue
            head, _, body = line.partition(b" ")
            when = parse_time(head.decode("ascii", "replace"))
            if when is None:
                body = line
            if in_window(when, since, until):
                stamped.append((when or 0.0, i * 10**9 + n, decode(body) + "\n"))
    for _, _, text in sorted(stamped):
        yield text
