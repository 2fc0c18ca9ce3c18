"""What a caller passes on to its replicas besides its environment, so that a forked supervisor gives them the same.

A supervisor spawned by its caller inherits the caller's credentials (uids, primary and supplementary
groups, capabilities), limits, scheduling (CPU set, nice value, policy, I/O priority), personality, cgroup,
namespaces and umask, and so do the replicas it starts. One forked by the launcher inherits the
launcher's instead. So a standby compares the caller's with its own (:func:`context` of each) and serves
only a caller whose settings are the same as its own; any other caller spawns its supervisor itself. The
one setting that always differs, the umask (every supervisor works under 077 to keep tsm's files
private), is not compared but carried: the caller's (:func:`umask_of`) is what each replica starts with,
however its supervisor was started.

Read from ``/proc`` (the caller's personality is the one value another process may not read, under Yama's
ptrace restrictions: the caller sends its own, :func:`own_personality`).
"""

from __future__ import annotations

import contextlib
import os

from tsm.schedulers.local._os import read_proc

#: Lines of ``/proc/<pid>/status`` a spawned supervisor (and so every replica) would inherit from its caller.
STATUS_KEYS = (b"Uid:", b"Gid:", b"Groups:", b"Cpus_allowed_list:", b"Mems_allowed_list:", b"NoNewPrivs:",
               b"Seccomp:", b"CapInh:", b"CapPrm:", b"CapEff:", b"CapBnd:", b"CapAmb:")
NAMESPACES = ("cgroup", "ipc", "mnt", "net", "pid", "user", "uts")

#: ``ioprio_get``'s system call number by machine (it has no wrapper in libc or Python).
_IOPRIO_GET = {"x86_64": 252, "i386": 290, "i686": 290, "aarch64": 31, "riscv64": 31, "loongarch64": 31,
               "armv7l": 315, "armv6l": 315, "ppc64le": 274, "ppc64": 274, "s390x": 283}
_IOPRIO_WHO_PROCESS = 1


def ioprio(pid: int) -> int:
    """The I/O scheduling class and level of ``pid`` (``ionice``'s), as the kernel encodes them.

    Raises OSError when it cannot be read (an unknown machine, the process gone): the caller then spawns.
    """
    nr = _IOPRIO_GET.get(os.uname().machine)
    if nr is None:
        raise OSError(f"ioprio_get: unknown system call number on {os.uname().machine}")
    from tsm.schedulers.local import _os

    value = int(_os._lib().syscall(nr, _IOPRIO_WHO_PROCESS, pid))
    if value < 0:
        raise OSError(_os._errno(), "ioprio_get failed")
    return value


def own_personality() -> bytes:
    """This process's execution domain flags (``setarch -R`` and the like), as ``/proc/self/personality`` has it."""
    return read_proc("/proc/self/personality").strip()


def context(pid: int) -> tuple[object, ...]:
    """What ``pid`` passes on to a child besides its environment, open-file limit and umask, as comparable data.

    A forked supervisor inherits these from the launcher, not from the caller that asked for it; the launcher
    serves a caller only when they are the same as its own, so ``taskset``/``numactl``, a Slurm job's or a
    systemd scope's cgroup, ``sg``/``newgrp``, ``nice``, ``chrt``, ``ionice``, other rlimits, supplementary
    groups, capabilities, seccomp and namespaces of the caller are kept exactly as if it had spawned the
    supervisor itself. Raises OSError when the process is gone or unreadable (the caller then spawns).
    """
    proc = f"/proc/{pid}/"
    status = tuple(ln for ln in read_proc(proc + "status").splitlines() if ln.startswith(STATUS_KEYS))
    # every rlimit but the open-file one, which is sent along
    limits = tuple(ln for ln in read_proc(proc + "limits").splitlines() if not ln.startswith(b"Max open files"))
    ns = []
    for n in NAMESPACES:
        with contextlib.suppress(FileNotFoundError):  # a namespace type this kernel lacks
            ns.append(os.readlink(f"{proc}ns/{n}"))
    return (status, read_proc(proc + "cgroup"), limits, read_proc(proc + "oom_score_adj"), tuple(ns),
            os.getpriority(os.PRIO_PROCESS, pid), os.sched_getscheduler(pid), os.sched_getparam(pid).sched_priority,
            ioprio(pid))


def umask_of(pid: int) -> int:
    """The umask of ``pid`` (``/proc/<pid>/status``); raises OSError when the kernel does not say (before 4.7)."""
    for line in read_proc(f"/proc/{pid}/status").splitlines():
        if line.startswith(b"Umask:"):
            return int(line.split()[1], 8)
    raise OSError("no Umask line in /proc/<pid>/status")
