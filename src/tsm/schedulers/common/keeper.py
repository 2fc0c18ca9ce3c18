"""The keeper: one detached process per user and container backend that looks at its running apps every tick.

Why. On Docker and Kubernetes what tsm decides for an app is decided by a *look* (a ``describe``: the kit's
controller step, :mod:`tsm.schedulers.common.controller`): a ROLE/APPLICATION retry, a requeue at the time
limit, a restart after a daemon restart, a stall, Docker's time limit and its warning. A look happens when
some process asks (``tsm status``, ``tsm wait``, an attached ``tsm run``, the views); an app submitted with
``tsm run --detach`` that nobody looks at would never be retried, stopped at its time limit or found
stalled. The keeper is the look nobody has to make.

How. ``schedule`` calls :func:`ensure` once the app's files are written: when no keeper of this backend
holds ``$TSM_HOME/<backend>/.keeper.lock``, it starts the keeper (this interpreter, this tsm, isolated from
the caller's working directory) detached (:mod:`tsm.util.daemon`: a session of its own, output to
``.keeper.log``: 0600 in the backend's 0700 folder). Of many submissions at once (a sweep's workers) only
one starts it (:func:`tsm.util.daemon.start_once`). The keeper takes the lock (a second one exits at once)
and, every :data:`TICK` seconds, describes each app of the
home that has no recorded end (one engine list per tick, shared by every app: the scheduler's
:class:`~tsm.schedulers.common.watcher.StatusWatcher`), until none has been running for :data:`IDLE`
seconds. An app seen ended is not looked at again. Looks take each app's lock as any other look does, so a
``tsm status`` beside the keeper acts in turn with it, never twice. An app whose looks keep failing for
:data:`GIVE_UP` seconds (its engine is gone) is no longer looked at, so a keeper never outlives its engines.

Never a single point of failure: a look by any process still acts as before; a keeper that died (a reboot,
SIGKILL) is started again by the next submission of that backend or the next look of a running app
(:func:`ensure` from the scheduler's snapshot). Before it exits it releases the lock and looks for apps once
more, so a submission that found the lock held just before the release is not left unwatched. When the
code it runs changes on disk (an upgrade) it starts itself again on the new code.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from tsm.schedulers.common.appdir import FINAL, REQUEST
from tsm.schedulers.common.files import make_private_dirs
from tsm.util import daemon

#: Seconds between two rounds of looks.
TICK = 1.0

#: Seconds the keeper stays up once no app of its backend runs (``TSM_KEEPER_IDLE`` overrides).
IDLE = 30.0

#: Seconds of failed looks (the engine gone: a removed ``DOCKER_HOST``, a deleted cluster) after which the keeper
#: stops looking at an app (``TSM_KEEPER_GIVE_UP`` overrides); the next look of any process that sees it
#: running starts a keeper again.
GIVE_UP = 600.0

#: Seconds between two checks, by the looks of one process, that the keeper runs (:func:`ensure`).
CHECK_EVERY = 30.0

#: Seconds between two checks that the keeper's code is still what is on disk.
CODE_CHECK = 10.0

#: The backends a keeper serves (the module each one's ``create_scheduler`` comes from).
BACKENDS = ("docker", "kubernetes")

LOCK = ".keeper.lock"
LOG = ".keeper.log"

#: The keeper's entry point (:func:`tsm.util.daemon.command`).
ENTRY = "tsm.schedulers.common.keeper:main"


def running_apps(root: Path) -> list[str]:
    """The apps under ``root`` this home submitted (a request) whose end is not recorded (no final status)."""
    out = []
    with contextlib.suppress(OSError), os.scandir(root) as it:
        for e in it:
            if e.name.startswith(".") or not e.is_dir(follow_symlinks=False):
                continue
            if os.path.exists(os.path.join(e.path, REQUEST)) and not os.path.exists(os.path.join(e.path, FINAL)):
                out.append(e.name)
    return sorted(out)


def held(root: Path) -> bool:
    """Whether a keeper holds ``root``'s lock now."""
    return daemon.held(root / LOCK)


#: When each (backend, root) was last checked by :func:`ensure` with ``at_most_every`` (this process).
_checked: dict[tuple[str, Path], float] = {}


def ensure(backend: str, root: Path, at_most_every: float = 0.0) -> None:
    """Start ``backend``'s keeper for ``root`` unless one runs (or ``TSM_KEEPER=0``). Never raises.

    A submission checks every time; a look that saw a running app of the home (a keeper lost to a reboot or
    SIGKILL starts again) passes ``at_most_every`` (:data:`CHECK_EVERY`), so a process looking often checks
    at most that often."""
    now = time.monotonic()
    if at_most_every and now < _checked.get((backend, root), -at_most_every) + at_most_every:
        return
    _checked[(backend, root)] = now
    if os.environ.get("TSM_KEEPER", "1") == "0" or held(root):
        return

    def start(fd: int) -> None:
        daemon.spawn(_command(backend, root, fd), log=root / LOG, pass_fds=(fd,))

    with contextlib.suppress(OSError):
        make_private_dirs(root)
        daemon.start_once(root / LOCK, start)


