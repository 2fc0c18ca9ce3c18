"""What ``tsm run``, ``tsm dryrun`` and ``tsm sweep`` share: their run-option flags, the dry run a launch
starts with and how it is printed, a component's help, and the hint for a flag put after COMPONENT.

``tsm dryrun ARGS`` is ``tsm run --dryrun ARGS``: both make the dry run here (:func:`dry_run`, with the same
``-s``, ``-c`` and ``--workspace``) and print it the same way (:func:`dryrun_text`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from tsm.errors import InvalidRunOptionError, brief

if TYPE_CHECKING:
    from tsm.specs.api import AppDryRunInfo

#: Said under every printed request: the id in it is made up for the dry run (ids are unique per
#: submission, so a later ``tsm run`` of the same component gets a new one).
ID_NOTE = "# the app id above is for this dry run only: `tsm run` assigns a new id when it submits"


def add_cfg_args(parser: Any) -> None:
    """``-s/--scheduler`` and ``-c/--cfg`` (repeatable, merged) as run, dryrun and sweep take them."""
    parser.add_argument("-s", "--scheduler", help="scheduler to use (default: config file's, else local)")
    parser.add_argument("-c", "--cfg", action="append", metavar="CFG",
                        help="run options: name=value,name2=value2; repeat -c for more (each option once; "
                        "see tsm runopts)")
    parser.add_argument("--environment", metavar="LOCK", default=None,
                        help="run every role in the Python environment of LOCK (uv.lock, pylock.toml or "
                        "requirements.txt), built once per content where replicas run (the run option environment)")


def launch_cfg(args: Any) -> dict[str, str]:
    """The ``-c`` options merged (:func:`parse_cfg`), with ``--environment`` as the run option ``environment``."""
    cfg = parse_cfg(args.cfg)
    if args.environment:
        if "environment" in cfg:
            raise InvalidRunOptionError("--environment and -c environment= are both given; give the lock once")
        cfg["environment"] = args.environment
    return cfg


def add_launch_args(parser: Any) -> None:
    """:func:`add_cfg_args` and ``--workspace``: the options of a launch (run and dryrun)."""
    add_cfg_args(parser)
    parser.add_argument(
        "--workspace", metavar="DIR", default=None,
        help="ship DIR with the app: roles without an image run in a read-only snapshot of it, reused while "
        "DIR is unchanged (default: $TSM_WORKSPACE, else none; --workspace '' for none)",
    )
    parser.add_argument(
        "--after", action="append", metavar="HANDLE[:ok|:any|:fail]", default=None,
        help="start only once the app HANDLE has ended: SUCCEEDED (ok, the default), in any state (any), or "
        "FAILED/CANCELLED (fail); repeat for more (all must be met). Slurm waits itself for jobs of the same "
        "cluster (--dependency); otherwise tsm submits it when they end, even after this terminal is gone",
    )


def parse_cfg(texts: str | Sequence[str] | None) -> dict[str, str]:
    """Every ``-c`` merged: ``-c k=v,k2=a,b -c k3=x`` -> ``{"k": "v", "k2": "a,b", "k3": "x"}``.

    A piece without ``=`` continues the previous value of its ``-c``. An option given twice, in one ``-c``
    or in two, is an :class:`~tsm.errors.InvalidRunOptionError` naming it: never the last one silently.
    """
    out: dict[str, str] = {}
    for text in [texts] if isinstance(texts, str) else texts or []:
        last: str | None = None
        for piece in text.split(","):
            if "=" in piece:
                key, _, value = piece.partition("=")
                key = key.strip()
                if not key:
                    raise InvalidRunOptionError(f"-c: empty option name in {text!r}; use -c name=value,name2=value2")
                if key in out:
                    raise InvalidRunOptionError(
                        f"-c: run option {brief(key, 60)} is given twice ({brief(out[key], 60)} and "
                        f"{brief(value.strip(), 60)}); give each option once"
                    )
                out[key] = value.strip()
                last = key
            elif last is not None:
                out[last] += "," + piece.strip()
            elif piece.strip():
                raise InvalidRunOptionError(f"-c: {piece!r} is not name=value; use -c name=value,name2=value2")
    return out


def dry_run(runner: Any, args: Any, command: str, building: bool = False) -> AppDryRunInfo[Any]:
    """The dry run of ``args`` (component, its arguments, ``-s``, ``-c``, ``--workspace``) for ``tsm command``.

    ``-c`` names options of one scheduler, so a typo is an error here. With ``building`` (a launch, not a
    dry run), a workspace snapshot shows a spinner on a terminal while it is made.
    """
    from tsm.cli import _live

    cfg = launch_cfg(args)
    runner.check_cfg(args.scheduler, cfg)
    with explain_misplaced_flags(command, args.component, args.component_args):
        workspace = os.environ.get("TSM_WORKSPACE") if args.workspace is None else args.workspace
        spin = _live.step(f"snapshotting workspace {workspace}") if workspace and building else contextlib.nullcontext()
        with spin:
            info: AppDryRunInfo[Any] = runner.dryrun_component(args.component, args.component_args, args.scheduler,
                                                               cfg, workspace=workspace or None,
                                                               after=args.after)
    return info


def snapshot_line(info: AppDryRunInfo[Any]) -> str | None:
    """:func:`workspace_line` of the dry run's app, or None (the snapshot code is imported only when there is one)."""
    if info.app is None or not any(WORKSPACE_METADATA_KEY in r.metadata for r in info.app.roles):
        return None
    return workspace_line(info.app)


