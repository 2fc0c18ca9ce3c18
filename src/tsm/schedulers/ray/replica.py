"""The replica actor of a tsm Ray job: runs one replica's command as a subprocess, attempt after attempt.

Its own module, importing nothing but the standard library, Ray and tsm's small :mod:`~tsm.schedulers.common.stall`
constants, because every replica's Ray worker imports the module of its actor class when the actor is
created -- from the job's ``py_modules``, where no bytecode is shipped, so compiled from source in each
worker. The driver's module (:mod:`.driver`: the placement, retries, the status record, the request's
types) cost each worker ~37 ms of CPU that way, this module ~7 ms; on a small head that starts 32 workers at
once, that time is paid before the last replica runs (docs/perf.md, "Ray: submit to every replica running").

:class:`Replica` writes each attempt's output to ``<ray logs>/tsm/<app>/<role>.<k>.<attempt>.log`` on its
node as records ``<time> <o|e|O|E> <line>`` (capital: the last line had no newline), runs a watchdog that
kills the attempt's process group if the actor dies without doing so, and answers the driver's calls
(start, wait, signal, progress, stop). :mod:`.driver` re-exports the names it had before.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import ray as _ray

from tsm.schedulers.common.gpu_health import gpu_fault, gpu_health
from tsm.schedulers.common.stall import QUOTE_MAX
from tsm.schedulers.common.warn import catches

#: Ray, untyped here: its stubs do not cover actor options or the internals read here.
ray: Any = _ray

# Kills the replica's process group when the actor (its parent) is gone: argv = actor pid, pgid, grace.
WATCHDOG = (
    "import os, signal, sys, time\n"
    "parent, pgid, grace = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "while os.getppid() == parent:\n"
    "    time.sleep(0.2)\n"
    "def alive():\n"
    "    try:\n"
    "        os.killpg(pgid, 0); return True\n"
    "    except OSError:\n"
    "        return False\n"
    "if alive():\n"
    "    os.killpg(pgid, signal.SIGTERM)\n"
    "    end = time.monotonic() + grace\n"
    "    while alive() and time.monotonic() < end:\n"
    "        time.sleep(0.1)\n"
    "    if alive():\n"
    "        os.killpg(pgid, signal.SIGKILL)\n"
)


def logs_dir() -> str:
    """This node's Ray log directory (what Ray's log API serves files from)."""
    return str(ray._private.worker.global_worker.node.get_logs_dir_path())


@ray.remote(num_cpus=0, max_concurrency=4)
class Replica:
    """One replica: runs its command as a subprocess, attempt after attempt, and can stop it."""

    def __init__(self, app_id: str, role: str, replica_id: int, grace: float) -> None:
        self.app_id, self.role, self.replica_id, self.grace = app_id, role, replica_id, grace
        self.proc: subprocess.Popen[bytes] | None = None
        self.watchdog: subprocess.Popen[bytes] | None = None
        self.stopped = False
        self.stopping = False  # tsm is stopping the current attempt (its SIGKILL is not the OOM killer's)
        self.oom_at_start = self.oom_at_end = 0  # the node's OOM kills when the current attempt started, ended
        self.gpu_at_start: int | str | None = None  # the node's GPUs as the attempt started (gpu_health.py)
        self.gpu_why = ""  # why the last attempt's failure points at the node's GPUs ("": it does not)
        self.gpu_path: str | None = None  # the PATH nvidia-smi is looked up on: the replica's
        self.raylet = os.getppid()  # Ray workers are the raylet's children: a new parent means the node is gone
        self.environment: dict[str, Any] | None = None  # the lockfile environment ready on this node (.envs)

    def where(self) -> dict[str, Any]:
        """Node id and address, and this actor's pid."""
        ctx = ray.get_runtime_context()
        return {"node_id": ctx.get_node_id(), "node_ip": ray.util.get_node_ip_address(), "actor_pid": os.getpid()}

    def prepare_env(self, data: dict[str, Any]) -> dict[str, Any]:
        """Make the role's lockfile environment ready on this node (built once per node: :mod:`.envs`); what
        :func:`~tsm.schedulers.ray.envs.build_here` answers. Every later attempt runs in it."""
        from tsm.schedulers.ray.envs import build_here

        out = build_here(data)
        self.environment = None if out.get("error") else out
        return out

    def log_name(self, attempt: int) -> str:
        return f"tsm/{self.app_id}/{self.role}.{self.replica_id}.{attempt}.log"

    def start(self, command: list[str], env: dict[str, str], attempt: int) -> int:
        """Start the attempt; returns the process's pid (output pumped to the attempt's log file)."""
        path = Path(logs_dir()) / self.log_name(attempt)
        path.parent.mkdir(parents=True, exist_ok=True)
        full = dict(os.environ)
        full.update(env)
        if self.environment is not None:
            from tsm.schedulers.ray.envs import replica_env

            replica_env(full, env, self.environment)
        full_b = {os.fsencode(k): os.fsencode(v) for k, v in full.items()}
        self.stopping, self.oom_at_start, self.gpu_why = False, node_oom_kills(), ""
        # a replica given GPUs: their health now, to tell a failure the node's GPUs caused (one nvidia-smi)
        self.gpu_path = full.get("PATH")
        self.gpu_at_start = gpu_health(self.gpu_path) if ray.get_gpu_ids() else None
        out = open(path, "ab", buffering=0)  # noqa: SIM115 (closed by the pump)
        # The replica inherits the mask of the thread that starts it, and Ray's threads block SIGHUP: unblock
        # every signal in this thread for the start, so the program sees every signal it is sent
        mask = signal.pthread_sigmask(signal.SIG_SETMASK, ())
        try:
            proc = subprocess.Popen([os.fsencode(a) for a in command], env=full_b, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                                    cwd=os.getcwd())
        except OSError as e:
            out.write(f"{time.time():.6f} e tsm: cannot start {command[0]!r}: {e}\n".encode())
            out.close()
            self.proc = None
            return -1
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        self.proc = proc
        self.watchdog = subprocess.Popen([sys.executable, "-I", "-S", "-c", WATCHDOG, str(os.getpid()), str(proc.pid),
                                          str(self.grace)], start_new_session=True)
        lock = threading.Lock()
        pumps = [threading.Thread(target=_pump, args=(proc.stdout, b"o", out, lock), daemon=True),
                 threading.Thread(target=_pump, args=(proc.stderr, b"e", out, lock), daemon=True)]
        for t in pumps:
            t.start()
        self.pumps = pumps
        self.out = out
        self.path = path
        return proc.pid

    def wait(self) -> int:
        """Wait for the attempt to end; its exit code (-N: killed by signal N; -1: could not start)."""
        if self.proc is None:
            return 127
        code = self.proc.wait()
        self.oom_at_end = node_oom_kills()  # read at the end: a later OOM elsewhere on the node is not this one
        if code != 0 and not self.stopping and self.gpu_at_start is not None:
            self.gpu_why = gpu_fault(self.gpu_at_start, gpu_health(self.gpu_path))
        for t in self.pumps:
            t.join()
        self.out.close()
        if self.watchdog is not None:
            self.watchdog.kill()
            self.watchdog.wait()
        return code

    def signal(self, signame: str) -> bool:
        """Send the warning ``signame`` (``USR1``) to each process of the running attempt that handles it
        (:func:`signal_handlers`); False when none runs or none handles it."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return False
        return signal_handlers(proc.pid, int(signal.Signals["SIG" + signame.removeprefix("SIG")]))

    def progress(self) -> tuple[int, int, str]:
        """The running attempt's progress: bytes of output so far, CPU ticks of its session (its process and
        every process it started), and its last output line; ``(-1, -1, "")`` when no attempt runs."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return -1, -1, ""
        try:
            size = os.path.getsize(self.path)
        except OSError:
            size = 0
        return size, session_cpu(proc.pid), last_line(self.path)

    def running(self) -> bool:
        """True while the current attempt's process runs."""
        return self.proc is not None and self.proc.poll() is None

    def node_alive(self) -> bool:
        """Whether this node's raylet is still this actor's parent. When a node dies its workers outlive the
        raylet for a moment, and kill their children (the replica, with SIGKILL) as they exit: an exit they
        may still report. A new parent (the raylet gone) tells the driver that exit was the node's end."""
        return os.getppid() == self.raylet

    def oom_killed(self) -> bool:
        """Whether the kernel's OOM killer ended the last attempt: SIGKILL (or a shell's 137), not from tsm's stop,
        while the node's OOM kill count (``/proc/vmstat`` ``oom_kill``) rose. Replicas have no memory limit of their own on Ray,
        so such a kill is the node's memory running out (shared with other work, or Ray's own processes)."""
        proc = self.proc
        # -9: the replica's process itself; 137: a shell under which the OOM killer ended the program
        return (proc is not None and proc.returncode in (-signal.SIGKILL, 128 + signal.SIGKILL)
                and not self.stopping and self.oom_at_end > self.oom_at_start)

    def gpu_fault(self) -> str:
        """Why the last attempt's failure points at this node's GPUs (one became unreachable, or their
        uncorrectable ECC errors rose while it ran: :mod:`tsm.schedulers.common.gpu_health`); "" when not."""
        return self.gpu_why

    def stop(self, grace: float) -> None:
        """SIGTERM the process group, SIGKILL after ``grace`` seconds."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        self.stopping = True
        _signal_group(proc.pid, signal.SIGTERM)
        end = time.monotonic() + grace
        while proc.poll() is None and time.monotonic() < end:
            time.sleep(0.05)
        _signal_group(proc.pid, signal.SIGKILL)


def node_oom_kills() -> int:
    """How many processes this node's kernel OOM killer has killed since boot (0 where Linux does not say)."""
    try:
        with open("/proc/vmstat", "rb") as f:
            for line in f:
                if line.startswith(b"oom_kill "):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def signal_handlers(pid: int, sig: int) -> bool:
    """Send ``sig`` to ``pid`` and each of its descendants that handles it (its ``SigCgt`` in ``/proc``);
    True when one did. The warning's rule on every backend (:mod:`tsm.schedulers.common.warn`): a launcher
    over the program (``torchrun``, a ``bash -c`` wrapper) ends at a signal it does not handle. Descendants,
    not the session: ``torchrun`` starts each worker in a session of its own."""
    kids: dict[int, list[int]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return False
    for name in names:
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    data = f.read()
                kids.setdefault(int(data[data.rindex(b")") + 2:].split()[1]), []).append(int(name))
            except (OSError, ValueError, IndexError):  # gone meanwhile
                continue
    tree, todo = [pid], [pid]
    while todo:
        found = kids.get(todo.pop(), [])
        tree += found
        todo += found
    sent = False
    for p in tree:
        if catches(p, sig):
            with contextlib.suppress(OSError):  # gone meanwhile
                os.kill(p, sig)
                sent = True
    return sent


def session_cpu(sid: int) -> int:
    """CPU time (clock ticks) of every live process of session ``sid`` (a replica leads a session of its
    own), from one pass over ``/proc``; 0 where there is no ``/proc``.

    The same measure as the local supervisor's (``cpu_by_session``): each process's ``utime + stime`` and
    its reaped children's ``cutime + cstime``. Counting the reaped children keeps the sum from dropping when a
    child of the replica ends (its time moves into its parent's ``cutime``), so a child's exit alone is no
    progress and a replica whose work is done by short-lived children (a shell loop) still counts their CPU.
    A child not yet reaped still counts with its own fields; one whose parent is gone counts nowhere (it
    was the session's, so the sum changes: counted as progress, which errs on the side of not stalling).
    A copy, not an import of the local backend's private ``_os`` (the driver depends on no other backend);
    ``tests/schedulers/ray/test_ray_driver.py`` checks the two count the same."""
    total = 0
    try:
        names = os.listdir("/proc")
    except OSError:
        return 0
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                data = f.read()
            fields = data[data.rindex(b")") + 2:].split()
            if int(fields[3]) == sid:
                total += sum(int(x) for x in fields[11:15])
        except (OSError, ValueError, IndexError):
            continue
    return total


def last_line(path: str | Path, limit: int = QUOTE_MAX) -> str:
    """The last non-empty line an attempt wrote (either stream), from its log file's records; "" for none."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - 8192))
            tail = f.read()
    except OSError:
        return ""
    for rec in reversed(tail.split(b"\n")):
        parts = rec.split(b" ", 2)
        if len(parts) == 3 and parts[1] in (b"o", b"e", b"O", b"E") and parts[2].strip():
            return parts[2].decode(errors="replace").rstrip()[:limit]
    return ""


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(OSError):  # the group has ended
        os.killpg(pgid, sig)


def _pump(pipe: Any, tag: bytes, out: Any, lock: threading.Lock) -> None:
    for line in iter(pipe.readline, b""):
        if line.endswith(b"\n"):
            rec = b"%.6f %s %s" % (time.time(), tag, line)
        else:
            rec = b"%.6f %s %s\n" % (time.time(), tag.upper(), line)
        with lock:
            out.write(rec)
    pipe.close()


