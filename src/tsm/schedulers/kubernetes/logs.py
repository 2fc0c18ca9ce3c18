"""Kubernetes' logs: reading them live, following a pod, and keeping them before tsm deletes the pod.

The kubelet keeps one log per container (stdout and stderr together) until the pod is deleted. Before tsm
deletes a pod, its log is streamed into the app directory (``logs/<host>/<attempt>-<created>-<pod>.log``, as
written, and ``.ts`` with the kubelet's timestamps, for since/until: the runtime cuts lines over 16 KiB and
stamps each part, so only the plain copy is exact), chunk by chunk, never held whole in memory.

A follow of a pod that is deleted meanwhile (a cancel, Ctrl-C of ``tsm run``) ends with the kubelet's own
error text in the stream (``rpc error: code = ... desc = ... No such container``): it is not the replica's
output, so that last line is dropped when the pod is gone (:func:`_without_runtime_error`).
"""

from __future__ import annotations

import builtins
import os
import re
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path

from tsm.errors import NotSupportedError, SchedulerError
from tsm.schedulers.api import Stream
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
from tsm.schedulers.kubernetes.client import KubeClient
from tsm.schedulers.kubernetes.request import KubernetesRequest, host_name
from tsm.schedulers.kubernetes.status import AppView, Pod, from_json

#: seconds a follow waits for a replica's pod to be made, or to start
FOLLOW_WAIT = 600.0
#: seconds a snapshot reads again the log of a container that ran and reads back empty (see _snapshot_log)
EMPTY_LOG_WAIT = 1.5
#: seconds past the grace period a stop follows a pod's log for its last lines
FOLLOW_MARGIN = 10.0
#: what the kubelet writes into a log stream (with status 200) when the container, or its log file, went away
#: under it: the runtime's error, or the kubelet's own when the file it reads logs from is gone
RUNTIME_ERROR = re.compile(rb"^(rpc error: code = \w+ desc = .*|unable to retrieve container logs for .*"
                           rb'|failed to try resolving symlinks in path ".*": .*|failed to open log file ".*": .*)$')


