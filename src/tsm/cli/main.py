"""``tsm``: the command line. Parses, calls the runner, prints; nothing else.

Each subcommand is a module here with ``add_parser(subparsers)`` and ``run(args) -> int``; the modules
import the runner and backends only inside ``run`` so ``tsm --help`` stays fast. Every tsm error is
printed as one line on stderr (``--debug`` shows the traceback); the exit codes are one table
(:mod:`tsm.cli._exits`, printed by ``tsm --help``): 0 done, 1 failed, 2 usage error or unknown app,
3 timeout, 130 Ctrl-C. A misspelt subcommand or flag gets a "did you mean", and a flag put in the wrong
place (a global flag after the subcommand) says where it goes.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import re
import sys

from tsm.cli import _exits

TYPE_CHECKING = False  # keeps typing (3 ms) out of start-up; type checkers treat it as True
if TYPE_CHECKING:
    from typing import Any, NoReturn

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
    "tracker": "show what jobs recorded (metadata, artifacts, lineage)",
    "serve": "web dashboard of apps (live tables, logs, usage charts, cancel)",
    "top": "full-screen view of apps, replicas, usage and logs",
    "sweep": "run a component over a grid or random space, N at a time; results table",
}


#: The global flags, which go before the subcommand.
GLOBAL_FLAGS = ("--version", "--debug", "--session")

_INVALID_CHOICE = re.compile(r"invalid choice: '(?P<value>.*)' \(choose from (?P<choices>.*)\)$", re.DOTALL)


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line on stderr and exit code 2, with a "did you mean"."""

    def error(self, message: str) -> NoReturn:
        from tsm.errors import did_you_mean

        m = _INVALID_CHOICE.search(message)
        if m:  # a misspelt subcommand or --streams value: name the closest choice
            message += did_you_mean(m.group("value"), re.findall(r"'([^']*)'", m.group("choices")))
        sys.stderr.write(f"{self.prog}: error: {_one_line(message)} (see {self.prog} --help)\n")
        raise SystemExit(_exits.USAGE)


class _TopParser(_Parser):
    """The ``tsm`` parser: its epilog (the exit-code table, wrapped by :mod:`textwrap`) is made only when
    help is printed, the one place argparse shows an epilog."""

    def format_help(self) -> str:
        if self.epilog is None:
            self.epilog = _exits.epilog()
        return super().format_help()


class _LazyParsers(dict):  # type: ignore[type-arg]  # argparse's name -> parser map, with lazy entries
    """Subcommand name -> parser, where a subcommand the command line did not choose gets its (empty)
    parser only if argparse ever asks for it.

    ``tsm --help`` and every subcommand otherwise built fifteen parsers they never use, 5-10 ms of
    start-up (mostly gettext looking for translations of argparse's own strings). The names, their order
    and their help lines stay as they were, so usage, help and "invalid choice" messages are unchanged.
    """

    def __init__(self, make: Any) -> None:
        super().__init__()
        self._make = make

    def __getitem__(self, name: str) -> Any:
        value = super().__getitem__(name)
        if value is None:
            value = self._make(name)
            super().__setitem__(name, value)
        return value

    def get(self, name: str, default: Any = None) -> Any:
        return self[name] if name in self else default  # noqa: SIM401 - self.get is this method

    def values(self) -> Any:
        return [self[name] for name in self]

    def items(self) -> Any:
        return [(name, self[name]) for name in self]


def _unrecognized(parser: argparse.ArgumentParser, command: str | None, extra: list[str]) -> str:
    """The usage error for words argparse did not take: with a "did you mean" or where the flag goes."""
    from tsm.errors import brief, did_you_mean

    sub = _subparser(parser, command)
    flags = [s for a in (sub or parser)._actions for s in a.option_strings]
    for word in extra:
        name = word.partition("=")[0]
        if not name.startswith("-"):
            continue
        if name in GLOBAL_FLAGS and command:
            return (
                f"{name} is an option of tsm itself: put it before the subcommand "
                f"(tsm {name}{' VALUE' if name == '--session' else ''} {command} ...)"
            )
        hint = did_you_mean(name, flags)
        if hint:
            return f"unrecognized option {brief(name, 60)}{hint}"
        hint = did_you_mean(name, GLOBAL_FLAGS)
        if hint:  # a misspelt global flag (tsm --debgu list): name it, and say where it goes
            return f"unrecognized option {brief(name, 60)}{hint}; options of tsm itself go before the subcommand"
    return "unrecognized arguments: " + " ".join(w if len(w) <= 60 else brief(w, 60) for w in extra)


def _check_single_values(parser: argparse.ArgumentParser | None, args: argparse.Namespace) -> None:
    """Refuse ``--flag=--``: argparse drops the ``--`` and hands the flag an empty list instead of a value."""
    if parser is None:
        return
    for action in parser._actions:
        if action.option_strings and action.nargs is None and getattr(args, action.dest, None) == []:
            parser.error(f"argument {'/'.join(action.option_strings)}: expected a value ('--' is not one)")


