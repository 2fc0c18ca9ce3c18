"""Who gets the warning signal: the processes of a replica that handle it, and no other.

The local scheduler has always warned this way; every backend does now. A replica is often a launcher
over the program that checkpoints: ``torchrun`` (which ends at SIGUSR1, as any program without a handler
for it does) over its workers, or ``bash -c "python train.py"``. Sending the warning to the replica's
first process, or to all of its processes, ended the launcher at the warning and the app with it; a
process that handles the signal is one that asked for it. A replica none of whose processes handles it
is spared (it gets SIGTERM when the stop comes).

:func:`handlers_script` is that rule as a POSIX ``sh`` script, for the backends that reach a replica only
through a shell inside its container (Docker's ``exec``, Kubernetes' ``preStop`` hook): it reads every
process's ``SigCgt`` in ``/proc`` (the container's own processes: it runs in their PID namespace).
:func:`catches` is the same test in Python, for the backends that signal a replica's processes themselves
(the local supervisor, Ray's replica actor).
"""

from __future__ import annotations

import signal

__all__ = ["catches", "handlers_script"]


def catches(pid: int, sig: int) -> bool:
    """True when ``pid`` has a handler for ``sig`` (its bit in ``SigCgt`` of /proc/pid/status); False if gone."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


def handlers_script(signame: str) -> str:
    """A ``sh`` script sending ``signame`` (``USR1``) to every process it sees, except itself, whose signal
    mask of caught signals (``SigCgt`` in ``/proc/PID/status``) has it; it needs ``/bin/sh``, ``kill`` and
    ``/proc`` only. Exits 0 when it signalled at least one process, 1 when none handles the signal.

    The signal's number is this machine's (Linux numbers USR1, USR2, HUP, ... the same on every common
    architecture); only the mask's low 32 bits are read, which keeps the shell's arithmetic in range.
    """
    name = signame.upper().removeprefix("SIG")
    number = int(signal.Signals["SIG" + name])
    if not 1 <= number <= 32:
        raise ValueError(f"a warning signal is one of the standard signals, not {signame!r}")
    return (
        f"n=0; for d in /proc/[0-9]*; do p=${{d#/proc/}}; [ \"$p\" = $$ ] && continue; c=; "
        "while read -r k v; do [ \"$k\" = SigCgt: ] && c=$v && break; done 2>/dev/null <\"$d/status\"; "
        "c=${c#????????}; "
        f"[ -n \"$c\" ] && [ $(( 0x$c >> {number - 1} & 1 )) -eq 1 ] && kill -s {name} \"$p\" 2>/dev/null && n=1; "
        "done; [ $n = 1 ]"
    )
