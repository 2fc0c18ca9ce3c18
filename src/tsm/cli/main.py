"""``tsm``: the command line. Parses, calls the runner, prints; nothing else.

Each subcommand is a module here with ``add_parser(subparsers)`` and ``run(args) -> int``; the modules
import the runner and backends only inside ``run`` so ``tsm --help`` stays fast. Every tsm error is
printed as one line on stderr (``--debug`` shows the traceback); usage errors (a wrong component,
component argument, run option, handle, scheduler or log path) exit 2, failures 1, Ctrl-C 130.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
from typing import NoReturn

#: name -> one-line help; a subcommand's module is imported only when that subcommand runs.
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
}


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line on stderr and exit code 2."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message} (see {self.prog} --help)\n")
        raise SystemExit(2)


def _chosen(argv: list[str]) -> str | None:
    """The subcommand named on the command line, if any (the first word that is not an option)."""
    skip = False
    for word in argv:
        if skip:
            skip = False
        elif word == "--session":
            skip = True
        elif not word.startswith("-"):
            return word if word in SUBCOMMANDS else None
    return None


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """Global flags plus the subcommands; only the chosen one (all when ``argv`` is None) is built in full."""
    from tsm import __version__

    parser = _Parser(prog="tsm", description="Training Session Manager: launch, watch, log and stop apps on any scheduler.")
    parser.add_argument("--version", action="version", version=f"tsm {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    parser.add_argument("--session", default="default", help="session name used in new app handles (default: default)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    chosen = _chosen(argv) if argv is not None else None
    for name, text in SUBCOMMANDS.items():
        if argv is None or name == chosen:
            importlib.import_module(f"tsm.cli.cmd_{name}").add_parser(sub)
        else:
            sub.add_parser(name, help=text)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit code (the console script exits with it)."""
    argv = sys.argv[1:] if argv is None else argv
    _bytes_out()
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 2
    debug = args.debug or os.environ.get("TSM_DEBUG") == "1"
    from tsm.errors import ComponentArgumentError, TsmError

    try:
        from tsm.specs.validate import check_name

        check_name(args.session, "--session: session name")
    except TsmError as e:
        parser.error(str(e))
    try:
        return int(args.func(args))
    except ComponentArgumentError as e:
        if e.usage:
            sys.stderr.write(e.usage.rstrip("\n") + "\n")
        sys.stderr.write(f"error: {_one_line(e)}\n")
        if debug:
            raise
        return 2
    except TsmError as e:
        sys.stderr.write(f"error: {_one_line(e)}\n")
        if debug:
            raise
        return 2 if isinstance(e, _usage_errors()) else 1
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        return 130
    except BrokenPipeError:
        # The reader of our output went away (tsm log | head): not an error.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except Exception as e:  # noqa: BLE001 - a bug, still reported as one line (--debug shows where)
        if debug:
            raise
        from tsm.components.cmdline import raised_by

        component = raised_by(e)
        what = f"{component}: the component function raised" if component else "internal error:"
        sys.stderr.write(f"error: {what} {type(e).__name__}: {_one_line(e)} (run with --debug for the traceback)\n")
        return 1


def _bytes_out() -> None:
    """Let stdout write back any byte the user gave (``os.fsdecode`` text), as ``ls`` or ``echo`` would.

    Arguments that are not UTF-8 reach tsm as surrogate escapes; under a strict UTF-8 stdout printing
    them (a dry run, a log line) would fail. ``surrogateescape`` writes the original bytes instead; an
    error message on stderr shows them escaped (``backslashreplace``) rather than fail to print.
    """
    for stream, errors in ((sys.stdout, "surrogateescape"), (sys.stderr, "backslashreplace")):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None and getattr(stream, "errors", None) == "strict":
            with contextlib.suppress(ValueError, OSError):  # a detached or closed stream stays as it is
                reconfigure(errors=errors)


def _usage_errors() -> tuple[type[BaseException], ...]:
    """Errors that mean the command line itself was wrong: exit code 2, like argparse's own."""
    from tsm.cli._common import UsageError
    from tsm.errors import (
        ComponentNotFoundError,
        InvalidRunOptionError,
        MalformedAppHandleError,
        UnknownResourceError,
        UnknownSchedulerError,
    )

    return (
        UsageError, ComponentNotFoundError, InvalidRunOptionError, MalformedAppHandleError, UnknownSchedulerError,
        UnknownResourceError,
    )


def _one_line(e: BaseException) -> str:
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


def entry() -> NoReturn:
    """Console-script wrapper."""
    sys.exit(main())


if __name__ == "__main__":
    entry()