class KubernetesLogs(ContainerScheduler[KubernetesRequest, AppView]):
    """The log half of :class:`~tsm.schedulers.kubernetes.scheduler.KubernetesScheduler` (on the container
    kit's base)."""

    def client_for(self, req: KubernetesRequest | None) -> KubeClient:
        raise NotImplementedError

    def _log_name(self, p: Pod) -> str:
        return f"logs/{host_name(p.role, p.replica_id)}/{p.attempt:03d}-{p.created:.3f}-{p.name}.log"

    def _snapshot_log(self, app_id: str, client: KubeClient, p: Pod, again: bool = False) -> None:
        """Stream a pod's log into the app directory (see the module doc): a kept log is never replaced by
        a shorter one, and a pod that is gone leaves what is kept as it is.

        Two processes may finish one app at once (a sweep's controller and ``tsm wait``): one keeps the log
        and deletes the pod while the other is still reading; the other's read then finds no pod (404) and
        must not write its empty answer over the kept log, nor the kubelet's text for a container already
        removed or for a log file already gone (:data:`RUNTIME_ERROR`, with status 200), which is no log (``again``: read it anew even when a log is kept,
        for the lines a pod wrote after it, e.g. while warned). A container that has just ended can read
        back empty for a moment (the runtime's log copier lags its exit): it is read again for up to
        :data:`EMPTY_LOG_WAIT` seconds before an empty log is kept.
        """
        d = self.app_dir(app_id)
        name = self._log_name(p)
        kept = d.path / name
        if _size(kept) > 0 and not again:
            return
        ended = p.exit_code is not None
        part = f"{name[:-4]}.{os.getpid()}-{secrets.token_hex(3)}.part"  # not *.log: readers never see it
        waited, pause = 0.0, 0.1
        try:
            while True:
                try:
                    stamped = d.write(part + ".ts", client.log_chunks(p.name, timestamps=True))
                    n = min(stamped, d.write(part, client.log_chunks(p.name)))
                except ApiError as e:
                    if e.status == 404:  # gone: whoever deleted it kept its log first
                        return
                    raise
                if _kubelet_error_only(d.path / part):  # its container is removed: nothing left to keep
                    return
                if n or not ended or waited >= EMPTY_LOG_WAIT:
                    break
                time.sleep(pause)
                waited += pause
                pause = min(pause * 2, 0.4)
            _keep_longer(d.path / (part + ".ts"), kept.with_suffix(".ts"))
            _keep_longer(d.path / part, kept)
        finally:
            for f in (d.path / part, d.path / (part + ".ts")):
                f.unlink(missing_ok=True)

    def _keep_followed(self, app_id: str, p: Pod, chunks: Iterator[bytes], stamped: bool = False) -> None:
        """Keep the log a follow of pod ``p`` read to its end (from the log's start), when it is longer than
        the kept one; the kubelet's error line that ends a follow of a deleted pod is left out. ``stamped``:
        a follow with timestamps, kept as the ``.ts`` copy (``tsm log --since/--until`` reads it)."""
        d = self.app_dir(app_id)
        name = self._log_name(p)
        if stamped:
            name = name[:-4] + ".ts"
        part = f"{name[:-len(Path(name).suffix)]}.{os.getpid()}-{secrets.token_hex(3)}{'.st' if stamped else ''}.part"
        try:
            d.write(part, _without_runtime_error(chunks, lambda: True))
        except SchedulerError:
            pass  # cut short (the API went away): what was read is in the part, kept if longer
        finally:
            if (d.path / part).exists():
                _keep_longer(d.path / part, d.path / name)

    def _follow_to_end(self, app_id: str, client: KubeClient, pods: builtins.list[Pod],
                       timeout: float) -> builtins.list[threading.Thread]:
        """For each of ``pods``, two follows opened now (plain, and stamped for ``--since/--until``) and read
        to the container's end in a thread each, which then keeps that copy of the log
        (:meth:`~.logs.KubernetesLogs._keep_followed`): the lines a pod writes while it is stopped (after the
        warning, within the grace period) are kept, though its container goes with it."""
        threads = []
        for p in pods:
            for stamped in (False, True):  # the plain log, and the stamped copy that --since/--until read
                try:
                    chunks = client.follow_open(p.name, timeout, timestamps=stamped)
                except SchedulerError:
                    break  # gone already: its snapshot is what there is
                t = threading.Thread(target=self._keep_followed, args=(app_id, p, chunks, stamped), daemon=True)
                t.start()
                threads.append(t)
        return threads

    def _log_streams(self, streams: Stream | None) -> builtins.list[str]:
        if streams is not None and Stream(streams) != Stream.COMBINED:
            raise NotSupportedError(
                "Kubernetes keeps a container's stdout and stderr in one log: only the combined stream can be "
                f"read (drop --streams {Stream(streams).value}, or write the streams to files in the job)"
            )
        return ["stdout", "stderr"]

    def _lines(self, app_id: str, role: str, k: int, streams: builtins.list[str], since: datetime | None,
               until: datetime | None, tail: bool) -> Iterator[str]:
        req = self.request(app_id)
        client = self.client_for(req)
        d = self.app_dir(app_id)

        def live_pods() -> builtins.list[Pod]:
            if d.final() is not None:
                return []
            mine = [p for p in (from_json(x) for x in client.list_pods(app_id)) if p.role == role and p.replica_id == k]
            return sorted(mine, key=lambda p: (p.attempt, p.created, p.name))

        live = live_pods()
        if tail and not live:  # following a replica whose pod is not made yet: wait for it or the app's end
            def made() -> builtins.list[Pod] | None:
                now = self.describe(app_id)
                if now is None or now.state.is_terminal:
                    return []
                return live_pods() or None

            live = poll_until(made, FOLLOW_WAIT, initial=0.2, cap=1.0) or []
        saved_dir = d.path / "logs" / host_name(role, k)
        saved = sorted(saved_dir.glob("*.log")) if saved_dir.is_dir() else []
        live_files = {Path(self._log_name(p)).name for p in live}
        window = since is not None or until is not None

        def saved_lines(f: Path) -> Iterator[str]:
            if window:
                return _stamped_lines(f.with_suffix(".ts").read_bytes(), since, until)
            return iter(split_lines(decode(f.read_bytes())))

        for f in saved:
            if f.name not in live_files:
                yield from saved_lines(f)
        for i, p in enumerate(live):
            f = d.path / self._log_name(p)
            if f.exists():
                yield from saved_lines(f)
                continue
            last = i == len(live) - 1
            if tail and last and until is None:
                s = int(time.time() - since.timestamp()) + 1 if since else None
                yield from self._follow(client, app_id, p, s)
                return
            raw = client.log(p.name, timestamps=window)
            if RUNTIME_ERROR.match(raw.rstrip(b"\n")) and b"\n" not in raw.rstrip(b"\n"):
                raw = b""  # the kubelet's text for a container already removed: no log
            if not raw and f.exists():  # finished and deleted by another process since the list: it kept the log
                yield from saved_lines(f)
            elif window:
                yield from _stamped_lines(raw, since, until)
            else:
                yield from split_lines(decode(raw))

    def _follow(self, client: KubeClient, app_id: str, p: Pod, since: int | None) -> Iterator[str]:
        """Follow a live pod: wait until its container started, then stream until it ends."""

        def started() -> bool | None:
            cur = next((from_json(x) for x in client.list_pods(app_id) if x["metadata"]["name"] == p.name), None)
            return True if cur is None or cur.phase != "Pending" else None

        poll_until(started, FOLLOW_WAIT, initial=0.2, cap=1.0)
        try:
            raw = _without_runtime_error(client.follow(p.name, since=since), lambda: self._gone(client, app_id, p))
            yield from split_lines_iterator(decode(b) for b in utf8_chunks(raw))
        except SchedulerError:  # the pod went away (the app ended and was deleted): its snapshot has the log
            f = self.app_dir(app_id).path / self._log_name(p)
            if not f.exists():
                raise
            yield from split_lines(decode(f.read_bytes()))

    def _gone(self, client: KubeClient, app_id: str, p: Pod) -> bool:
        """True when pod ``p`` is deleted or being deleted (or its app is being cancelled or has ended)."""
        d = self.app_dir(app_id)
        if d.cancelling or d.final() is not None:
            return True
        cur = next((from_json(x) for x in client.list_pods(app_id) if x["metadata"]["name"] == p.name), None)
        return cur is None or cur.deleting


