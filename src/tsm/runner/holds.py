"""The helper that holds an app until its dependencies end, then submits it (:mod:`tsm.runner.after`).

One detached process per held app (:mod:`tsm.util.daemon`: its own session, so it outlives the terminal and
the process that launched the app), holding its folder's lock while it lives. It waits for each dependency
through the runner (an event where the scheduler has one, its back-off otherwise), one second at a time
so a ``cancel`` (the row set to ``cancelled``) is seen within about a second. When every dependency ended as
asked it moves the row to ``submitting`` (one write that also tests it is still waiting, so a cancel and a
submission never both win), submits the dry run unchanged and records ``submitted``; a dependency that can
no longer be met, or one that is forgotten, ends it ``cancelled`` with the reason, and a refused submission
ends it ``failed`` with the scheduler's message. The history's row follows each end.

``python -m tsm.runner.holds FOLDER`` runs it by hand.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pickle
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tsm.runner import after as _after
from tsm.specs.api import AppState

#: The longest a single look at the dependencies waits, so a cancel is seen this quickly.
LOOK_S = 1.0


@contextlib.contextmanager
def helper_runner(folder: Path, lock: str, payload: str) -> Iterator[tuple[Any, dict[str, Any]] | None]:
    """In a helper started for ``folder`` (this one's and :mod:`tsm.runner.hook_helper`'s): its lock taken,
    its ``payload`` read and a runner made as the launcher's, yielded as ``(runner, payload)``; None when another
    helper holds the lock. On the way out the payload is removed (nothing is left to do), the runner closed
    and the lock released, in that order."""
    from tsm.runner.api import Runner
    from tsm.util import daemon

    fd = daemon.take(folder / lock)
    daemon.started()
    if fd is None:
        yield None
        return
    try:
        with open(folder / payload, "rb") as f:
            data = pickle.load(f)  # written by this user's runner into this user's private folder
        runner = Runner(data["session"], data["factories"], None, data["params"])
        try:
            yield runner, data
        finally:
            (folder / payload).unlink(missing_ok=True)
            runner.close()
    finally:
        os.close(fd)


def watch(runner: Any, handle: str, info: Any) -> str:
    """Wait for ``info.after``, then submit ``info``; the hold's final state."""
    store = runner.history.store
    pending = _after.parse_all(info.after)
    while pending:
        held = _after.find(store, handle)
        if held is None or held.state != _after.WAITING:
            return held.state if held else _after.CANCELLED  # cancelled (or removed) by the user
        for dep in list(pending):
            status = runner.wait(dep.handle, timeout=LOOK_S / len(pending))
            if status is None:
                return _end(runner, handle, _after.CANCELLED, f"dependency {dep.handle} is not known any more")
            met = dep.met_by(status.state)
            if met is False:
                return _end(runner, handle, _after.CANCELLED, dep.unmet(status.state))
            if met:
                pending.remove(dep)
    if not _after.set_state(store, handle, _after.SUBMITTING, only_from=(_after.WAITING,)):
        return _after.CANCELLED
    submitted = dataclasses.replace(info, after=[], on_state="")  # its hook follows it already
    try:
        runner.schedule(submitted)
    except Exception as e:  # noqa: BLE001 - the app's end, told to whoever asks its status
        return _end(runner, handle, _after.FAILED, f"its dependencies ended as asked, but it could not be "
                    f"submitted: {type(e).__name__}: {e}")
    _after.set_state(store, handle, _after.SUBMITTED)
    return _after.SUBMITTED


def _end(runner: Any, handle: str, state: str, msg: str) -> str:
    if _after.set_state(runner.history.store, handle, state, msg, only_from=(_after.WAITING,)):
        runner.history.set_state(handle, AppState.CANCELLED if state == _after.CANCELLED else AppState.FAILED)
    print(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {handle}: {state}: {msg}", flush=True)
    return state


def main(argv: list[str] | None = None) -> int:
    """Entry point: hold the app whose folder is ``argv[0]``."""
    args = sys.argv[1:] if argv is None else argv
    with helper_runner(Path(args[0]), _after.LOCK, _after.PAYLOAD) as got:
        if got is None:
            return 0  # another helper holds it already
        runner, data = got
        state = watch(runner, data["handle"], data["info"])
    print(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {data['handle']}: {state}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
