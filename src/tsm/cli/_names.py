"""What :mod:`tsm.cli.main` and the parser (:mod:`tsm.cli._parser`) share: the subcommands with their help
lines, the global flags, and the rule that an error is printed on one line.

A leaf module with no import of its own, so the start of every command (``tsm status`` takes no parser)
pays nothing for it.
"""

from __future__ import annotations

#: name -> one-line help; a subcommand's module (``cmd_<name>``, ``-`` as ``_``) is imported only when it runs.
SUBCOMMANDS = {
    "run": "launch a component (streams logs and waits unless --detach)",
    "dryrun": "print the scheduler request for a component without submitting it",
    "status": "show an app's status",
    "describe": "show the definition an app was launched with",
    "log": "print an app's logs",
    "list": "list apps with their live state",
    "cancel": "stop apps",
    "wait": "wait for an app to end (exit 0 if it succeeded)",
    "rm": "remove ended apps and their logs",
    "builtins": "list the components you can run by name",
    "runopts": "show schedulers' run options",
    "lint": "check a component file",
    "tracker": "show what jobs recorded (metadata, artifacts, lineage)",
    "serve": "web dashboard of apps (live tables, logs, usage charts, cancel)",
    "top": "full-screen view of apps, replicas, usage and logs",
    "sweep": "run a component over a grid or random space, N at a time; results table",
    "env": "list, show and remove the lockfile environments built here",
    "exec": "run a command inside a live replica (its host, container or pod; its cwd and environment)",
    "stack": "every Python thread's stack of live replicas (py-spy), the replica that differs marked",
    "port-forward": "reach a port inside a live replica from 127.0.0.1 until Ctrl-C",
}

#: The global flags, which go before the subcommand.
GLOBAL_FLAGS = ("--version", "--debug", "--session")


def one_line(e: BaseException | str) -> str:
    """The error's message on one line (the CLI's contract: one line per error).

    Line breaks of any kind become spaces, and other characters a terminal would act on rather than show
    (escape sequences, CR, right-to-left overrides, lone surrogates) are written as escapes. A message that
    cannot even be made (``__str__`` raises) is replaced by the exception's type name.
    """
    try:
        text = str(e)
    except Exception:  # noqa: BLE001 - a hostile __str__ must not turn one error line into a traceback
        text = ""
    text = " ".join(text.splitlines()).strip()
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return text or type(e).__name__
