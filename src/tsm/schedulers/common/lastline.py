"""The last line a replica wrote, for a stall's message: one function that every stall watcher shares.

The local supervisor imports it; the Slurm batch shell's stall watcher, which runs in the replicas' python
on a compute node where tsm need not be installed, carries this file's text inside the batch script
(:func:`tsm.schedulers.slurm.programs.bundle`). So it imports nothing but the standard library and keeps to
syntax any Python 3 reads.
"""

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

#: Bytes read from the end of each log file: a last line longer than this is cut.
TAIL_BYTES = 8192


def last_line(paths: "Sequence[str]", limit: int = 0) -> str:
    """The last non-empty line (stripped) of whichever of ``paths`` was written last, or "" when none holds one.

    ``limit`` > 0 cuts the line to that many characters. Unreadable or missing files are skipped.
    """
    best = (-1.0, "")
    for path in paths:
        try:
            with open(path, "rb") as f:
                end = f.seek(0, os.SEEK_END)
                f.seek(max(0, end - TAIL_BYTES))
                tail = f.read()
            mtime = os.stat(path).st_mtime
        except OSError:
            continue
        lines = [ln for ln in tail.decode(errors="replace").splitlines() if ln.strip()]
        if lines and mtime > best[0]:
            best = (mtime, lines[-1].strip())
    return best[1][:limit] if limit > 0 else best[1]
