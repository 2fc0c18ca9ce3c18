"""Hooks on state changes: ``-c on_state=CMD`` or ``-c on_state=https://...`` (also a user's config default).

Each time an app's state changes, tsm tells the target once, with an event id a receiver can use to drop
repeats (``HANDLE#SEQ``, SEQ counting the app's transitions from 1):

- a ``http://`` or ``https://`` URL (one word) gets a JSON POST (``id``, ``seq``, ``handle``, ``old``, ``new``,
  ``msg``, ``time``; the id also as the ``Idempotency-Key`` header); a 2xx answer is a delivery;
- anything else is a command (split as a shell would, never run by one) called with four more arguments,
  the handle, the old and the new state and the message, and ``TSM_EVENT_ID`` in its environment; exit 0 is
  a delivery.

The first event's old state is ``UNSUBMITTED``. Delivery is at least once, in order, each event retried with
back-off (:data:`BACKOFF_S`) for up to :data:`GIVE_UP_S` before it is given up (written to the log), and at
once when the hook's folder is gone (its ``$TSM_HOME`` was removed).

A detached helper per app (:mod:`tsm.runner.hook_helper`, started as :mod:`tsm.util.daemon` starts helpers:
its own session, so it outlives the terminal and a ``kill -9`` of the launching process) follows the app's
status through a runner like the launcher's (an event where the scheduler has one, polls growing from
:data:`FIRST_LOOK_S` to :data:`LAST_LOOK_S` otherwise), journals each transition before it is sent
(``events.jsonl``, with the count delivered beside it) and ends once the app is terminal, or forgotten, and
every event is sent; its folder goes with it then, unless an event was given up (the folder and its log stay,
to say which and why). States that come and go between two looks are not seen. Its folder under
``$TSM_HOME/hooks`` is owner-only; the target (a URL may hold a token) is kept only there, never in the
history, and shown by tsm as :func:`describe` words it.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import shlex
import threading
import time
from pathlib import Path
from typing import Any

from tsm.errors import InvalidRunOptionError

#: The pause before each retry of a delivery (the last repeats), and how long one event is retried at most.
BACKOFF_S = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
GIVE_UP_S = 3600.0
#: The first and the longest pause between two looks at an app's status.
FIRST_LOOK_S, LAST_LOOK_S = 0.1, 2.0
#: How long one delivery may take (a POST's answer, a command's run).
DELIVERY_TIMEOUT_S = 30.0

PAYLOAD, EVENTS, DELIVERED, LOCK, LOG = "hook.pkl", "events.jsonl", "delivered", "lock", "hooks.log"


def is_url(target: str) -> bool:
    """Whether ``target`` is a URL (one word holding ``://``) rather than a command (which may name one)."""
    return "://" in target and not any(c.isspace() for c in target.strip())


def check(target: object) -> str:
    """``target`` as ``on_state`` takes it (a URL with a host, or a command line), else the error to fix."""
    if not isinstance(target, str) or not target.strip():
        raise InvalidRunOptionError("on_state: expected a command or an http(s):// URL")
    if is_url(target):
        from urllib.parse import urlsplit

        url = urlsplit(target)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise InvalidRunOptionError(f"on_state: {describe(target)!r} is not an http:// or https:// URL with a "
                                        "host (a command is more than one word)")
        return target
    try:
        if not shlex.split(target):
            raise ValueError("no command")
    except ValueError as e:
        raise InvalidRunOptionError(f"on_state: the command cannot be split as a shell would ({e})") from e
    return target


def describe(target: str) -> str:
    """The target as tsm shows it: a URL's scheme and host (its path or query may hold a token), a
    command's program."""
    if is_url(target):
        from urllib.parse import urlsplit

        url = urlsplit(target)
        return f"{url.scheme}://{url.hostname or ''}/..."
    words = target.split()
    return f"{words[0]} ..." if words else ""


def hook_dir(handle: str) -> Path:
    """The private folder of an app's hook under ``$TSM_HOME/hooks`` (named by a hash: handles hold '/')."""
    from tsm.store import tsm_home

    return tsm_home() / "hooks" / hashlib.sha256(handle.encode()).hexdigest()[:24]


def follow(runner: Any, handle: str, target: str, factories: Any, params: dict[str, Any]) -> None:
    """Start the helper that tells ``target`` of each state change of ``handle``; it follows the app through a
    runner made as ``runner`` was (its session, scheduler ``factories`` and ``params``)."""
    from tsm.runner.after import write_payload
    from tsm.util import daemon

    folder = hook_dir(handle)
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    write_payload(folder / PAYLOAD, {"handle": handle, "session": runner.session_name, "target": target,
                                     "factories": factories, "params": params})
    daemon.start_helper(folder / LOCK, "tsm.runner.hook_helper:main", str(folder), log=folder / LOG)


def event(handle: str, seq: int, old: str, new: str, msg: str) -> dict[str, Any]:
    """One transition as it is sent."""
    return {"id": f"{handle}#{seq}", "seq": seq, "handle": handle, "old": old, "new": new, "msg": msg,
            "time": time.time()}


def deliver(target: str, ev: dict[str, Any]) -> str | None:
    """Send ``ev`` to ``target`` once; None when it was taken, else why not."""
    if is_url(target):
        import urllib.error
        import urllib.request

        req = urllib.request.Request(target, data=json.dumps(ev).encode(), method="POST", headers={
            "Content-Type": "application/json", "Idempotency-Key": ev["id"], "User-Agent": "tsm-on-state"})
        try:
            with urllib.request.urlopen(req, timeout=DELIVERY_TIMEOUT_S) as answer:  # noqa: S310 - http(s) only, checked
                return None if 200 <= answer.status < 300 else f"HTTP {answer.status}"
        except urllib.error.HTTPError as e:
            return f"HTTP {e.code}"
        except (OSError, ValueError) as e:
            return f"{type(e).__name__}: {e}"
    import subprocess

    argv = [*shlex.split(target), ev["handle"], ev["old"], ev["new"], ev["msg"]]
    env = {**os.environ, "TSM_EVENT_ID": ev["id"]}
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, env=env, timeout=DELIVERY_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{type(e).__name__}: {e}"
    return None if done.returncode == 0 else f"exit status {done.returncode}"


class Journal:
    """The events of one app in ``folder``: each written (and synced) before it is sent, and how many are sent."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.events: list[dict[str, Any]] = []
        if (folder / EVENTS).exists():
            self.events = [json.loads(line) for line in (folder / EVENTS).read_text().splitlines() if line.strip()]
        sent = folder / DELIVERED
        self.sent = int(sent.read_text() or 0) if sent.exists() else 0
        self.given_up = 0  # events this helper stopped retrying (its log says why)

    @property
    def last(self) -> str:
        return self.events[-1]["new"] if self.events else "UNSUBMITTED"

    def add(self, ev: dict[str, Any]) -> None:
        fd = os.open(self.folder / EVENTS, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, (json.dumps(ev) + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        self.events.append(ev)

    def mark_sent(self, count: int) -> None:
        tmp = self.folder / (DELIVERED + ".tmp")
        tmp.write_text(str(count))
        os.replace(tmp, self.folder / DELIVERED)
        self.sent = count


def _send_all(target: str, journal: Journal, todo: queue.Queue[dict[str, Any] | None]) -> None:
    """Deliver ``todo``'s events in order, each retried with back-off; ends at the None after the last."""
    while (ev := todo.get()) is not None:
        start, tries = time.monotonic(), 0
        while (why := deliver(target, ev)) is not None:
            pause = BACKOFF_S[min(tries, len(BACKOFF_S) - 1)]
            tries += 1
            if time.monotonic() - start + pause > GIVE_UP_S or not journal.folder.is_dir():
                say(f"{ev['id']}: given up after {tries} tries: {why}"
                    + ("" if journal.folder.is_dir() else " (the hook's folder is gone: its home was removed)"))
                journal.given_up += 1
                break
            say(f"{ev['id']}: not delivered ({why}); again in {pause:g} s")
            time.sleep(pause)
        journal.mark_sent(ev["seq"])


def watch(runner: Any, handle: str, target: str, journal: Journal) -> None:
    """Journal and send each state change of ``handle`` until it is terminal (or unknown) and all are sent."""
    todo: queue.Queue[dict[str, Any] | None] = queue.Queue()
    for ev in journal.events[journal.sent:]:  # journaled by an earlier helper, not yet sent
        todo.put(ev)
    sender = threading.Thread(target=_send_all, args=(target, journal, todo), name="tsm-hook-send")
    sender.start()
    pause, failing = FIRST_LOOK_S, 0.0
    try:
        status = runner.status(handle)
        while status is not None:
            if status.state.name != journal.last:
                ev = event(handle, len(journal.events) + 1, journal.last, status.state.name, status.msg or "")
                journal.add(ev)
                todo.put(ev)
                pause = FIRST_LOOK_S
            if status.state.is_terminal:
                break
            try:
                status = runner.wait(handle, timeout=pause)
                failing = 0.0
            except Exception as e:  # noqa: BLE001 - a backend that does not answer for a while (a restart)
                failing = failing or time.monotonic()
                if time.monotonic() - failing > GIVE_UP_S:
                    say(f"{handle}: its status could not be read for {GIVE_UP_S:g} s, last: {e}; not followed any more")
                    break
                say(f"{handle}: its status could not be read ({type(e).__name__}: {e}); looking again")
                time.sleep(LAST_LOOK_S)
            pause = min(LAST_LOOK_S, pause * 1.5)
    finally:
        todo.put(None)
        sender.join()


def say(line: str) -> None:
    print(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {line}", flush=True)
