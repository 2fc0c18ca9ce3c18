"""The helper that tells an app's ``on_state`` target of each of its state changes (:mod:`tsm.runner.hooks`).

A module of its own because it makes a runner (:mod:`tsm.runner.api`), which imports :mod:`tsm.runner.hooks`.
``python -m tsm.runner.hook_helper FOLDER`` runs it by hand.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from tsm.runner import hooks
from tsm.runner.holds import helper_runner


def main(argv: list[str] | None = None) -> int:
    """Entry point: follow the app whose hook folder is ``argv[0]``."""
    folder = Path((sys.argv[1:] if argv is None else argv)[0])
    with helper_runner(folder, hooks.LOCK, hooks.PAYLOAD) as got:  # the target goes with the payload
        if got is None:
            return 0  # another helper follows it already
        runner, data = got
        journal = hooks.Journal(folder)
        try:
            hooks.watch(runner, data["handle"], data["target"], journal)
        finally:
            hooks.say(f"{data['handle']}: {len(journal.events)} state changes, {journal.sent} sent, "
                      f"{journal.given_up} given up")
        if not journal.given_up:  # all told: nothing of the hook is left to keep (done before the lock goes)
            shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