def _subparser(parser: argparse.ArgumentParser, command: str | None) -> argparse.ArgumentParser | None:
    """The parser of subcommand ``command``, if there is one."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and command in action.choices:
            sub: argparse.ArgumentParser = action.choices[command]
            return sub
    return None


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

    parser = _TopParser(
        prog="tsm", description="Training Session Manager: launch, watch, log and stop apps on any scheduler.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"tsm {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    parser.add_argument("--session", default="default", help="session name used in new app handles (default: default)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    lazy = _LazyParsers(lambda name: _Parser(prog=f"{sub._prog_prefix} {name}"))
    sub._name_parser_map = sub.choices = lazy  # what add_parser fills, and what argparse checks words against
    chosen = _chosen(argv) if argv is not None else None
    for name, text in SUBCOMMANDS.items():
        if argv is None or name == chosen:
            importlib.import_module(f"tsm.cli.cmd_{name}").add_parser(sub)
        else:  # its line in --help now, its (empty) parser only if argparse asks for it
            sub._choices_actions.append(sub._ChoicesPseudoAction(name, (), text))
            dict.__setitem__(lazy, name, None)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit code (the console script exits with it)."""
    argv = sys.argv[1:] if argv is None else argv
    _bytes_out()
    parser = build_parser(argv)
    args, extra = parser.parse_known_args(argv)
    if extra:
        (_subparser(parser, args.command) or parser).error(_unrecognized(parser, args.command, extra))
    _check_single_values(parser, args)
    _check_single_values(_subparser(parser, args.command), args)
    if not args.command:
        parser.print_help()
        return _exits.USAGE
    debug = args.debug or os.environ.get("TSM_DEBUG") == "1"
    from tsm.errors import ComponentArgumentError, TsmError

    try:
        from tsm.specs.validate import check_name

        check_name(args.session, "--session: session name")
    except TsmError as e:
        parser.error(str(e))
    home_problem = _tsm_home_problem()
    if home_problem:
        sys.stderr.write(f"error: {home_problem}\n")
        return _exits.USAGE
    try:
        return int(args.func(args))
    except ComponentArgumentError as e:
        if e.usage:
            sys.stderr.write(e.usage.rstrip("\n") + "\n")
        sys.stderr.write(f"error: {_one_line(e)}\n")
        if debug:
            raise
        return _exits.USAGE
    except TsmError as e:
        sys.stderr.write(f"error: {_one_line(e)}\n")
        if debug:
            raise
        return _exits.USAGE if isinstance(e, _usage_errors()) else _exits.FAILED
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        return _exits.INTERRUPTED
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
        return _exits.FAILED


def _tsm_home_problem() -> str | None:
    """Why ``$TSM_HOME`` (default ``~/.tsm``) cannot be used as tsm's state directory, or None.

    The state store keeps paths under it as UTF-8 text, so a path with bytes that are not UTF-8 (they reach
    Python as surrogate escapes) could never be recorded; say so up front instead of failing mid-command.
    """
    home = os.environ.get("TSM_HOME") or os.path.join(os.path.expanduser("~"), ".tsm")
    try:
        home.encode("utf-8")
    except UnicodeEncodeError:
        shown = os.fsencode(home).decode("utf-8", "backslashreplace")
        what = "TSM_HOME" if os.environ.get("TSM_HOME") else "the default TSM_HOME (~/.tsm)"
        return f"{what} '{shown}' is not valid UTF-8; set TSM_HOME to a directory whose path is UTF-8"
    return None


def _bytes_out() -> None:
    """Let stdout write back any byte the user gave (``os.fsdecode`` text), as ``ls`` or ``echo`` would.

    Arguments that are not UTF-8 reach tsm as surrogate escapes; under a strict stdout printing them (a dry
    run, a log line) would fail. The ``tsm.out`` handler writes such a surrogate as its original byte, and
    any other character the stdout encoding cannot hold (``PYTHONIOENCODING=ascii``) as a backslash escape;
    an error message on stderr shows both escaped (``backslashreplace``) rather than fail to print.
    """
    import codecs

    codecs.register_error("tsm.out", _out_errors)
    for stream, errors in ((sys.stdout, "tsm.out"), (sys.stderr, "backslashreplace")):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None and getattr(stream, "errors", None) in ("strict", "surrogateescape"):
            with contextlib.suppress(ValueError, OSError):  # a detached or closed stream stays as it is
                reconfigure(errors=errors)


def _out_errors(e: UnicodeError) -> tuple[str | bytes, int]:
    """``surrogateescape`` for the escaped bytes of a non-UTF-8 argument, else ``backslashreplace``."""
    if not isinstance(e, UnicodeEncodeError):
        raise e
    out = b"".join(
        bytes([ord(c) - 0xDC00]) if 0xDC80 <= ord(c) <= 0xDCFF else c.encode("ascii", "backslashreplace")
        for c in e.object[e.start : e.end]
    )
    return out, e.end


def _usage_errors() -> tuple[type[BaseException], ...]:
    """Errors that mean the command line itself was wrong: exit code 2, like argparse's own."""
    from tsm.cli._common import UsageError
    from tsm.errors import (
        ComponentNotFoundError,
        InvalidRunOptionError,
        MalformedAppHandleError,
        UnknownAppError,
        UnknownResourceError,
        UnknownSchedulerError,
    )

    return (
        UsageError, ComponentNotFoundError, InvalidRunOptionError, MalformedAppHandleError, UnknownSchedulerError,
        UnknownResourceError, UnknownAppError,
    )


def _one_line(e: BaseException | str) -> str:
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
