"""``tsm sweep``: run a component over a grid or a random space, N trials at a time, and see which won.

::

    tsm sweep [-s SCHED] [-c CFG] [--parallel N] [--max-failures K] [--metric M] [--dryrun]
              COMPONENT --lr 0.1,0.01 --batch 32,64 [-- ARGS]            # a grid: every combination
    tsm sweep --random 50 --seed 0 COMPONENT --lr log:1e-4:1e-1 --dropout 0:0.5 --opt sgd,adam
    tsm sweep status|wait|cancel|resume SWEEP
    tsm sweep show SWEEP [--sort loss | --sort=-acc] [--json]
    tsm sweep list

After COMPONENT each ``--name VALUES`` is an axis over the component's parameter ``name``; words after
``--`` are passed to every trial unchanged. Exit codes as everywhere: 0 done (wait: every trial
succeeded), 1 the sweep FAILED or was CANCELLED, 2 a wrong command line (nothing submitted), 3 timeout.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from tsm.cli import _exits
from tsm.cli._launch import add_cfg_args, component_help, launch_cfg, request_text

#: the verbs that take a sweep handle instead of a component
VERBS = ("status", "wait", "cancel", "resume", "show", "list")


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "sweep", help="run a component over a grid or random space, N at a time; results table",
        usage="tsm sweep [-s SCHEDULER] [-c CFG] [--parallel N] [--max-failures K] [--random N [--seed S]] "
        "[--metric M] [--dryrun] COMPONENT --PARAM VALUES ... [-- ARGS]\n"
        "       tsm sweep {status,wait,cancel,resume,show,list} [SWEEP] ...",
        description="Run COMPONENT once per point of a space, at most --parallel trials at a time, fed by a "
        "detached controller that outlives the terminal. After COMPONENT each --PARAM VALUES is an axis: a "
        "list 0.1,0.01 (grid or random choice), a range 0:0.5 or log:1e-4:1e-1 (with --random N). Words after "
        "-- go to every trial. `tsm sweep show SWEEP` prints one row per trial, best first.",
    )
    add_cfg_args(p)
    p.add_argument("--parallel", type=int, default=1, metavar="N", help="at most N trials at once (default 1)")
    p.add_argument("--max-failures", type=int, default=None, metavar="K",
                   help="stop launching once K trials failed (the sweep ends FAILED)")
    p.add_argument("--random", type=int, default=None, metavar="N", help="N random trials instead of the grid")
    p.add_argument("--seed", type=int, default=None, metavar="S", help="seed of --random (same seed, same trials)")
    p.add_argument("--metric", default=None, metavar="M",
                   help="the metric `show` sorts by, best first: loss (lower is better) or -acc (higher)")
    p.add_argument("--workspace", metavar="DIR", default=None, help="ship DIR with every trial (as tsm run)")
    p.add_argument("--dryrun", action="store_true", help="print every trial's parameters and the first request")
    p.add_argument("component", help="component name, or a verb: " + ", ".join(VERBS))
    p.add_argument("component_args", nargs=argparse.REMAINDER, help="--PARAM VALUES axes, then -- ARGS")
    p.set_defaults(func=run)


def parse_axes(words: list[str]) -> tuple[dict[str, str], list[str]]:
    """``--lr 0.1,0.01 --batch=32,64 -- rest`` -> ({"lr": ..., "batch": ...}, ["rest"]); a stray word is an error."""
    from tsm.errors import UsageError, brief

    axes: dict[str, str] = {}
    i = 0
    while i < len(words):
        word = words[i]
        if word == "--":
            return axes, words[i + 1 :]
        if not word.startswith("--") or len(word) < 3:
            raise UsageError(f"expected --PARAM VALUES after the component, got {brief(word, 60)}; "
                             "put the component's fixed arguments after --")
        name, eq, value = word[2:].partition("=")
        if not eq:
            if i + 1 >= len(words) or words[i + 1] == "--":
                raise UsageError(f"--{brief(name, 60)[1:-1]} needs values, e.g. --{brief(name, 60)[1:-1]} 0.1,0.01")
            value = words[i + 1]
            i += 1
        if name in axes:
            raise UsageError(f"--{brief(name, 60)[1:-1]} is given twice; put all its values in one list")
        axes[name] = value
        i += 1
    return axes, []


def run(args: argparse.Namespace) -> int:
    if args.component in VERBS:
        return _verb(args.component, args.component_args, args.session)
    from tsm.errors import UsageError
    from tsm.runner.api import get_runner
    from tsm.sweep.api import plan_sweep, run_sweep

    if args.component_args in (["--help"], ["-h"]):  # the component's own parameters: what can be swept
        return component_help(args.component, command="sweep")
    axes, fixed = parse_axes(args.component_args)
    if not axes:
        raise UsageError(f"give the space after {args.component}: --PARAM VALUES (e.g. --lr 0.1,0.01)")
    cfg = launch_cfg(args)
    opts: dict[str, Any] = dict(scheduler=args.scheduler, cfg=cfg, args=fixed, parallel=args.parallel,
                                max_failures=args.max_failures, random=args.random, seed=args.seed,
                                workspace=args.workspace)
    with get_runner(args.session) as runner:
        if args.dryrun:
            plan = plan_sweep(runner, args.component, axes, **opts)
            out = [f"{len(plan.trials)} trial(s) on {plan.scheduler}, at most {args.parallel} at once:"]
            out += [f"  trial {i}: " + " ".join(f"--{k} {v}" for k, v in p.items()) for i, p in enumerate(plan.trials)]
            sys.stdout.write("\n".join(out) + "\n=== first trial ===\n" + request_text(plan.first))
            return _exits.OK
        handle = run_sweep(runner, args.component, axes, metric=args.metric, **opts)
    sys.stdout.write(handle + "\n")
    sys.stdout.flush()
    sys.stderr.write(f"tsm: sweep started; `tsm sweep status {handle}`, `tsm sweep show {handle}`\n")
    return _exits.OK


def _verb_parser(verb: str) -> argparse.ArgumentParser:
    from tsm.cli._parser import _Parser
    from tsm.cli.cmd_wait import seconds

    p = _Parser(prog=f"tsm sweep {verb}")
    if verb != "list":
        p.add_argument("sweep", help="sweep handle (sweep://SESSION/ID)")
    if verb == "wait":
        p.add_argument("--timeout", type=seconds, metavar="SECONDS", help="give up after this long (exit 3)")
    if verb == "show":
        p.add_argument("--sort", default=None, metavar="METRIC", help="best first by METRIC, lowest first; --sort=-METRIC: highest first")
        p.add_argument("--json", action="store_true", help="print the rows as JSON")
    return p


def _verb(verb: str, words: list[str], session: str) -> int:
    from tsm.sweep import api

    args = _verb_parser(verb).parse_args(words)
    if verb == "list":
        return _list(api.sweeps())
    if verb == "status":
        st = api.sweep_status(args.sweep)
        sys.stdout.write(f"{st.handle}\n{st.summary()}\n")
        return _exits.OK
    if verb == "resume":
        started = api.resume(args.sweep)
        st = api.sweep_status(args.sweep, restart=False)
        what = "controller restarted" if started else ("already ended" if st.is_terminal else "controller already running")
        sys.stdout.write(f"{st.handle}: {what}\n{st.summary()}\n")
        return _exits.OK
    if verb == "wait":
        st = api.sweep_wait(args.sweep, args.timeout)
        sys.stdout.write(f"{st.handle}\n{st.summary()}\n")
        if not st.is_terminal:
            sys.stdout.flush()
            sys.stderr.write(f"tsm: timed out: {st.handle} is still {st.state}\n")
            return _exits.TIMEOUT
        return _exits.OK if st.state == "SUCCEEDED" else _exits.FAILED
    if verb == "cancel":
        from tsm.runner.api import get_runner

        with get_runner(session) as runner:
            st = api.sweep_cancel(runner, args.sweep)
        sys.stdout.write(f"{st.handle}\n{st.summary()}\n")
        return _exits.OK
    return _show(args.sweep, args.sort, args.json)


def _show(handle: str, sort: str | None, as_json: bool) -> int:
    from tsm.sweep import api, results

    trials = api.sweep_trials(handle)
    meta_sort = sort or api.sweep_metric(handle)
    metrics = results.read_metrics([t.handle for t in trials if t.handle])
    table = results.sort_rows(results.rows(trials, metrics), meta_sort)
    if as_json:  # each parameter as the value its component took (0.1, 32, true), not the text it was given
        types = results.param_types(api.sweep_component(handle))
        sys.stdout.write(results.to_json(table, types) + "\n")
    else:
        sys.stdout.write(results.render(_printable(table)))
    return _exits.OK


def _printable(table: list[Any]) -> list[Any]:
    """The rows with what trials recorded (metric names and values, parameters) made safe for a terminal:
    escape sequences, CR and other control characters written as escapes, as ``tsm tracker show`` does."""
    import dataclasses

    from tsm.util.text import printable

    def safe(value: Any) -> Any:
        return printable(value) if isinstance(value, str) else value

    return [dataclasses.replace(r, params={safe(k): safe(v) for k, v in r.params.items()},
                                metrics={safe(k): safe(v) for k, v in r.metrics.items()},
                                state=safe(r.state), handle=safe(r.handle), msg=safe(r.msg)) for r in table]


def _list(sweeps: list[Any]) -> int:
    import time

    if not sweeps:
        sys.stdout.write("no sweeps\n")
        return _exits.OK
    rows = [("SWEEP", "STATE", "TRIALS", "CREATED")]
    for s in sweeps:
        created = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(s.created)) if s.created else "-"
        rows.append((s.handle, s.state, s.summary().partition("(")[2].partition(")")[0], created))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    sys.stdout.write("\n".join("  ".join(c.ljust(w) for c, w in zip(r, [*widths, 0], strict=True)).rstrip()
                               for r in rows) + "\n")
    return _exits.OK
