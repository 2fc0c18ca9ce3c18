"""``tsm``: the command line. Parses, calls the runner, prints; nothing else.

Each subcommand is a module here with ``add_parser(subparsers)`` and ``run(args) -> int``; the modules
import the runner and backends only inside ``run`` so ``tsm --help`` stays fast. Every tsm error is
printed as one line on stderr (``--debug`` shows the traceback); the exit codes are one table
(:mod:`tsm.cli._exits`, printed by ``tsm --help``): 0 done, 1 failed, 2 usage error or unknown app,
3 timeout, 4 replica not running (exec, stack, port-forward), 130 Ctrl-C. A misspelt subcommand or flag
gets a "did you mean", and a flag put in the wrong place (a global flag after the subcommand) says where
it goes.

The parser lives in :mod:`tsm.cli._parser`; the read-only forms dashboards and scripts call most often
(``tsm status HANDLE [--json]``, ``tsm list [--all | -s NAME]``, written exactly so) are taken by
:func:`_simple_args` without building it, with the attributes argparse would set: start-up.
"""

from __future__ import annotations

import os
import sys

from tsm.cli import _exits
from tsm.cli._names import GLOBAL_FLAGS as GLOBAL_FLAGS, SUBCOMMANDS as SUBCOMMANDS, one_line as _one_line

TYPE_CHECKING = False  # keeps typing (3 ms) out of start-up; type checkers treat it as True
if TYPE_CHECKING:
    from typing import Any, NoReturn

#: What :mod:`tsm.cli._parser` defines, still reachable as ``tsm.cli.main.NAME`` (imported on first use).
_PARSER_NAMES = frozenset((
    "build_parser", "_Parser", "_TopParser", "_LazyParsers", "_unrecognized", "_check_single_values",
    "_subparser", "_chosen", "_INVALID_CHOICE",
))


def __getattr__(name: str) -> Any:
    if name in _PARSER_NAMES:
        from tsm.cli import _parser

        return getattr(_parser, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class _Args:
    """The parsed command line of a command :func:`_simple_args` took (argparse's ``Namespace`` has the same
    attributes; this class needs no argparse)."""

    def __init__(self, **kwargs: Any) -> None:
        self.__dict__.update(kwargs)

    def __repr__(self) -> str:
        return f"Namespace({', '.join(f'{k}={v!r}' for k, v in self.__dict__.items())})"


def _plain(word: str) -> bool:
    """Whether argparse takes ``word`` as a value, never as an option or ``--`` (it does not start with ``-``)."""
    return not word.startswith("-")


def _simple_args(argv: list[str]) -> _Args | None:
    """The parsed command line for the few read-only forms scripts and dashboards run most, without argparse.

    ``tsm status HANDLE [--json]``, ``tsm list [--all]`` and ``tsm list -s|--scheduler NAME``, written
    exactly so (no global flag, no abbreviation, no ``=``, no value starting with ``-``): for these the
    attributes are exactly those argparse would set, so the command behaves the same, but importing argparse
    (with ``gettext``, ``shutil`` and ``locale``) and building the parser cost about 15 ms of a 60 ms
    command. Anything else, including every mistake, returns None and goes through argparse.
    """
    n = len(argv)
    if n < 1 or n > 3:
        return None
    command = argv[0]
    if command == "status":
        if not (n == 2 and _plain(argv[1])) and not (n == 3 and _plain(argv[1]) and argv[2] == "--json"):
            return None
        from tsm.cli import cmd_status

        return _Args(debug=False, session="default", command="status", handle=argv[1], json=n == 3,
                     func=cmd_status.run)
    if command == "list":
        if n == 1 or (n == 2 and argv[1] == "--all"):
            scheduler = None
        elif n == 3 and argv[1] in ("-s", "--scheduler") and _plain(argv[2]):
            scheduler = argv[2]
        else:
            return None
        from tsm.cli import cmd_list

        return _Args(debug=False, session="default", command="list", scheduler=scheduler,
                     limit=cmd_list.DEFAULT_LIMIT, all=n == 2, func=cmd_list.run)
    return None


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit code (the console script exits with it)."""
    argv = sys.argv[1:] if argv is None else argv
    _bytes_out()
    args: Any = _simple_args(argv)
    if args is None:
        args = _parse(argv)
        if isinstance(args, int):
            return args
    debug = args.debug or os.environ.get("TSM_DEBUG") == "1"
    from tsm.errors import ComponentArgumentError, TsmError

    try:
        from tsm.specs.validate import check_name

        check_name(args.session, "--session: session name")
    except TsmError as e:
        from tsm.cli._parser import build_parser

        build_parser(argv).error(str(e))
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
            from tsm.errors import EnvBuildError

            if isinstance(e, EnvBuildError) and e.detail:  # the installer's own words, below the line
                sys.stderr.write(e.detail.rstrip("\n") + "\n")
            raise
        if isinstance(e, _usage_errors()):
            return _exits.USAGE
        from tsm.errors import ReplicaNotRunningError

        return _exits.NOT_RUNNING if isinstance(e, ReplicaNotRunningError) else _exits.FAILED
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


def _parse(argv: list[str]) -> Any:
    """``argv`` parsed by argparse (:mod:`tsm.cli._parser`), or the exit code when there is no command."""
    from tsm.cli._parser import _check_single_values, _subparser, _unrecognized, build_parser

    parser = build_parser(argv)
    args, extra = parser.parse_known_args(argv)
    if extra:
        (_subparser(parser, args.command) or parser).error(_unrecognized(parser, args.command, extra))
    _check_single_values(parser, args)
    _check_single_values(_subparser(parser, args.command), args)
    if not args.command:
        parser.print_help()
        return _exits.USAGE
    return args


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
            try:  # noqa: SIM105 - contextlib.suppress would cost start-up an import
                reconfigure(errors=errors)
            except (ValueError, OSError):  # a detached or closed stream stays as it is
                pass


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


def entry() -> NoReturn:
    """Console-script wrapper: a read goes to the per-user command server when one runs (same output, the
    imports already made: :mod:`tsm.cli._client`), else runs here."""
    from tsm.cli import _client

    argv = sys.argv[1:]
    code = _client.served(argv)
    if code is None:
        code = main(argv)
        _client.after_local_read(argv)
    sys.exit(code)


if __name__ == "__main__":
    entry()