def _kubelet_error_only(f: Path) -> bool:
    """True when file ``f`` holds nothing but one line of the kubelet's error text (:data:`RUNTIME_ERROR`)."""
    if not 0 < _size(f) <= 4096:
        return False
    body = f.read_bytes().rstrip(b"\n")
    return b"\n" not in body and bool(RUNTIME_ERROR.match(body))


def _size(f: Path) -> int:
    """Bytes in ``f``; -1 when there is no such file."""
    try:
        return f.stat().st_size
    except FileNotFoundError:
        return -1


def _keep_longer(new: Path, kept: Path) -> None:
    """Rename ``new`` over ``kept`` unless ``kept`` is at least as long (a finished pod's log only grows,
    so the longer copy holds the other); ``new`` is gone afterwards either way."""
    if _size(kept) >= _size(new):
        new.unlink(missing_ok=True)
    else:
        os.replace(new, kept)


def _without_runtime_error(chunks: Iterator[bytes], gone: Callable[[], bool]) -> Iterator[bytes]:
    """``chunks`` as they come, except that a line that looks like the kubelet's error text
    (:data:`RUNTIME_ERROR`) is held back while it is the last one; dropped when the stream ends there and
    ``gone()`` says the pod was deleted under the follow. Other lines are never delayed."""
    held = b""
    for chunk in chunks:
        *complete, partial = (held + chunk).split(b"\n")
        held = partial
        if complete and RUNTIME_ERROR.match(complete[-1]):
            held = complete.pop() + b"\n" + partial
        if complete:
            yield b"\n".join(complete) + b"\n"
    if held and not (RUNTIME_ERROR.match(held.rstrip(b"\n")) and gone()):
        yield held


def _stamped_lines(raw: bytes, since: datetime | None, until: datetime | None) -> Iterator[str]:
    """Lines of a log read with ``timestamps=true`` (``<RFC3339Nano> <line>``), stamps removed, in the window."""
    if not raw:
        return
    out = bytearray()
    for line in raw.split(b"\n")[: -1 if raw.endswith(b"\n") else None]:
        head, _, body = line.partition(b" ")
        if since is not None or until is not None:
            try:
                text = head.decode().rstrip("Z")
                base, _, frac = text.partition(".")
                when: float | None = datetime.fromisoformat(base + "+00:00").timestamp() + float("0." + (frac[:6] or "0"))
            except ValueError:
                when = None
            if not in_window(when, since, until):
                continue
        out += body + b"\n"
    if raw and not raw.endswith(b"\n") and out:
        out = out[:-1]  # the last line had no newline
    yield from split_lines(decode(bytes(out)))
