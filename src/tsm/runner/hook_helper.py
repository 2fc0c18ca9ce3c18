"""The helper that tells an app's ``on_state`` target of each of its state changes (:mod:`tsm.runner.hooks`).

A module of its own because it makes a runner (:mod:`tsm.runner.api`), which imports :mod:`tsm.runner.hooks`.
``python -m tsm.runner.hook_helper FOLDER`` runs it by hand.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from tsm.runner import hooks


def main(argv: list[str] | None = None) -> int:
    """Entry point: follow the app whose hook folder is ``argv[0]``."""
    import pickle

    from tsm.runner.api import Runner
    from tsm.util import daemon

    folder = Path((sys.argv[1:] if argv is None else argv)[0])
    fd = daemon.take(folder / hooks.LOCK)
    daemon.started()
    if fd is None:
        return 0  # another helper follows it already
    with open(folder / hooks.PAYLOAD, "rb") as f:
        data = pickle.load(f)  # written by this user's runner into this user's private folder
    runner = Runner(data["session"], data["factories"], None, data["params"])
    journal = hooks.Journal(folder)
    done = False
    try:
        hooks.watch(runner, data["handle"], data["target"], journal)
        done = True
    finally:
        runner.close()
        (folder / hooks.PAYLOAD).unlink(missing_ok=True)  # the target goes with the helper
        hooks.say(f"{data['handle']}: {len(journal.events)} state changes, {journal.sent} sent, "
                  f"{journal.given_up} given up")
        if done and not journal.given_up:  # all told: nothing of the hook is left to keep
            shutil.rmtree(folder, ignore_errors=True)
        os.close(fd)
    return 0


if __name__ == "__main__":
    sys.exit(main())
