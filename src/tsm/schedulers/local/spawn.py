"""Starting an app's supervisor: forked by this user's launcher when one serves, else spawned; then its ready byte.

:func:`start_supervisor` is the last step of :meth:`LocalScheduler.schedule <.scheduler.LocalScheduler.schedule>`:
the request and the record are durable already. It hands the launcher (:mod:`.launcher`) the write end of a
pipe, or spawns the supervisor (:data:`ENTRY`, isolated: :func:`tsm.util.daemon.command`) with it when the
launcher does not answer ``F``, and
waits for the supervisor's ``R`` (registered) or ``C`` (cancelled before it started). Anything else within 30
seconds means the supervisor could not start: the app is recorded FAILED with the last line of its
``supervisor.log`` and :class:`~tsm.errors.SubmissionError` says so.
"""

from __future__ import annotations

import contextlib
import os
import select
import time
from pathlib import Path
from typing import TYPE_CHECKING

from tsm.errors import SubmissionError
from tsm.schedulers.local import launcher
from tsm.schedulers.local.control import ms
from tsm.specs.api import AppState
from tsm.store import tsm_home

if TYPE_CHECKING:
    import socket
    import subprocess

    from tsm.schedulers.local.request import LocalRequest
    from tsm.store import Store

#: Seconds a caller waits for a new supervisor's ready byte before it calls the start failed.
READY_TIMEOUT = 30.0

#: What a spawned supervisor runs (its arguments: the app folder, the ready pipe).
ENTRY = "tsm.schedulers.local.launcher:spawned"


def connect() -> socket.socket | None:
    """This user's launcher, connected before the app is written (:func:`launcher.connect`); None: spawn."""
    return launcher.connect(str(tsm_home()))


def start_supervisor(store: Store, launchers: list[subprocess.Popen[bytes]], req: LocalRequest,
                     sock: socket.socket | None) -> None:
    """Start the supervisor of ``req`` and return once it is ready; record (in ``store``) and raise when it
    cannot start.

    ``sock``: the launcher's connection from :func:`connect` (None: spawn the supervisor). ``launchers``:
    the supervisors this process spawned (a spawned one joins it; the ended ones leave it).
    """
    r, w = os.pipe()
    try:
        if sock is not None and not launcher.send(sock, req.app_dir, w, bool(req.queue)):
            sock = None
    finally:
        os.close(w)
    proc = None
    deadline = time.monotonic() + READY_TIMEOUT
    ready = b""
    try:
        if sock is not None:
            ready = _wait(r, sock, deadline)
        if sock is None or ready == b"":  # no launcher took it: spawn the supervisor here
            os.close(r)
            r = -1
            r, w = os.pipe()
            try:
                proc = _spawn(req, w)
            finally:
                os.close(w)
        poller = select.poll()  # poll, not select: the caller may hold more than 1024 descriptors
        poller.register(r, select.POLLIN)
        while not ready and time.monotonic() < deadline:
            if poller.poll(ms(deadline - time.monotonic())):
                ready = os.read(r, 1) or b"EOF"
    finally:
        if r >= 0:
            os.close(r)
    launchers[:] = [p for p in launchers if p.poll() is None]
    if proc is not None:
        launchers.append(proc)
    if ready in (b"R", b"C"):  # C: cancelled by someone else before it started: not a failure
        return
    if proc is not None:
        with contextlib.suppress(OSError):
            proc.kill()
    detail = ""
    with contextlib.suppress(OSError):
        lines = Path(req.app_dir, "supervisor.log").read_text(errors="replace").strip().splitlines()
        detail = lines[-1] if lines else ""
    if not detail:
        rc = proc.poll() if proc is not None else None
        detail = f"it exited with code {rc} and no output" if rc is not None else f"no answer within {READY_TIMEOUT:g}s"
    terminal = ", ".join(str(int(s)) for s in AppState if s.is_terminal)
    store.write([(
        f"UPDATE local_apps SET state=?, msg=?, ended=? WHERE app_id=? AND state NOT IN ({terminal})",
        (int(AppState.FAILED), f"supervisor failed to start: {detail or 'no output'}", time.time(), req.app_id),
    )])
    raise SubmissionError(
        f"the local supervisor for {req.app_id} failed to start ({detail or 'no output'}); "
        f"see {req.app_dir}/supervisor.log"
    )


def _wait(r: int, sock: socket.socket, deadline: float) -> bytes:
    """Wait for the supervisor's first byte on the ready pipe; b"" when the launcher did not take the request.

    The caller wakes once in the usual case, for ``R`` (or ``C``): only a standby that took the request
    writes either. The launcher's ``F`` on ``sock`` (the request was taken) is read only when that byte is
    late (none within :data:`launcher.ACK_TIMEOUT`) or the pipe ended without one (``EOF``: every copy of its
    write end is closed; a standby that refuses a request closes the copy it was sent). No ``F`` then means
    "spawn it yourself" (b""; ``sock`` is closed, so a standby that resumes later sees the caller gone and
    starts nothing); after ``F`` the byte read is returned, ``EOF``, or b"?" past ``deadline``.
    """
    poller = select.poll()
    poller.register(r, select.POLLIN)
    try:
        if poller.poll(ms(min(launcher.ACK_TIMEOUT, deadline - time.monotonic()))):
            byte = os.read(r, 1) or b"EOF"
            return byte if byte != b"EOF" or _taken(sock) else b""
        if not _taken(sock):
            return b""
        while (left := deadline - time.monotonic()) > 0:
            if poller.poll(ms(left)):
                return os.read(r, 1) or b"EOF"
        return b"?"
    finally:
        sock.close()


def _taken(sock: socket.socket) -> bool:
    """Whether the launcher's answer on ``sock`` is ``F`` (already there: it comes before the ready byte)."""
    try:
        sock.setblocking(False)
        return sock.recv(1) == b"F"
    except OSError:
        return False


def _spawn(req: LocalRequest, w: int) -> subprocess.Popen[bytes]:
    """Spawn the supervisor of ``req`` with ``w`` as its ready pipe: only the standard library and tsm, so no
    site-packages (:func:`tsm.util.daemon.command` with ``site=False``); output to its ``supervisor.log``."""
    from tsm.util import daemon

    argv = daemon.command(ENTRY, req.app_dir, str(w), site=False)
    return daemon.spawn(argv, log=os.path.join(req.app_dir, "supervisor.log"), cwd=None, pass_fds=(w,))
