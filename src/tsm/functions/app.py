"""From a Python call to an app: one role of ``replicas`` replicas, each running the worker on the call.

:func:`plan` decides everything that is the same for one :func:`~tsm.functions.submit` or every item of a
:func:`~tsm.functions.map` (the pickled call and how it travels, the job's directory, the role's settings);
:func:`app_of` turns a plan (and an item) into the :class:`~tsm.specs.AppDef` the runner dry-runs and submits
unchanged.

**Channels.** Where the replicas share this machine's files (the scheduler runs roles in a directory,
``DirectoryWorkspaces``: local, Slurm; not over ``-c ssh=...``) outcomes and checkpoints go to the job's
directory (:mod:`tsm.functions.files`), a call over 64 KiB is a file there, and the replicas get the
submitter's import path (``PYTHONPATH``: the entries of ``sys.path`` outside the interpreter's own tree), so
a function defined in a module the submitter imported is found. Elsewhere (Docker, Kubernetes, Ray, Slurm
over SSH) the call rides in the app's arguments (up to 1 MiB of base64) and outcomes come back in each
replica's output, the engine's own log channel. ``channel="files"`` or ``"output"`` chooses by hand.
"""

from __future__ import annotations

import os
import re
import secrets
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tsm.functions import files, payload
from tsm.functions.errors import FunctionError
from tsm.functions.spec import WorkerArgs
from tsm.specs.api import AppDef, Resource, RetryPolicy, Role
from tsm.specs.mounts import Mount

#: encoded call size above which the files channel keeps the call in a file rather than in the app
FILE_ABOVE = 64 * 1024
#: the most encoded bytes a call may have where it must ride in the app's arguments
INLINE_MAX = 1024 * 1024
#: app metadata keys a reader of the app finds the job's facts under
META_FUNCTION, META_RESULTS = "tsm.function", "tsm.function.results"
CHANNELS = ("auto", "files", "output")


@dataclass
class FunctionOptions:
    """How a function job runs: the role's settings (as :class:`~tsm.specs.Role` names them) and the channel."""

    name: str | None = None
    image: str = ""
    resource: Resource | None = None
    replicas: int = 1
    tasks_per_node: int | None = None
    env: dict[str, str] = field(default_factory=dict)
    max_retries: int = 0
    retry_policy: RetryPolicy = RetryPolicy.APPLICATION
    mounts: list[Mount] = field(default_factory=list)
    channel: str = "auto"
    checkpoint_dir: str | None = None
    results: str = "all"
    metadata: dict[str, str] = field(default_factory=dict)
    #: shell commands each replica runs before the function (in one bash, so ``export`` and ``cd`` hold)
    setup: list[str] = field(default_factory=list)
    #: shell commands each replica runs after it, whatever it returned
    teardown: list[str] = field(default_factory=list)

    def check(self) -> None:
        from tsm.errors import InvalidRunOptionError

        if not isinstance(self.replicas, int) or self.replicas < 1:
            raise InvalidRunOptionError(f"replicas must be a whole number of at least 1, got {self.replicas!r}")
        if self.tasks_per_node is not None and (not isinstance(self.tasks_per_node, int) or self.tasks_per_node < 1):
            raise InvalidRunOptionError(f"tasks_per_node must be at least 1, got {self.tasks_per_node!r}")
        if self.channel not in CHANNELS:
            raise InvalidRunOptionError(f"channel must be one of {', '.join(CHANNELS)}, got {self.channel!r}")
        if self.results not in ("all", "rank0"):
            raise InvalidRunOptionError(f"results must be 'all' (every rank's) or 'rank0', got {self.results!r}")


@dataclass
class Plan:
    """What every job of one submit (or map) shares; pickled into a map's trials (see :mod:`.component`)."""

    options: FunctionOptions
    name: str
    nonce: str
    key_dir: str | None
    words: list[str]
    call_file: str | None
    env: dict[str, str]


