"""TorchX's ``torchx.cli.cmd_run``: ``torchx run`` and ``torchx builtins``.

``torchx run [-s SCHEDULER] [-cfg K=V,...] [--dryrun] [--wait] [--log] [--workspace DIR] [--parent_run_id ID]
[--tee_logs] [--stdin] [COMPONENT] [ARGS...]`` as TorchX 0.7 (and its nightly's ``--stdin``, ``--tee_logs``)
has it: the handle on stdout (scripts read it), TorchX's log lines on stderr, and on a ``local*``
scheduler the app's logs on stderr until it ends. Exit codes: 0 done, 1 the app did not succeed or the
component, a run option or the JSON input is wrong, 2 a usage error of ``run`` itself.

Built on tsm: the runner is the TorchX face's (:mod:`tsm.compat.torchx.cli._runner`), the logs are printed by
tsm's log printer. Two choices of this command: ``--workspace`` left at its default (the working directory)
is shipped only to schedulers that build images from it (``local_docker``, ``kubernetes``), so ``local``,
``local_cwd`` and ``slurm`` run in the working directory as TorchX's ``local_cwd`` does; a ``--workspace``
given is shipped wherever the scheduler can. Ctrl-C while waiting for an app on a ``local*`` scheduler cancels
it (TorchX's in-process scheduler takes its replicas down with it) and exits 130.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
from collections import Counter
from dataclasses import MISSING as _NO_DEFAULT, asdict, dataclass, field, fields
from itertools import groupby
from pathlib import Path
from pprint import pformat
from typing import Any

from tsm.compat.torchx.cli.argparse_util import ArgOnceAction, torchxconfig_run
from tsm.compat.torchx.cli.cmd_base import SubCommand

logger = logging.getLogger(__name__)

MISSING_COMPONENT_ERROR_MSG = "missing component name, either provide it from the CLI or in .torchxconfig"


@dataclass
class TorchXRunArgs:
    """What one ``torchx run`` does, from its flags or from the JSON object ``--stdin`` reads (TorchX's fields)."""

    component_name: str
    scheduler: str
    scheduler_args: dict[str, Any]
    scheduler_cfg: dict[str, Any] = field(default_factory=dict)
    dryrun: bool = False
    wait: bool = False
    log: bool = False
    workspace: str = ""
    parent_run_id: str | None = None
    tee_logs: bool = False
    component_args: dict[str, Any] = field(default_factory=dict)
    component_args_str: list[str] = field(default_factory=list)


def torchx_run_args_from_json(json_data: dict[str, Any]) -> TorchXRunArgs:
    """:class:`TorchXRunArgs` from ``--stdin``'s object; a missing required field or an unknown one is a ValueError."""
    names = [f.name for f in fields(TorchXRunArgs)]
    required = {f.name for f in fields(TorchXRunArgs) if f.default is _NO_DEFAULT and f.default_factory is _NO_DEFAULT}
    missing = sorted(required - json_data.keys())
    if missing:
        raise ValueError(f"The following required fields are missing: {', '.join(missing)}")
    extra = sorted(set(json_data) - set(names))
    if extra:
        raise ValueError(f"The following fields are not part of the run command: {', '.join(extra)}. "
                         "Please check your JSON and try launching again.")
    run_args = TorchXRunArgs(**json_data)
    if run_args.workspace == "":
        run_args.workspace = str(Path.cwd())
    return run_args


def _parse_component_name_and_args(
    component_name_and_args: list[str], subparser: argparse.ArgumentParser, dirs: list[str] | None = None
) -> tuple[str, list[str]]:
    """``(component, its args)``: the first word unless it is an option, else ``[cli:run] component``.

    A leading ``--`` is dropped; an option repeated within a ``--``-separated group is a usage error, and so
    is no component at all (exit 2).
    """
    from tsm.runner.config import get_config

    component = get_config(prefix="cli", name="run", key="component", dirs=dirs)
    args = list(component_name_and_args)
    if args and args[0] == "--":
        args = args[1:]
    component_args: list[str] = []
    if args:
        if args[0].startswith("-"):
            component_args = args
        else:
            component, component_args = args[0], args[1:]
    for _, group in groupby(component_args, key=lambda x: x == "--"):
        options = [x for x in group if x.startswith("-") and x.strip() not in ("-", "--")]
        duplicates = [x for x, n in Counter(options).items() if n > 1]
        if duplicates:
            subparser.error(f"Repeated Command Line Arguments: {duplicates}")
    if not component:
        subparser.error(MISSING_COMPONENT_ERROR_MSG)
    return component, component_args


class CmdBuiltins(SubCommand):
    """``torchx builtins [--print NAME]``: the components found, or one's source."""

    def add_arguments(self, subparser: argparse.ArgumentParser) -> None:
        subparser.add_argument("--print", type=str, help="prints the builtin's component def to stdout")

    def _builtins(self) -> dict[str, Any]:
        from tsm.compat.torchx.specs.finder import get_components

        return get_components()

    def run(self, args: argparse.Namespace) -> None:
        from tsm.compat.torchx.specs.finder import get_builtin_source

        if args.print:
            print(get_builtin_source(args.print))
            return
        found = self._builtins()
        print(f"Found {len(found)} builtin components:")
        for i, component in enumerate(found.values()):
            print(f" {i + 1:2d}. {component.name}")


class CmdRun(SubCommand):
    """``torchx run`` (see the module doc)."""

    def __init__(self) -> None:
        self._subparser: argparse.ArgumentParser | None = None
        self._component = self._scheduler = ""
        self._stdin_data_json: dict[str, Any] | None = None

    def add_arguments(self, subparser: argparse.ArgumentParser) -> None:
        from tsm.compat.torchx.cli._runner import scheduler_factories

        names = list(scheduler_factories())
        self._subparser = subparser
        subparser.add_argument("-s", "--scheduler", type=str, default=names[0], choices=names,
                               action=torchxconfig_run, help="Name of the scheduler to use.")
        subparser.add_argument("-cfg", "--scheduler_args", type=str, action=ArgOnceAction,
                               help="Arguments to pass to the scheduler (Ex:`cluster=foo,user=bar`). For a list of "
                               "scheduler run options run: `torchx runopts`")
        subparser.add_argument("--dryrun", action="store_true", default=False,
                               help="Does not actually submit the app, just prints the scheduler request")
        subparser.add_argument("--wait", action="store_true", default=False,
                               help="Wait for the app to finish before exiting.")
        subparser.add_argument("--log", action="store_true", default=False,
                               help="Stream logs while waiting for app to finish.")
        subparser.add_argument("--workspace", "--buck-target", default=str(Path.cwd()), action=torchxconfig_run,
                               help="local workspace to build/patch (buck-target of main binary if using buck)")
        subparser.add_argument("--parent_run_id", type=str, action=ArgOnceAction,
                               help="optional parent run ID that this run belongs to. It can be used to group "
                               "runs for experiment tracking purposes")
        subparser.add_argument("--tee_logs", action="store_true", default=False,
                               help="Add additional prefix to log lines to indicate which replica is printing the log")
        subparser.add_argument("--stdin", action="store_true", default=False,
                               help="Read JSON input from stdin to parse into torchx run args and run the component.")
        subparser.add_argument("component_name_and_args", nargs=argparse.REMAINDER)

    def run(self, args: argparse.Namespace) -> None:
        from tsm.compat.torchx.cli._runner import command_runner
        from tsm.runner.config import load_sections

        os.environ["TORCHX_CONTEXT_NAME"] = os.getenv("TORCHX_CONTEXT_NAME", "cli_run")
        with command_runner(component_defaults=load_sections(prefix="component")) as runner:
            self._run(runner, args)

    def _run(self, runner: Any, args: argparse.Namespace) -> None:
        from tsm.errors import ComponentError, InvalidRunOptionError

        self.verify_no_extra_args(args)
        self._component = ""
        try:
            if args.stdin:
                self._run_from_stdin_args(runner, self.torchx_json_from_stdin())
            else:
                self._run_from_cli_args(runner, args)
        except ComponentError as e:
            logger.error("\nFailed to run component `%s` got errors: \n %s", self._component, e)
            sys.exit(1)
        except InvalidRunOptionError as e:
            scheduler = self._scheduler or args.scheduler
            print(f"Invalid scheduler configuration: {e}\nTo configure scheduler options, either:\n"
                  "  1. Use the `-cfg` command-line argument, e.g., `-cfg key1=value1,key2=value2`\n"
                  "  2. Set up a `.torchxconfig` file. For more details, visit: "
                  "https://pytorch.org/torchx/main/runner.config.html\n"
                  f"Run `torchx runopts {scheduler}` to check all available configuration options for the "
                  f"`{scheduler}` scheduler.", file=sys.stderr)
            sys.exit(1)

    def _run_from_cli_args(self, runner: Any, args: argparse.Namespace) -> None:
        assert self._subparser is not None
        self._scheduler = args.scheduler
        cfg = runner.scheduler_run_opts(args.scheduler).cfg_from_str(args.scheduler_args or "")
        component, component_args = _parse_component_name_and_args(args.component_name_and_args, self._subparser)
        self._run_inner(runner, TorchXRunArgs(
            component_name=component, scheduler=args.scheduler, scheduler_args={}, scheduler_cfg=cfg,
            dryrun=args.dryrun, wait=args.wait, log=args.log, workspace=args.workspace,
            parent_run_id=args.parent_run_id, tee_logs=args.tee_logs, component_args_str=component_args,
        ))

    def _run_from_stdin_args(self, runner: Any, stdin_data: dict[str, Any]) -> None:
        run_args = torchx_run_args_from_json(stdin_data)
        self._scheduler = run_args.scheduler
        run_args.scheduler_cfg = dict(run_args.scheduler_args)  # JSON values are typed already
        self._run_inner(runner, run_args)

    def torchx_json_from_stdin(self) -> dict[str, Any]:
        """The JSON object on stdin (read once); anything else is one error line and exit 1."""
        if self._stdin_data_json is None:
            try:
                data = json.load(sys.stdin)
            except (json.JSONDecodeError, EOFError, UnicodeDecodeError):
                logger.error("Unable to parse JSON input for `torchx run` command, please make sure it's a valid "
                             "JSON input.")
                sys.exit(1)
            if not isinstance(data, dict):
                logger.error("Invalid JSON input for `torchx run` command. Expected a dictionary.")
                sys.exit(1)
            self._stdin_data_json = data
        return self._stdin_data_json

    def verify_no_extra_args(self, args: argparse.Namespace) -> None:
        """With ``--stdin``, any other flag or a component given is a usage error (exit 2)."""
        if not args.stdin:
            return
        assert self._subparser is not None
        given = [f"--{a.dest.replace('_', '-')}" for a in self._subparser._actions
                 if a.dest not in ("stdin", "help") and getattr(args, a.dest, None) != a.default
                 and not (a.dest == "component_name_and_args" and not getattr(args, a.dest))]
        if given:
            self._subparser.error(f"Cannot specify {', '.join(given)} when using --stdin. "
                                  "All configuration should be provided in JSON input.")

    def _run_inner(self, runner: Any, args: TorchXRunArgs) -> None:
        from tsm.runner.config import apply

        self._component = args.component_name
        apply(scheduler=args.scheduler, cfg=args.scheduler_cfg)
        component_args: Any = args.component_args_str or args.component_args
        workspace = _workspace_for(runner, args.scheduler, args.workspace)
        if args.dryrun:
            info = runner.dryrun_component(args.component_name, component_args, args.scheduler,
                                           workspace=workspace, cfg=args.scheduler_cfg,
                                           parent_run_id=args.parent_run_id)
            print(f"\n=== APPLICATION ===\n{pformat(asdict(info._app), indent=2, width=80)}")
            print(f"\n=== SCHEDULER REQUEST ===\n{info}")
            return
        handle = runner.run_component(args.component_name, component_args, args.scheduler,
                                      workspace=workspace, cfg=args.scheduler_cfg, parent_run_id=args.parent_run_id)
        print(handle, flush=True)  # scripts read the handle from this line
        if args.scheduler.startswith("local"):
            self._wait_and_exit(runner, handle, log=True, cancel_on_interrupt=True)
            return
        logger.info("Launched app: %s", handle)
        status = runner.status(handle)
        if status:
            logger.info(status.format())
        if args.wait or args.log:
            self._wait_and_exit(runner, handle, log=args.log)

    def _wait_and_exit(self, runner: Any, app_handle: str, log: bool, cancel_on_interrupt: bool = False) -> None:
        """Wait for the app (its logs on stderr with ``log``); exit 1 unless it SUCCEEDED."""
        from tsm.specs.api import AppState

        logger.info("Waiting for the app to finish...")
        thread = self._start_log_thread(runner, app_handle) if log else None
        try:
            status = runner.wait(app_handle, wait_interval=1)
        except KeyboardInterrupt:
            if cancel_on_interrupt:
                runner.cancel(app_handle)
            raise
        if not status:
            raise RuntimeError(f"unknown status, wait returned {status}")
        logger.info("Job finished: %s", status.state)
        if thread is not None:
            thread.join()
        if status.state != AppState.SUCCEEDED:
            logger.error(repr(status))
            sys.exit(1)
        logger.debug(repr(status))

    def _start_log_thread(self, runner: Any, app_handle: str) -> threading.Thread:
        from tsm.compat.torchx.cli.cmd_log import get_logs

        thread = threading.Thread(target=get_logs, daemon=True, kwargs={
            "file": sys.stderr, "runner": runner, "identifier": app_handle, "regex": None, "should_tail": True})
        thread.start()
        return thread


def _workspace_for(runner: Any, scheduler: str, workspace: str | None) -> str | None:
    """The workspace to ship: one given (``file://`` stripped) where the scheduler can ship it; the default (the
    working directory) only to a scheduler that builds an image from it (see the module doc)."""
    if not workspace:
        return None
    path = workspace[len("file://"):] if workspace.startswith("file://") else workspace
    from tsm.workspace.api import WorkspaceBuilder
    from tsm.workspace.dir import builder_for

    sched = runner._scheduler(scheduler)
    if os.path.abspath(path) != str(Path.cwd()):
        return path if builder_for(scheduler, sched) is not None else None
    return path if isinstance(sched, WorkspaceBuilder) else None
