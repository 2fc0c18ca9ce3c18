"""The ``tsm`` argument parser: argparse with one-line usage errors, "did you mean" and lazy subcommand parsers.

Kept apart from :mod:`tsm.cli.main` so a command whose words need no parsing (``tsm status HANDLE``,
``tsm list``: see ``main._simple_args``) does not import argparse at all, which with its ``gettext``,
``shutil`` and ``locale`` and the parser it builds was about 15 ms of a 60 ms command.
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys

from tsm.cli import _exits
from tsm.cli._names import GLOBAL_FLAGS, SUBCOMMANDS, one_line as _one_line

TYPE_CHECKING = False  # keeps typing (3 ms) out of start-up; type checkers treat it as True
if TYPE_CHECKING:
    from typing import Any, NoReturn

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
        value = getattr(args, action.dest, None)
        # a repeatable flag (``-c``, action="append") collects each value: one of them may be that empty list
        if action.option_strings and action.nargs is None and (value == [] or (isinstance(value, list) and [] in value)):
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
            importlib.import_module(f"tsm.cli.cmd_{name.replace('-', '_')}").add_parser(sub)
        else:  # its line in --help now, its (empty) parser only if argparse asks for it
            sub._choices_actions.append(sub._ChoicesPseudoAction(name, (), text))
            dict.__setitem__(lazy, name, None)
    return parser
