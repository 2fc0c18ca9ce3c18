"""The local resource queue: what this machine has, what each running app holds, and waiting for room.

With ``-c queue=true`` an app's supervisor reserves what its roles request (CPUs, memory in MB, GPUs)
from a per-user allocation table before it starts any replica, and keeps the app PENDING until it fits.
Each GPU replica is given its own devices, disjoint across every app of the user, so eight one-GPU apps on
an eight-GPU machine run at once on different GPUs and a ninth waits for one to end.

The table is ``$TSM_HOME/local/resources.json`` (owner-only, ``0600``), read and rewritten (atomically: a
temporary file renamed over it) under an exclusive ``flock`` of ``resources.lock``. Each entry names its holder by pid and start time (see
:func:`tsm.schedulers.local._os.start_time`): an entry whose holder is gone (a supervisor killed with
SIGKILL, its watchdog too) is reclaimed by the next reservation, so a dead app never keeps its GPUs.

Waiting is an event, not a poll: a waiting supervisor owns a FIFO in ``$TSM_HOME/local/resources.wait/``
(created *before* it tries to reserve, so a release in between is never lost) and sleeps in its own
``select`` loop on it; :func:`release` writes one byte to every FIFO there. The only timed re-check is a
bounded back-off (:data:`RETRY_MIN` doubling to :data:`RETRY_MAX` seconds), which covers the one case no
event announces: a holder that died with its watchdog, whose entry is reclaimed on the next try.

The inventory is ``os.sched_getaffinity`` CPUs, ``MemTotal`` of ``/proc/meminfo`` and the GPUs of
:func:`tsm.schedulers.local.request.detect_gpus` (``CUDA_VISIBLE_DEVICES``, else ``nvidia-smi``). Tests and
people who want a smaller share set ``TSM_FAKE_GPUS`` (a count, or a comma list of ids), ``TSM_FAKE_CPUS``
and ``TSM_FAKE_MEM_MB`` instead. Standard library only: the supervisor imports it at ``python -S`` start-up.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os

from tsm.schedulers.local import _os

TYPE_CHECKING = False  # keeps typing out of the supervisor's start-up
if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping
    from typing import Any

#: First and longest delay (seconds) of the timed re-check while waiting: only a holder that died with
#: its watchdog frees resources without a wake-up, and its entry is reclaimed at the next try.
RETRY_MIN, RETRY_MAX = 2.0, 30.0

#: the GPU count an infinite request stands for (more than any machine has: refused at dry run)
UNFIT_GPUS = 1 << 30

TABLE = "resources.json"
LOCK = "resources.lock"
WAIT_DIR = "resources.wait"


def inventory(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """This machine's ``{"cpu": N, "memMB": M, "gpus": [ids]}``, the ``TSM_FAKE_*`` variables of ``environ`` winning."""
    env = os.environ if environ is None else environ
    fake_cpus, fake_mem, fake_gpus = env.get("TSM_FAKE_CPUS"), env.get("TSM_FAKE_MEM_MB"), env.get("TSM_FAKE_GPUS")
    cpu = int(fake_cpus) if fake_cpus else len(os.sched_getaffinity(0))
    if fake_mem:
        mem = int(fake_mem)
    else:
        mem = 0
        with contextlib.suppress(OSError, ValueError), open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    mem = int(line.split()[1]) // 1024
                    break
    if fake_gpus is not None:
        fake_gpus = fake_gpus.strip()
        gpus = ([str(i) for i in range(int(fake_gpus))] if fake_gpus.isdigit()
                else [g.strip() for g in fake_gpus.split(",") if g.strip()])
    else:
        from tsm.schedulers.local.request import detect_gpus

        gpus = detect_gpus()
    return {"cpu": cpu, "memMB": mem, "gpus": gpus}


def _amount(value: Any) -> float:
    """A requested amount: unset (``-1``) or negative asks nothing; NaN asks more than any machine has."""
    x = float(value)
    if math.isnan(x):
        return math.inf
    return max(x, 0.0)


def demand(roles: list[dict[str, Any]]) -> dict[str, Any]:
    """What an app asks: total ``cpu`` and ``memMB`` and one GPU count per replica, ``[(role, idx, n)]``.

    ``roles`` are the role dicts of an ``AppDef.to_dict()``; an unset resource (``-1``) asks nothing. A
    fractional GPU count takes whole GPUs (rounded up); an infinite or NaN amount never fits (see
    :func:`too_big`).
    """
    cpu = mem = 0.0
    gpus: list[list[Any]] = []
    for role in roles:
        res = role.get("resource") or {}
        n = int(role.get("num_replicas", 1))
        cpu += _amount(res.get("cpu", 0)) * n
        mem += _amount(res.get("memMB", 0)) * n
        g = _amount(res.get("gpu", 0))
        count = math.ceil(g) if math.isfinite(g) else UNFIT_GPUS
        if count:
            gpus.extend([role["name"], i, count] for i in range(n))
    return {"cpu": cpu, "memMB": mem, "gpus": gpus}


