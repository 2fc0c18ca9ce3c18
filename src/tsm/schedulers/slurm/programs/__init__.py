"""The programs tsm runs on the cluster, kept as files of their own so that they are linted and tested alone.

Bash, for every task and the batch shell: ``replica.sh`` (the wrapper each task runs), ``wait.sh`` (the batch
script's wait loop); ``longrun.sh`` (the batch script's long-run part). POSIX sh, run by a :class:`~..host.Host`
(here, or on a login node over SSH): ``submit.sh``, ``find.sh``, ``files.sh``, ``warn.sh``, ``remove.sh``,
``ws_check.sh``. Python that runs where tsm need not be installed: ``stall_watch.py`` (beside the sruns, in the
replicas' python), ``ws_build.py`` (a workspace's store on a login node). A batch script carries the texts it
runs (the dry run is the whole truth); the host programs are given to ``sh -c`` / ``python3 -c``.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

_HERE = Path(__file__).parent

#: A line of a program that :func:`bundle` replaces with the source of the module it imports.
_BUNDLED = re.compile(r"^from (tsm(?:\.\w+)+) import \w+  # bundled$", re.M)


@functools.cache
def text(name: str) -> str:
    """The text of program ``name`` (``"replica.sh"``), read once per process."""
    return (_HERE / name).read_text(encoding="utf-8")


@functools.cache
def bundle(name: str) -> str:
    """Program ``name`` with each ``from tsm.x import y  # bundled`` line replaced by module ``tsm.x``'s text.

    For Python run where tsm is not installed (the stall watcher): the module it shares with tsm (one that
    imports only the standard library) travels inside it.
    """

    def source(m: re.Match[str]) -> str:
        module = Path(__file__).parents[3].joinpath(*m.group(1).split(".")[1:]).with_suffix(".py")
        return module.read_text(encoding="utf-8").rstrip("\n")

    return _BUNDLED.sub(source, text(name))
