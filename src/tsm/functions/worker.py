"""What each replica of a function job runs: ``python -m tsm.functions.worker ...`` (see :mod:`tsm.functions.spec`).

It loads the call (the checkpoint a warned attempt left, if there is one, else the call submitted), calls it
with this replica's environment, and sends the outcome back: into the job's directory where the replicas
share the submitter's files, else as tagged lines on its standard output (:mod:`tsm.functions.payload`).
What can fail before the function runs (another Python, a module this environment lacks) is sent as an
outcome too, so the submitter always learns why. The exit status is 0 when the function returned, 1 when it
raised (so the app FAILED and its retries apply), 2 when the call could not be loaded.

A :class:`~tsm.functions.checkpoint.Checkpointable` callable is asked for its checkpoint when tsm warns the
replica (:func:`tsm.lifecycle.on_warning`); the checkpoint is written beside the outcome, and the next
attempt of this rank starts from it.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from tsm.functions import files
from tsm.functions.spec import WORKER, WorkerArgs, parse

#: the environment variable that asks the worker to turn submitit's alias on before it unpickles the call
SUBMITIT_ALIAS_ENV = "TSM_SUBMITIT_ALIAS"
#: when this replica's worker started (what a checkpoint hook measures a time limit's walltime from)
STARTED = time.time()


def _say(text: str) -> None:
    sys.stderr.write(f"tsm.functions: {text}\n")
    sys.stderr.flush()


def _ensure_cloudpickle() -> bool:
    """Make ``import cloudpickle`` work: the package, else the copy Ray ships (a Ray cluster without it)."""
    try:
        import cloudpickle  # type: ignore[import-untyped,unused-ignore]  # noqa: F401
        return True
    except ImportError:
        pass
    try:
        import ray.cloudpickle as vendored
        import ray.cloudpickle.cloudpickle as inner
    except ImportError:
        return False
    sys.modules["cloudpickle"] = vendored
    sys.modules["cloudpickle.cloudpickle"] = inner
    return True


def _install_alias() -> None:
    mode = os.environ.get(SUBMITIT_ALIAS_ENV)
    if mode in ("on", "shadow"):
        from tsm.submitit_alias import ALIAS

        ALIAS.install(shadow=mode == "shadow")


class Sink:
    """Where this replica's outcome goes: the job's directory, else tagged lines on fd 1."""

    def __init__(self, args: WorkerArgs, rank: int) -> None:
        self.args = args
        self.rank = rank

    def send(self, outcome: tuple[Any, ...]) -> None:
        data = _dump(outcome)
        if self.args.dir:
            try:
                files.write_whole(files.result_path(self.args.dir, self.rank), data)
                return
            except OSError as e:  # the directory is not shared with this node after all: the output still is
                _say(f"cannot write the result into {self.args.dir} ({e}); sending it in the output instead")
        from tsm.functions.payload import frames

        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        for line in frames(self.args.nonce, self.rank, data):
            os.write(1, line.encode("ascii"))  # one write per line: never split by another writer


def _dump(outcome: tuple[Any, ...]) -> bytes:
    from tsm.functions import payload

    try:
        return payload.dump_outcome(outcome)
    except Exception:  # noqa: BLE001 - no cloudpickle here: the error still goes back, by plain pickle
        plain = (outcome[0], None, *outcome[2:]) if outcome[0] == payload.ERROR else outcome
        return b"%s %s -\n" % (payload.MAGIC, payload.python_version().encode()) + pickle.dumps(plain, protocol=5)


def _load(args: WorkerArgs, rank: int) -> Any:
    """The call this attempt runs: this rank's checkpoint if a warned attempt left one, else the submitted one."""
    from tsm.functions import payload
    from tsm.functions.errors import FunctionLoadError, FunctionVersionError

    if not _ensure_cloudpickle():
        raise FunctionLoadError(f"cloudpickle is not installed in the replica's environment ({sys.executable}): "
                                "pip install 'tsm[functions]' there (or in the image)")
    if args.checkpoint_dir:
        data = files.read(files.checkpoint_path(args.checkpoint_dir, rank))
        if data is not None:
            _say(f"resuming rank {rank} from its checkpoint")
            return payload.loads(data)
    if args.call_file:
        data = files.read(Path(args.call_file))
        if data is None:
            raise FunctionLoadError(f"the call's file {args.call_file} is not there: this node does not see the "
                                    "submitter's files (pass channel='output' to send the call in the app instead)")
    else:
        data = payload.from_words(args.words)
    try:
        call = payload.loads(data)
        extra = payload.loads(payload.from_words([args.item])) if args.item else ()
    except (FunctionVersionError, FunctionLoadError):
        raise
    except Exception as e:  # noqa: BLE001 - a module or class this environment lacks, most often
        raise FunctionLoadError(f"the replica could not load the call: {type(e).__name__}: {e} (does its "
                                "environment have the function's modules? ship them with workspace= or the image)") from e
    return call.extended(*extra) if extra else call


def _watch_for_warning(call: Any, args: WorkerArgs, rank: int) -> None:
    """On tsm's warning, keep the checkpoint a Checkpointable asks for (see the module doc)."""
    from tsm.functions.checkpoint import Checkpointable

    if not isinstance(call.function, Checkpointable):
        return
    where = args.checkpoint_dir
    if not where:
        return

    def checkpoint() -> None:
        from tsm.functions import payload

        try:
            nxt = call.function._resume_call(call)
            if nxt is None:
                return
            files.write_whole(files.checkpoint_path(where, rank), payload.dumps(nxt, "the checkpoint"))
            _say(f"rank {rank} warned: checkpoint kept for the next attempt")
        except Exception:  # noqa: BLE001 - a failed checkpoint must not end the replica: it says why
            _say(f"rank {rank} warned, but its checkpoint failed:\n{traceback.format_exc()}")

    import tsm.lifecycle

    tsm.lifecycle.on_warning(checkpoint)


def main(argv: list[str] | None = None) -> int:
    """Run the call and send its outcome; the exit status (see the module doc)."""
    args = parse([*WORKER, *(sys.argv[1:] if argv is None else argv)])
    rank = int(os.environ.get("TSM_REPLICA_ID") or 0)
    sink = Sink(args, rank)
    sys.argv = sys.argv[:1]  # the function sees a plain command line, not the pickled call
    if args.tasks_per_node:
        from tsm.functions.env import TASKS_PER_NODE_ENV

        os.environ[TASKS_PER_NODE_ENV] = str(args.tasks_per_node)
    try:
        _install_alias()
        call = _load(args, rank)
    except BaseException as e:  # noqa: BLE001 - whatever stops the load is the outcome
        from tsm.functions.payload import error_outcome

        text = traceback.format_exc()
        _say(f"rank {rank} could not load the call: {type(e).__name__}: {e}")
        sink.send(error_outcome(e, text))
        return 2
    _watch_for_warning(call, args, rank)
    try:
        value = call()
    except BaseException as e:  # noqa: BLE001 - SystemExit and KeyboardInterrupt are the function's outcome too
        from tsm.functions.payload import error_outcome

        text = traceback.format_exc()
        sys.stderr.write(text)
        sink.send(error_outcome(e, text))
        return 1
    from tsm.functions.payload import OK

    sink.send((OK, value))
    return 0


if __name__ == "__main__":
    sys.exit(main())