def _command(backend: str, root: Path, handover_fd: int = -1) -> list[str]:
    """The keeper's command line: this interpreter and this tsm, isolated (:func:`tsm.util.daemon.command`)."""
    return daemon.command(ENTRY, backend, str(root), handover_fd=handover_fd)


class Keeper:
    """The loop of one keeper: ``look(app_id)`` says whether the app has ended (its describe is terminal)."""

    def __init__(self, root: Path, look: Callable[[str], bool], tick: float = TICK, idle: float = IDLE,
                 log: Callable[[str], None] | None = None, give_up: float = GIVE_UP) -> None:
        self.root, self.look, self.tick, self.idle, self.give_up = root, look, tick, idle, give_up
        self.ended: set[str] = set()  # apps seen ended (or given up): never looked at again
        self.failing: dict[str, tuple[str, float]] = {}  # app -> the error its looks fail with, and since when
        self.log = log or (lambda text: None)
        self.lock_fd = -1

    def lock(self) -> bool:
        """Take the keeper's lock; False when another keeper holds it."""
        make_private_dirs(self.root)
        fd = daemon.take(self.root / LOCK)
        if fd is None:
            return False
        self.lock_fd = fd
        daemon.started()
        return True

    def unlock(self) -> None:
        if self.lock_fd >= 0:
            os.close(self.lock_fd)  # closing the only descriptor of the open file releases its flock
            self.lock_fd = -1

    def pending(self) -> list[str]:
        return [a for a in running_apps(self.root) if a not in self.ended]

    def round(self, apps: Iterable[str]) -> None:
        """One look at each app of ``apps``; an app that ended is remembered as such."""
        for app_id in apps:
            try:
                if self.look(app_id):
                    self.ended.add(app_id)
                if self.failing.pop(app_id, None) is not None:
                    self.log(f"look at {app_id} works again")
            except Exception as e:  # noqa: BLE001 - one app's failed look (the engine away) never stops the rest
                text, now = f"{type(e).__name__}: {e}", time.monotonic()
                before, since = self.failing.get(app_id, ("", now))
                self.failing[app_id] = (text, since)
                if text != before:  # once per cause, not once a second
                    self.log(f"look at {app_id} failed: {text}")
                if now - since >= self.give_up:
                    self.ended.add(app_id)
                    self.log(f"gave up on {app_id}: its looks failed for {now - since:.0f}s (a look of any tsm "
                             "process that sees it running starts a keeper again)")

    def run(self, changed: Callable[[], bool] = lambda: False) -> str:
        """Look until no app has run for ``idle`` seconds (then ``"idle"``) or ``changed()`` (``"changed"``),
        or another keeper took over (``"taken"``); the lock is held throughout and released on return."""
        if self.lock_fd < 0 and not self.lock():
            return "taken"
        quiet = daemon.Idle(self.idle)
        try:
            while True:
                apps = self.pending()
                if apps:
                    quiet.busy()
                    self.round(apps)
                elif quiet.over():
                    self.unlock()
                    if not self.pending():  # a submission that saw the lock held just now is looked at too
                        return "idle"
                    if not self.lock():
                        return "taken"
                    quiet.busy()
                    continue
                if changed():
                    return "changed"
                time.sleep(self.tick)
        finally:
            self.unlock()


def main(argv: list[str] | None = None) -> int:
    """The keeper's process (``keeper BACKEND ROOT``, :func:`_command`): keep ``BACKEND``'s apps under ``ROOT``."""
    import importlib

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] not in BACKENDS:
        sys.stderr.write(f"usage: keeper {{{','.join(BACKENDS)}}} ROOT\n")
        return 2
    backend, root = args[0], Path(args[1])

    def log(text: str) -> None:
        sys.stderr.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} keeper[{os.getpid()}] {text}\n")
        sys.stderr.flush()

    keeper = Keeper(root, lambda app_id: False, idle=daemon.idle_limit("TSM_KEEPER_IDLE", IDLE), log=log,
                    give_up=daemon.idle_limit("TSM_KEEPER_GIVE_UP", GIVE_UP))
    if not keeper.lock():
        return 0
    sched = importlib.import_module(f"tsm.schedulers.{backend}").create_scheduler("keeper")

    def look(app_id: str) -> bool:
        desc = sched.describe(app_id)
        return desc is None or desc.state.is_terminal

    keeper.look = look
    key, next_check = daemon.code_key(), time.monotonic() + CODE_CHECK  # every source of this tsm

    def changed() -> bool:
        nonlocal next_check
        if time.monotonic() < next_check:
            return False
        next_check = time.monotonic() + CODE_CHECK
        return daemon.code_key() != key

    try:
        why = keeper.run(changed)
    finally:
        with contextlib.suppress(Exception):
            sched.close()
    if why == "changed":  # an upgrade: the same keeper on the new code (the lock was released on return)
        log("tsm's code changed on disk: starting again on it")
        argv = _command(backend, root)
        os.execv(argv[0], argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