def too_big(need: dict[str, Any], inv: dict[str, Any]) -> str | None:
    """Why ``need`` can never fit this machine (it would wait forever), or None."""
    wants = {"cpu": need["cpu"], "memMB": need["memMB"], "gpus": sum(g[2] for g in need["gpus"])}
    has = {"cpu": inv["cpu"], "memMB": inv["memMB"], "gpus": len(inv["gpus"])}
    over = [f"{k} {wants[k]:g} > {has[k]:g}" for k in ("cpu", "memMB", "gpus") if wants[k] > has[k]]
    return "the app asks more than this machine has (" + ", ".join(over) + ")" if over else None


@contextlib.contextmanager
def _locked_table(home: str) -> Iterator[dict[str, Any]]:
    """The allocation table, held under an exclusive flock of ``resources.lock``; what the block leaves in it
    is written back atomically (a private temporary file renamed over the table), so a crash never tears it."""
    os.makedirs(home, mode=0o700, exist_ok=True)
    fd = os.open(os.path.join(home, LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        path = os.path.join(home, TABLE)
        try:
            with open(path, "rb") as f:
                table = json.loads(f.read() or b"{}")
        except FileNotFoundError:
            table = {}
        except ValueError:
            table = {}  # unreadable (written by hand?): holders are re-checked by the next reservations
        if not isinstance(table, dict):
            table = {}
        yield table
        tmp = f"{path}.{os.getpid()}"
        wfd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        with os.fdopen(wfd, "wb") as f:
            f.write(json.dumps(table).encode())
        os.replace(tmp, path)
    finally:
        os.close(fd)


def _alive(entry: dict[str, Any]) -> bool:
    try:
        return _os.is_alive(entry.get("pid"), entry.get("start"))
    except OSError:
        return True  # cannot tell: keep it


def reserve(home: str, app_id: str, need: dict[str, Any], inv: dict[str, Any], pid: int,
            start: int | None) -> dict[str, list[str]] | None:
    """Reserve ``need`` for ``app_id`` (held by ``pid``/``start``) if it is free now; None when it is not.

    Returns ``{"ROLE/IDX": [gpu ids]}`` for each GPU replica. Entries of dead holders are dropped first.
    Idempotent: an app that holds a reservation already gets the same GPUs back.
    """
    with _locked_table(home) as table:
        for key in [k for k, e in table.items() if k != app_id and not _alive(e)]:
            del table[key]
        if app_id in table:
            return dict(table[app_id]["gpus"])
        used_cpu = sum(e.get("cpu", 0) for e in table.values())
        used_mem = sum(e.get("memMB", 0) for e in table.values())
        taken = {g for e in table.values() for ids in e.get("gpus", {}).values() for g in ids}
        free = [g for g in inv["gpus"] if g not in taken]
        if used_cpu + need["cpu"] > inv["cpu"] or used_mem + need["memMB"] > inv["memMB"]:
            return None
        if sum(g[2] for g in need["gpus"]) > len(free):
            return None
        gpus: dict[str, list[str]] = {}
        for role, idx, n in need["gpus"]:
            gpus[f"{role}/{idx}"], free = free[:n], free[n:]
        table[app_id] = {"pid": pid, "start": start, "cpu": need["cpu"], "memMB": need["memMB"], "gpus": gpus}
        return gpus


def release(home: str, app_id: str) -> None:
    """Give back what ``app_id`` holds (nothing if it holds nothing) and wake every waiter."""
    with _locked_table(home) as table:
        had = table.pop(app_id, None)
    if had is not None:
        wake(home)


def wake(home: str) -> None:
    """Write one byte to every waiter's FIFO (a full FIFO or one nobody reads is skipped)."""
    wdir = os.path.join(home, WAIT_DIR)
    try:
        names = os.listdir(wdir)
    except OSError:
        return
    for name in names:
        try:
            fd = os.open(os.path.join(wdir, name), os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            continue  # ENXIO: its reader is gone; ENOENT: it stopped waiting
        try:
            with contextlib.suppress(OSError):  # EAGAIN: it has a wake-up pending already
                os.write(fd, b"x")
        finally:
            os.close(fd)


class Waiter:
    """One app's FIFO in the wait directory: ``fd`` becomes readable when some app releases resources."""

    def __init__(self, home: str, app_id: str) -> None:
        wdir = os.path.join(home, WAIT_DIR)
        os.makedirs(wdir, mode=0o700, exist_ok=True)
        self.path = os.path.join(wdir, app_id)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        os.mkfifo(self.path, 0o600)
        # read-write: the open does not block for a writer and the FIFO never reports end-of-file
        self.fd = os.open(self.path, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)

    def drain(self) -> None:
        """Consume the wake-ups received so far."""
        with contextlib.suppress(BlockingIOError):
            while os.read(self.fd, 4096):
                pass

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        with contextlib.suppress(OSError):
            os.close(self.fd)


def holders(home: str) -> dict[str, Any]:
    """The live entries of the table (``tsm``'s own views and tests read it)."""
    with _locked_table(home) as table:
        for key in [k for k, e in table.items() if not _alive(e)]:
            del table[key]
        return dict(table)