def app_name(fn: Any, given: str | None) -> str:
    """``given``, else the function's name as an app name (``train_model`` -> ``train_model``)."""
    raw = given or getattr(fn, "__name__", None) or type(fn).__name__
    name = re.sub(r"[^A-Za-z0-9_-]+", "-", str(raw)).strip("-_")[:40] or "function"
    return name if name[0].isalnum() else f"fn{name}"


def import_path() -> str:
    """The submitter's import path for replicas on its files: ``PYTHONPATH``, then ``sys.path`` entries that are
    directories outside the interpreter's own tree (the current directory included)."""
    own = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    out: list[str] = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    for entry in sys.path:
        path = os.path.abspath(entry or ".")
        real = os.path.realpath(path)
        if not os.path.isdir(path) or any(real == o or real.startswith(o + os.sep) for o in own):
            continue
        if path not in out:
            out.append(path)
    return os.pathsep.join(out)


def plan(call: Any, options: FunctionOptions, shares_files: bool, *, alias_env: dict[str, str]) -> Plan:
    """Pickle ``call`` and decide how it travels (see the module doc); raises before anything is written
    when it cannot be pickled or is too big for the channel."""
    options.check()
    data = payload.dumps(call, _what(call))
    words = payload.to_words(data)
    size = sum(len(w) for w in words)
    files_channel = options.channel == "files" or (options.channel == "auto" and shares_files)
    if not files_channel and size > INLINE_MAX:
        raise FunctionError(
            f"the call pickles to {size / 2**20:.1f} MiB of base64, over the {INLINE_MAX // 2**20} MiB that can ride "
            "in the app's definition where replicas do not share this machine's files; load large data inside the "
            "function (from storage the replicas read) instead of passing it"
        )
    env = dict(options.env)
    env.update(alias_env)
    key_dir = call_file = None
    if files_channel:
        key = files.new_key_dir()
        key_dir = str(key)
        if size > FILE_ABOVE:
            files.write_whole(key / files.CALL, data)
            call_file, words = str(key / files.CALL), []
        env.setdefault("PYTHONPATH", import_path())
    return Plan(options, app_name(getattr(call, "function", call), options.name), secrets.token_hex(8), key_dir,
                words, call_file, env)


def _what(call: Any) -> str:
    fn = getattr(call, "function", call)
    return f"the call of {getattr(fn, '__qualname__', type(fn).__qualname__)}"


def app_of(p: Plan, index: int = 0, item: str | None = None, name: str | None = None) -> AppDef:
    """The app of job ``index`` of the plan (``item``: a map item's arguments, as :func:`payload.to_words`)."""
    job_dir = str(Path(p.key_dir) / str(index)) if p.key_dir else None  # made by its worker (a map's skipped
    # items leave nothing)
    o = p.options
    worker = WorkerArgs(nonce=p.nonce, dir=job_dir, state_dir=None if job_dir else o.checkpoint_dir,
                        call_file=p.call_file, index=index, item=item, tasks_per_node=o.tasks_per_node,
                        words=list(p.words))
    entrypoint, args = "python", worker.argv()
    if o.setup or o.teardown:  # the command lines are the user's own shell; the worker's words stay "$@"
        script = "\n".join(["set -e", *o.setup, "set +e", '"$@"', "_tsm_rc=$?", *o.teardown, "exit $_tsm_rc"])
        entrypoint, args = "bash", ["-c", script, "tsm-function", "python", *args]
    role = Role(
        name=p.name, image=o.image, entrypoint=entrypoint, args=args, env=dict(p.env),
        num_replicas=o.replicas, max_retries=o.max_retries, retry_policy=o.retry_policy, mounts=list(o.mounts),
    )
    if o.resource is not None:
        role.resource = o.resource
    meta = {**o.metadata, META_FUNCTION: p.name, META_RESULTS: o.results}
    return AppDef(name=name or p.name, roles=[role], metadata=meta)
