"""A function job's directory, where its replicas share this machine's files (local, Slurm on a shared FS).

::

    $TSM_HOME/functions/<key>/          0700, one per submit() or map()
        call                            the pickled call, when it is too big to ride in the app's arguments
        <index>/                        one per job (a map: one per item), the worker's ``--dir``
            result.<rank>               each replica's outcome (written whole: a temporary file renamed)
            checkpoint.<rank>           the call a warned Checkpointable asked the next attempt to run

``tsm rm`` of a job removes its ``<index>/`` folder, and ``<key>/`` with it once no job of it is left
(:func:`forget`, called by the runner as it removes an app). Only folders under ``$TSM_HOME/functions`` are
ever removed: the path comes from the app definition, which is not trusted to point elsewhere.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

TYPE_CHECKING = False
if TYPE_CHECKING:  # the replicas' worker imports this module: it stays light
    from tsm.specs.api import AppDef

CALL = "call"


def root() -> Path:
    """``$TSM_HOME/functions``."""
    from tsm.store import tsm_home

    return Path(tsm_home()) / "functions"


def new_key_dir() -> Path:
    """A new, private ``$TSM_HOME/functions/<key>/``."""
    base = root()
    base.mkdir(mode=0o700, parents=True, exist_ok=True)
    while True:
        path = base / os.urandom(8).hex()
        try:
            path.mkdir(mode=0o700)
            return path
        except FileExistsError:
            continue


def result_path(job_dir: str | Path, rank: int) -> Path:
    return Path(job_dir) / f"result.{rank}"


def checkpoint_path(job_dir: str | Path, rank: int) -> Path:
    return Path(job_dir) / f"checkpoint.{rank}"


def write_whole(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that a reader sees all of it or nothing (0600, renamed into place); its
    folder is made (0700) if only it is missing: a job's folder is made by the first replica that writes."""
    from tsm.schedulers.common.files import write_atomic

    path.parent.mkdir(mode=0o700, exist_ok=True)
    write_atomic(path, data)


def read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def _inside_root(path: Path) -> bool:
    try:
        resolved = path.resolve()
        return resolved.parent.parent == root().resolve() and resolved.name.isdigit()
    except OSError:
        return False


def remove_job_dir(job_dir: str) -> None:
    """Remove one job's folder (``<key>/<index>``), and ``<key>/`` once it holds no job's folder any more."""
    path = Path(job_dir)
    if not _inside_root(path):
        return
    path = path.resolve()
    shutil.rmtree(path, ignore_errors=True)
    key = path.parent
    try:
        left = [e for e in os.listdir(key) if e.isdigit()]
    except FileNotFoundError:
        return
    if not left:
        shutil.rmtree(key, ignore_errors=True)


def forget(app: AppDef | None) -> None:
    """Remove what the function jobs of ``app`` left in their directory; for any other app: nothing."""
    from tsm.functions.spec import is_worker, parse

    for role in app.roles if app is not None else ():
        if not is_worker(role.args):
            continue
        try:
            spec = parse(role.args)
        except ValueError:
            continue
        if spec.dir:
            remove_job_dir(spec.dir)
