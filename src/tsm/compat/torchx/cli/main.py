"""``torchx``: TorchX 0.7's command line on tsm (the opt-in ``torchx`` console script, and ``python -m
tsm.torchx_alias -m torchx.cli.main`` under the alias).

===============  ==========================================================================================
``run``          launch a component (:mod:`~tsm.compat.torchx.cli.cmd_run`); prints the handle
``builtins``     the components found (``--print NAME``: one's source)
``status``       ``AppStatus.format()``, or ``--json``
``log``          the replicas' log lines, prefixed ``role/k`` (``-t`` follows)
``describe``     the app as a dict
``list``         ``APP HANDLE  APP STATUS`` of one scheduler
``cancel``       cancel an app
``runopts``      each scheduler's run options
``configure``    write (``--print``: print) a ``.torchxconfig``
``tracker``      ``list jobs | metadata RUN_ID | artifacts RUN_ID`` of the configured tracker
===============  ==========================================================================================

Plugins under the ``torchx.cli.cmds`` entry-point group replace or add subcommands, as in TorchX. Log lines
on stderr have TorchX's form (``torchx <time> INFO     ...``); ``--log_level`` sets their level.

Exit codes, TorchX's: 0 done; 1 the app did not succeed, the app is unknown, a component, run option or
identifier is wrong, or anything else failed; 2 a usage error of the command line (argparse); 130 Ctrl-C. Where
TorchX shows a traceback for an unexpected error, this command prints one line (``torchx: error: ...``, the
traceback with ``--log_level DEBUG``) and exits 1.

The console script refuses to start (one line, exit 2) when the real torchx is importable: uninstall it or
use ``python -m tsm.torchx_alias --shadow -m torchx.cli.main``. Otherwise it turns the torchx alias on in
its process and the processes it starts, so components and plugins that ``import torchx`` find tsm.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from tsm.compat.torchx.cli.cmd_base import SubCommand

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import NoReturn

sub_parser_description = """Use the following commands to run operations, e.g.:
torchx run ${JOB_NAME}
"""

#: The TorchX release whose command line this is.
TORCHX_VERSION = "0.7.0"


def get_default_sub_cmds() -> dict[str, SubCommand]:
    """The builtin subcommands by name."""
    from tsm.compat.torchx.cli.cmd_log import CmdLog
    from tsm.compat.torchx.cli.cmd_run import CmdBuiltins, CmdRun
    from tsm.compat.torchx.cli.cmd_runopts import CmdConfigure, CmdRunopts
    from tsm.compat.torchx.cli.cmd_status import CmdCancel, CmdDescribe, CmdList, CmdStatus
    from tsm.compat.torchx.cli.cmd_tracker import CmdTracker

    return {"builtins": CmdBuiltins(), "cancel": CmdCancel(), "configure": CmdConfigure(), "describe": CmdDescribe(),
            "list": CmdList(), "log": CmdLog(), "run": CmdRun(), "runopts": CmdRunopts(), "status": CmdStatus(),
            "tracker": CmdTracker()}


def get_sub_cmds() -> dict[str, SubCommand]:
    """The builtins, with the ``torchx.cli.cmds`` entry points (classes) replacing or adding by name."""
    from tsm.compat.torchx.util.entrypoints import load_group

    cmds = get_default_sub_cmds()
    for name, cls in (load_group("torchx.cli.cmds", default={}) or {}).items():
        cmds[name] = cls()
    return cmds


def create_parser(subcmds: dict[str, SubCommand]) -> argparse.ArgumentParser:
    """The ``torchx`` parser: ``--log_level``, ``--version`` and a parser per subcommand."""
    import tsm

    parser = argparse.ArgumentParser(prog="torchx", description="torchx CLI")
    parser.add_argument("--log_level", type=str, help="Python logging log level",
                        default=os.getenv("LOGLEVEL", "INFO"))
    parser.add_argument("--version", action="version", version=f"torchx-{TORCHX_VERSION} (tsm {tsm.__version__})")
    subparser = parser.add_subparsers(title="sub-commands", description=sub_parser_description)
    for name, cmd in subcmds.items():
        cmd_parser = subparser.add_parser(name)
        cmd.add_arguments(cmd_parser)
        cmd_parser.set_defaults(func=cmd.run)
    return parser


def run_main(subcmds: dict[str, SubCommand], argv: Sequence[str] | None = None) -> None:
    """Parse ``argv`` and run its subcommand (TorchX's: a failure exits through ``sys.exit``)."""
    from tsm.cli.colors import BLUE, ENDC, GRAY

    parser = create_parser(subcmds)
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    logging.basicConfig(level=args.log_level.upper(),
                        format=f"{BLUE}torchx{ENDC} {GRAY}%(asctime)s %(levelname)-8s{ENDC} %(message)s",
                        datefmt="%Y-%m-%d %H:%M:%S")
    logging.getLogger("tsm.events").propagate = False  # TorchX's events go to their handlers, not the console
    if "func" not in args:
        parser.print_help()
        sys.exit(1)
    args.func(args)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; its exit code (see the module doc)."""
    from tsm.cli._names import one_line

    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        run_main(get_sub_cmds(), argv)
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            return e.code or 0
        sys.stderr.write(f"{e.code}\n")
        return 1
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        return 130
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except Exception as e:  # noqa: BLE001 - TorchX shows a traceback here; one line, and exit 1 as TorchX's
        if logging.getLogger().isEnabledFor(logging.DEBUG):
            raise
        sys.stderr.write(f"torchx: error: {type(e).__name__}: {one_line(e)}\n")
        return 1
    finally:
        sys.stdout.flush()
    return 0


def entry() -> NoReturn:
    """The ``torchx`` console script: refuses over a real torchx, else the alias on, then :func:`main`."""
    import tsm.torchx_alias as alias

    shadow = os.environ.get(alias.ENV) == "shadow"
    try:
        alias.install(shadow=shadow)
    except alias.TorchxInstalledError:
        sys.stderr.write("torchx (tsm): the real torchx is installed in this environment; use its own `torchx` "
                         "command, or uninstall torchx to use tsm's (or run `python -m tsm.torchx_alias --shadow "
                         "-m torchx.cli.main ...`)\n")
        sys.exit(2)
    alias.export_to_children(shadow)
    sys.exit(main())


if __name__ == "__main__":
    entry()
