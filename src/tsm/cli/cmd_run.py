"""``tsm run COMPONENT [ARGS...]``: launch a component; by default stream its logs and wait for it."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

from tsm.cli import _exits, _live
from tsm.cli._common import add_cfg_args, parse_cfg, replica_targets, start_thread, stream_logs


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "run", help="launch a component (streams logs and waits unless --detach)",
        usage="tsm run [-s SCHEDULER] [-c CFG] [--dryrun] [--detach] [--workspace DIR] COMPONENT [COMPONENT ARGS...]",
        description="Launch COMPONENT (builtin like utils.echo, an installed one, or path/file.py:function) "
        "with its own arguments after it. tsm run's options (-s, -c, --dryrun, --detach) go BEFORE COMPONENT; "
        "everything after COMPONENT is the component's. `tsm run COMPONENT --help` shows the component's "
        "arguments.",
    )
    add_cfg_args(p)
    p.add_argument("--dryrun", action="store_true", help="print the request instead of submitting it")
    p.add_argument("--detach", action="store_true", help="print the handle and return at once")
    p.add_argument(
        "--workspace", metavar="DIR", default=None,
        help="ship DIR with the app: roles without an image run in a read-only snapshot of it, reused while "
        "DIR is unchanged (default: $TSM_WORKSPACE, else none; --workspace '' for none)",
    )
    p.add_argument("component", help="component name, e.g. utils.echo or ./my.py:train")
    p.add_argument("component_args", nargs=argparse.REMAINDER, help="the component's arguments")
    p.set_defaults(func=run)


#: ``tsm.workspace.api.METADATA_KEY``, the role metadata a workspace snapshot leaves: written out because
#: importing it loads the whole snapshot code, which a run without a workspace never needs
#: (``tests/cli/test_cli.py`` checks the two agree).
WORKSPACE_METADATA_KEY = "tsm.workspace"

#: tsm run's and tsm dryrun's own flags: a component that rejects one of these was most likely given it
#: by mistake after COMPONENT.
_OWN_FLAGS = ("--detach", "--dryrun", "-s", "--scheduler", "-c", "--cfg", "--workspace")


@contextlib.contextmanager
def explain_misplaced_flags(command: str, component: str, component_args: list[str]) -> Iterator[None]:
    """Add "this flag goes before COMPONENT" to a component's error about one of tsm's own flags.

    ``tsm run utils.echo --detach`` hands ``--detach`` to the component (everything after COMPONENT is
    its), which rejects it; the bare "unrecognized arguments" would not say why.
    """
    from tsm.errors import ComponentArgumentError, brief

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


def component_help(name: str, command: str = "run") -> int:
    """Print component ``name``'s help (``tsm run COMPONENT --help``); say that ``-h`` is not help where it is not."""
    import inspect

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


class _HeldInterrupt:
    """Holds back Ctrl-C (SIGINT) while an app is being submitted; :meth:`release` raises it afterwards.

    Without it, Ctrl-C during submission would leave a launched app running with no handle printed.
    With ``note``, each Ctrl-C held writes that line to stderr (once per Ctrl-C) so the user knows it
    was heard. Does nothing outside the main thread or when SIGINT is ignored.
    """

    def __init__(self, note: str = "") -> None:
        self.hit = False
        self._note = note.encode(errors="replace")
        self._old: Any = None
        if threading.current_thread() is threading.main_thread():
            old = signal.getsignal(signal.SIGINT)
            if old is not signal.SIG_IGN:
                self._old = signal.signal(signal.SIGINT, self._on_sigint)

    def _on_sigint(self, signum: int, frame: object) -> None:
        self.hit = True
        if self._note:
            # os.write, not sys.stderr: the main thread may be inside a write to sys.stderr right now
            with contextlib.suppress(OSError):
                os.write(2, self._note)

    def restore(self) -> bool:
        """Restore the previous handler; True if Ctrl-C came meanwhile (it is not raised)."""
        if self._old is not None:
            signal.signal(signal.SIGINT, self._old)
            self._old = None
        hit, self.hit = self.hit, False
        return hit

    def release(self) -> None:
        """Restore the previous handler; raise KeyboardInterrupt if Ctrl-C came meanwhile."""
        if self.restore():
            raise KeyboardInterrupt