def request_text(info: AppDryRunInfo[Any]) -> str:
    """The request as every dry run prints it: header, request, app-id note."""
    held = "".join(f"# held by tsm until {d} ends as asked, then submitted as above\n" for d in info.after)
    if info.on_state:
        from tsm.runner.hooks import describe

        held += f"# each state change is told to {describe(info.on_state)} by tsm's helper\n"
    return f"=== scheduler request ({info.scheduler}) ===\n{info}\n{held}{ID_NOTE}\n"


def dryrun_text(info: AppDryRunInfo[Any]) -> str:
    """What ``tsm dryrun`` and ``tsm run --dryrun`` print: the workspace snapshot (if any), then the request."""
    line = snapshot_line(info)
    return (f"=== workspace ===\n{line}\n" if line else "") + request_text(info)


def component_help(name: str, command: str = "run") -> int:
    """Print component ``name``'s help (``tsm run COMPONENT --help``); say that ``-h`` is not help where it is not."""
    import inspect
    import sys

    from tsm.components import component_help as render, get_component

    fn = get_component(name).fn
    text = render(fn, prog=f"tsm {command} {name}")
    try:
        takes_h = "h" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        takes_h = False
    if takes_h:
        text = text.rstrip("\n") + (
            "\n\nNote: -h is this component's -h option (a named resource in the builtins, as in TorchX),"
            " not help; use --help.\n"
        )
    sys.stdout.write(text)
    return 0


#: ``tsm.workspace.api.METADATA_KEY``, the role metadata a workspace snapshot leaves: written out because
#: importing it loads the whole snapshot code, which a run without a workspace never needs
#: (``tests/cli/test_cli.py`` checks the two agree).
WORKSPACE_METADATA_KEY = "tsm.workspace"

#: tsm run's and tsm dryrun's own flags: a component that rejects one of these was most likely given it
#: by mistake after COMPONENT.
_OWN_FLAGS = ("--detach", "--dryrun", "-s", "--scheduler", "-c", "--cfg", "--workspace", "--after")


@contextlib.contextmanager
def explain_misplaced_flags(command: str, component: str, component_args: list[str]) -> Iterator[None]:
    """Add "this flag goes before COMPONENT" to a component's error about one of tsm's own flags.

    ``tsm run utils.echo --detach`` hands ``--detach`` to the component (everything after COMPONENT is
    its), which rejects it; the bare "unrecognized arguments" would not say why.
    """
    from tsm.errors import ComponentArgumentError

    try:
        yield
    except ComponentArgumentError as e:
        message = str(e)
        words = {w.partition("=")[0] for w in component_args}
        own = _component_flags(component)
        misplaced = [f for f in _OWN_FLAGS if f in words and f in message and f not in own]
        if not misplaced:
            raise
        flag = misplaced[0]
        raise ComponentArgumentError(
            f"{message}; {flag} is an option of tsm {command}, and options of tsm {command} go before "
            f"COMPONENT (everything after COMPONENT is the component's): tsm {command} {flag} "
            f"{'VALUE ' if flag in ('-s', '--scheduler', '-c', '--cfg') else ''}{brief(component, 60)[1:-1]} ...",
            usage=e.usage,
        ) from None


def workspace_line(app: Any) -> str | None:
    """The line every launch with a workspace prints: the snapshot, its size and digest, and what it cost.

    A directory snapshot (local, Slurm) says whether it was reused or what was copied; an image workspace
    (Docker, Kubernetes) names the image and whether it is built or reused; Ray's names the job's
    ``working_dir``. None when no role has a workspace.
    """
    from tsm.workspace.dir import workspace_summary

    line = workspace_summary(app)
    if line is not None:
        return line
    for role in app.roles:
        meta = role.metadata.get(WORKSPACE_METADATA_KEY)
        if not isinstance(meta, dict):
            continue
        try:
            head = (f"workspace {meta['workspace']} -> {meta['snapshot']} ({int(meta['files'])} files, "
                    f"{int(meta['bytes'])} bytes, sha256 {str(meta['digest'])[:12]})")
        except (KeyError, TypeError, ValueError):
            continue
        if meta.get("docker_tag"):
            what = f"image {meta['docker_tag']} " + ("to build" if meta.get("build") else "reused, nothing to build")
        elif meta.get("ray_working_dir"):
            what = "the Ray job's working_dir (uploaded once per content hash)"
        else:
            what = "snapshot ready"
        used_by = [r.name for r in app.roles if isinstance(r.metadata.get(WORKSPACE_METADATA_KEY), dict)]
        return f"{head}: {what} (roles: {', '.join(used_by)})"
    return None


def _component_flags(component: str) -> set[str]:
    """The flags component ``component`` takes itself (``-c`` and ``--c`` for a parameter ``c``).

    ``utils.python -c CODE`` is the component's own ``-c``: an error about it must not be explained as
    tsm run's ``-c`` put after COMPONENT. Empty when the component cannot be looked up (its own error then
    stands as it is).
    """
    import inspect

    from tsm.components import get_component

    try:
        params = inspect.signature(get_component(component).fn).parameters
    except Exception:  # noqa: BLE001 - only a hint depends on it
        return set()
    return {flag for name in params for flag in ((f"-{name}", f"--{name}") if len(name) == 1 else (f"--{name}",))}
