"""``tsm run COMPONENT [ARGS...]``: launch a component; by default stream its logs and wait for it."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
import time
from typing import Any

from tsm.cli import _exits, _live
from tsm.cli._common import replica_targets, stream_logs
from tsm.cli._launch import add_launch_args, component_help, dry_run, dryrun_text, snapshot_line
from tsm.cli._live import start_thread


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "run", help="launch a component (streams logs and waits unless --detach)",
        usage="tsm run [-s SCHEDULER] [-c CFG] [--dryrun] [--detach] [--workspace DIR] [--after HANDLE[:COND]] "
        "COMPONENT [COMPONENT ARGS...]",
        description="Launch COMPONENT (builtin like utils.echo, an installed one, or path/file.py:function) "
        "with its own arguments after it. tsm run's options (-s, -c, --dryrun, --detach) go BEFORE COMPONENT; "
        "everything after COMPONENT is the component's. `tsm run COMPONENT --help` shows the component's "
        "arguments.",
    )
    add_launch_args(p)
    p.add_argument("--dryrun", action="store_true", help="print the request instead of submitting it (as tsm dryrun)")
    p.add_argument("--detach", action="store_true", help="print the handle and return at once")
    p.add_argument("component", help="component name, e.g. utils.echo or ./my.py:train")
    p.add_argument("component_args", nargs=argparse.REMAINDER, help="the component's arguments")
    p.set_defaults(func=run)


class _HeldInterrupt:
    """Holds back Ctrl-C (SIGINT) while an app is being submitted; :meth:`release` raises it afterwards.

    Without it, Ctrl-C during submission would leave a launched app running with no handle printed.
    With ``note``, each Ctrl-C held writes that line to stderr (once per Ctrl-C) so the user knows it
    was heard. Does nothing outside the main thread or when SIGINT is ignored.
    """

    def __init__(self, note: str = "") -> None:
        self.hit = False
        self._note = note.encode(errors="replace")
        self._old: Any = None
        if threading.current_thread() is threading.main_thread():
            old = signal.getsignal(signal.SIGINT)
            if old is not signal.SIG_IGN:
                self._old = signal.signal(signal.SIGINT, self._on_sigint)

    def _on_sigint(self, signum: int, frame: object) -> None:
        self.hit = True
        if self._note:
            # os.write, not sys.stderr: the main thread may be inside a write to sys.stderr right now
            with contextlib.suppress(OSError):
                os.write(2, self._note)

    def restore(self) -> bool:
        """Restore the previous handler; True if Ctrl-C came meanwhile (it is not raised)."""
        if self._old is not None:
            signal.signal(signal.SIGINT, self._old)
            self._old = None
        hit, self.hit = self.hit, False
        return hit

    def release(self) -> None:
        """Restore the previous handler; raise KeyboardInterrupt if Ctrl-C came meanwhile."""
        if self.restore():
            raise KeyboardInterrupt


def run(args: argparse.Namespace) -> int:
    from tsm.components import wants_help
    from tsm.runner.api import get_runner

    if wants_help(args.component_args):
        return component_help(args.component)
    with get_runner(args.session) as runner:
        info = dry_run(runner, args, "run", building=not args.dryrun)
        if args.dryrun:
            sys.stdout.write(dryrun_text(info))
            return _exits.OK
        line = snapshot_line(info)
        if line:
            sys.stderr.write(f"tsm: {line}\n")
        held = _HeldInterrupt()
        try:
            with _live.step("submitting"):
                handle = runner.schedule(info)
        except BaseException:
            held.release()
            raise
        if args.detach:
            sys.stdout.write(handle + "\n")
            sys.stdout.flush()
            held.release()  # a Ctrl-C during submission still shows the handle of what was launched
            return _exits.OK
        sys.stderr.write(f"tsm: launched {handle}\n")
        sys.stderr.flush()
        if info.after:
            held.release()
            code = wait_held(runner, handle, info.after)
            if code is not None:
                return code
        return attach(runner, handle, held)


def wait_held(runner: Any, handle: str, after: list[str]) -> int | None:
    """Wait while tsm holds the app for its dependencies (Ctrl-C cancels it); the exit code when it ended
    without being submitted, None once it was."""
    from tsm.runner import after as _after

    sys.stderr.write(f"tsm: {handle} waits for {', '.join(after)} (Ctrl-C cancels it)\n")
    sys.stderr.flush()
    try:
        while not _after.wait(runner, handle, None):
            pass
    except KeyboardInterrupt:
        runner.cancel(handle)
        sys.stderr.write(f"\ntsm: interrupted; cancelled {handle}\n")
        return _exits.INTERRUPTED
    status = _after.status(runner, handle)
    if status is None:
        return None
    sys.stderr.write(f"tsm: {handle}\n{status.summary()}\n")
    return _exits.FAILED


def attach(runner: Any, handle: str, held: _HeldInterrupt | None = None) -> int:
    """Stream every replica's log until the app ends, then print its status; Ctrl-C cancels it.

    After the first Ctrl-C, further ones are held (and acknowledged) until the app has been cancelled and
    its final status printed: a second Ctrl-C never leaves the user without the app's final state.

    When stderr is a terminal, a status line there (:mod:`tsm.cli._live`) shows each role's replicas
    running / done / failed and the time so far, out of the way of every log line; stdout is the same.
    """
    from tsm.specs.api import AppState

    t: threading.Thread | None = None
    line = _live.StatusLine() if _live.enabled() else None
    try:
        if held is not None:
            held.release()  # a Ctrl-C that came during submission lands here, and cancels the app
        targets = replica_targets(runner, handle, None, None)
        errors: list[BaseException] = []

        def logs() -> None:
            errors.extend(stream_logs(runner, handle, targets, tail=True, prefix=True, live=line))

        t = start_thread(logs)
        since = time.monotonic()
        if line is not None:
            _live.watch(runner, handle, line, since)
        status = runner.wait(handle)
        if line is not None and status is not None:
            line.show_status(status, since, force=True)  # the final counts while the last lines drain
        while line is not None and t.is_alive():  # the last lines are read: the line stays until then
            t.join(_live.REDRAW)
            line.tick()
        t.join()
        if line is not None:
            line.close()
    except KeyboardInterrupt:
        if line is not None:
            line.close()  # what follows (and the last log lines) is written plainly
        again = _HeldInterrupt(f"tsm: still cancelling {handle}; its final status follows\n")
        try:
            sys.stderr.write(f"\ntsm: interrupted; cancelling {handle} ...\n")
            sys.stderr.flush()
            runner.cancel(handle)
            if t is not None:
                t.join()  # the app has ended: its log readers finish (and stop writing) now
            sys.stdout.flush()
            sys.stderr.write(_exits.app_status(runner, handle).summary() + "\n")
            sys.stderr.flush()
        finally:
            again.restore()
        return _exits.INTERRUPTED
    except BaseException:
        if line is not None:
            line.close()  # the error message starts on a clean line
        raise
    if status is None:
        raise _exits.unknown_app(handle)
    for e in errors:
        sys.stderr.write(f"tsm: log streaming stopped: {e}\n")
    sys.stdout.flush()
    sys.stderr.write(f"tsm: {handle}\n{status.summary()}\n")
    return _exits.OK if status.state == AppState.SUCCEEDED else _exits.FAILED