def run(args: argparse.Namespace) -> int:
    from tsm.cli.cmd_dryrun import request_text
    from tsm.components import wants_help
    from tsm.runner.api import get_runner

    if wants_help(args.component_args):
        return component_help(args.component)
    cfg = parse_cfg(args.cfg)
    with get_runner(args.session) as runner:
        runner.check_cfg(args.scheduler, cfg)  # -c names options of one scheduler: a typo is an error here
        with explain_misplaced_flags("run", args.component, args.component_args):
            workspace = os.environ.get("TSM_WORKSPACE") if args.workspace is None else args.workspace
            building = workspace and not args.dryrun
            with _live.step(f"snapshotting workspace {workspace}") if building else contextlib.nullcontext():
                info = runner.dryrun_component(args.component, args.component_args, args.scheduler, cfg,
                                               workspace=workspace or None)
        snapshot_line = None
        if info.app is not None and any(WORKSPACE_METADATA_KEY in r.metadata for r in info.app.roles):
            # the snapshot code, imported only when there is a snapshot to describe
            snapshot_line = workspace_line(info.app)
        if args.dryrun:
            if snapshot_line:
                sys.stdout.write(f"=== workspace ===\n{snapshot_line}\n")
            sys.stdout.write(request_text(info))
            return _exits.OK
        if snapshot_line:
            sys.stderr.write(f"tsm: {snapshot_line}\n")
        held = _HeldInterrupt()
        try:
            with _live.step("submitting"):
                handle = runner.schedule(info)
        except BaseException:
            held.release()
            raise
        if args.detach:
            sys.stdout.write(handle + "\n")
            sys.stdout.flush()
            held.release()  # a Ctrl-C during submission still shows the handle of what was launched
            return _exits.OK
        sys.stderr.write(f"tsm: launched {handle}\n")
        sys.stderr.flush()
        return attach(runner, handle, held)


def attach(runner: Any, handle: str, held: _HeldInterrupt | None = None) -> int:
    """Stream every replica's log until the app ends, then print its status; Ctrl-C cancels it.

    After the first Ctrl-C, further ones are held (and acknowledged) until the app has been cancelled and
    its final status printed: a second Ctrl-C never leaves the user without the app's final state.

    When stderr is a terminal, a status line there (:mod:`tsm.cli._live`) shows each role's replicas
    running / done / failed and the time so far, out of the way of every log line; stdout is the same.
    """
    from tsm.specs.api import AppState

    t: threading.Thread | None = None
    line = _live.StatusLine() if _live.enabled() else None
    try:
        if held is not None:
            held.release()  # a Ctrl-C that came during submission lands here, and cancels the app
        targets = replica_targets(runner, handle, None, None)
        errors: list[BaseException] = []

        def logs() -> None:
            errors.extend(stream_logs(runner, handle, targets, tail=True, prefix=True, live=line))

        t = start_thread(logs)
        since = time.monotonic()
        if line is not None:
            _live.watch(runner, handle, line, since)
        status = runner.wait(handle)
        if line is not None and status is not None:
            line.show_status(status, since, force=True)  # the final counts while the last lines drain
        while line is not None and t.is_alive():  # the last lines are read: the line stays until then
            t.join(_live.REDRAW)
            line.tick()
        t.join()
        if line is not None:
            line.close()
    except KeyboardInterrupt:
        if line is not None:
            line.close()  # what follows (and the last log lines) is written plainly
        again = _HeldInterrupt(f"tsm: still cancelling {handle}; its final status follows\n")
        try:
            sys.stderr.write(f"\ntsm: interrupted; cancelling {handle} ...\n")
            sys.stderr.flush()
            runner.cancel(handle)
            if t is not None:
                t.join()  # the app has ended: its log readers finish (and stop writing) now
            sys.stdout.flush()
            sys.stderr.write(_exits.app_status(runner, handle).summary() + "\n")
            sys.stderr.flush()
        finally:
            again.restore()
        return _exits.INTERRUPTED
    except BaseException:
        if line is not None:
            line.close()  # the error message starts on a clean line
        raise
    if status is None:
        raise _exits.unknown_app(handle)
    for e in errors:
        sys.stderr.write(f"tsm: log streaming stopped: {e}\n")
    sys.stdout.flush()
    sys.stderr.write(f"tsm: {handle}\n{status.summary()}\n")
    return _exits.OK if status.state == AppState.SUCCEEDED else _exits.FAILED
