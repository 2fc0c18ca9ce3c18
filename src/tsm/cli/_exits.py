"""The exit codes of every ``tsm`` command, in one table, and the unknown-app check every command shares.

One table, so a script can tell "the app failed" (1) from "I typed it wrong" (2) from "it is still running"
(3) with any subcommand. An unknown app handle is a usage error (2) everywhere, like an unknown component or
scheduler name: the command line names something that does not exist, and nothing was run.
"""

from __future__ import annotations

TYPE_CHECKING = False  # keeps typing out of ``tsm --help``; type checkers treat it as True
if TYPE_CHECKING:
    from typing import Any

    from tsm.specs.api import AppStatus

OK = 0
FAILED = 1
USAGE = 2
TIMEOUT = 3
NOT_RUNNING = 4
INTERRUPTED = 130

#: (code, meaning): printed by ``tsm --help`` and documented in the README's command-line section.
TABLE: tuple[tuple[int, str], ...] = (
    (OK, "done (run, wait: the app SUCCEEDED)"),
    (FAILED, "the app ended FAILED or CANCELLED (run, wait), the component made an invalid app, lint "
             "found errors, or the scheduler or state store could not do what was asked"),
    (USAGE, "the command line is wrong: unknown subcommand, flag or value, a malformed or unknown app "
            "handle, an unknown component, scheduler, resource, role or replica"),
    (TIMEOUT, "wait --timeout passed while the app is still running"),
    (NOT_RUNNING, "exec, stack, port-forward: the replica is not running (its app ended, or it has not started "
                  "yet); otherwise exec exits with the command's own code"),
    (INTERRUPTED, "interrupted by Ctrl-C (an attached run cancels its app first)"),
)


def epilog() -> str:
    """The exit-code table as ``tsm --help`` prints it."""
    import textwrap

    rows = (textwrap.fill(text, 96, initial_indent=f"  {code:<5}", subsequent_indent=" " * 7) for code, text in TABLE)
    return "exit codes:\n" + "\n".join(rows)


def unknown_app(handle: str) -> Exception:
    """The error for a handle no scheduler knows (exit code 2)."""
    from tsm.errors import UnknownAppError

    return UnknownAppError(
        f"unknown app {handle}: its scheduler does not know it (never launched, or removed); "
        "`tsm list` shows known apps"
    )


def app_status(runner: Any, handle: str) -> AppStatus:
    """``runner.status(handle)``, raising :class:`~tsm.errors.UnknownAppError` when the app is unknown.

    A runner may say "unknown" either way (raise, or return None as TorchX's does); the CLI treats both alike.
    """
    status = runner.status(handle)
    if status is None:
        raise unknown_app(handle)
    return status  # type: ignore[no-any-return]
