"""The program inside a tsm Ray job: gang-places one named actor per replica and runs, retries and reports them.

Run by Ray as ``python -m tsm.schedulers.ray.driver <payload module>`` (see :mod:`.request`). It asks for no
CPU itself. Steps:

1. one placement group with a bundle per replica (``SPREAD``/``PACK``); not ready within ``gang_timeout``
   -> the app FAILS with that reason (nothing started);
2. one actor :class:`Replica` per replica, named ``<app>/<role>/<k>`` in namespace ``tsm``, pinned to its
   bundle; role 0 replica 0's node address becomes every replica's ``TSM_RANK0_HOST`` (deterministic ranks);
3. each actor runs its command as a subprocess (args and env byte-exact: surrogate escapes become the
   original bytes), in a session of its own, writing its output to
   ``<ray logs>/tsm/<app>/<role>.<k>.<attempt>.log`` on its node as records ``<time> <o|e|O|E> <line>``
   (capital: the last line had no newline) -- the scheduler reads them with Ray's log API;
4. a failure is retried per the role's policy (REPLICA: that replica; ROLE: the role's; APPLICATION: all);
5. the status record ``<ray logs>/tsm/<app>/status.json`` on the driver's node is rewritten on every change.

SIGTERM (``ray job stop``) stops every replica's process group: SIGTERM, then SIGKILL after the grace
period. A watchdog per replica kills its process group if the actor dies without doing so.

Long runs (issue 25): with a ``time_limit`` the driver warns every replica's process group with
``warn_signal`` ``warn_before`` ahead of it (checked once a second), and at the limit stops them all (the
warning first if it had not gone yet) and records the app FAILED "time limit X reached"; a cancel with a
``warn_signal`` warns first and gives the replicas ``warn_before`` to end before SIGTERM. Every attempt
gets ``TSM_ATTEMPT``, ``TSM_RESTART_COUNT`` and ``TSM_LAST_EXIT`` (``failed:<code>``).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import ray as _ray

from tsm.schedulers.common.durations import format_duration
from tsm.schedulers.ray.request import NAMESPACE, DriverPayload, ReplicaSpec

#: Ray, untyped here: its stubs do not cover actor options or the internals the driver reads.
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

    def where(self) -> dict[str, Any]:
        """Node id and address, and this actor's pid."""
        ctx = ray.get_runtime_context()
        return {"node_id": ctx.get_node_id(), "node_ip": ray.util.get_node_ip_address(), "actor_pid": os.getpid()}

    def log_name(self, attempt: int) -> str:
        return f"tsm/{self.app_id}/{self.role}.{self.replica_id}.{attempt}.log"

    def start(self, command: list[str], env: dict[str, str], attempt: int) -> int:
        """Start the attempt; returns the process's pid (output pumped to the attempt's log file)."""
        path = Path(logs_dir()) / self.log_name(attempt)
        path.parent.mkdir(parents=True, exist_ok=True)
        full = dict(os.environ)
        full.update(env)
        full_b = {os.fsencode(k): os.fsencode(v) for k, v in full.items()}
        out = open(path, "ab", buffering=0)  # noqa: SIM115 (closed by the pump)
        try:
            proc = subprocess.Popen([os.fsencode(a) for a in command], env=full_b, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                                    cwd=os.getcwd())
        except OSError as e:
            out.write(f"{time.time():.6f} e tsm: cannot start {command[0]!r}: {e}\n".encode())
            out.close()
            self.proc = None
            return -1
        self.proc = proc
        self.watchdog = subprocess.Popen([sys.executable, "-c", WATCHDOG, str(os.getpid()), str(proc.pid),
                                          str(self.grace)], start_new_session=True)
        lock = threading.Lock()
        pumps = [threading.Thread(target=_pump, args=(proc.stdout, b"o", out, lock), daemon=True),
                 threading.Thread(target=_pump, args=(proc.stderr, b"e", out, lock), daemon=True)]
        for t in pumps:
            t.start()
        self.pumps = pumps
        self.out = out
        return proc.pid

    def wait(self) -> int:
        """Wait for the attempt to end; its exit code (-N: killed by signal N; -1: could not start)."""
        if self.proc is None:
            return 127
        code = self.proc.wait()
        for t in self.pumps:
            t.join()
        self.out.close()
        if self.watchdog is not None:
            self.watchdog.kill()
            self.watchdog.wait()
        return code

    def signal(self, signame: str) -> bool:
        """Send ``signame`` (``USR1``) to the running attempt's process group (the warning); False if none runs."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return False
        _signal_group(proc.pid, int(signal.Signals["SIG" + signame.removeprefix("SIG")]))
        return True

    def running(self) -> bool:
        """True while the current attempt's process runs."""
        return self.proc is not None and self.proc.poll() is None

    def stop(self, grace: float) -> None:
        """SIGTERM the process group, SIGKILL after ``grace`` seconds."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        _signal_group(proc.pid, signal.SIGTERM)
        end = time.monotonic() + grace
        while proc.poll() is None and time.monotonic() < end:
            time.sleep(0.05)
        _signal_group(proc.pid, signal.SIGKILL)


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


class Driver:
    """Runs the app of a payload; the status record is its only output the scheduler reads."""

    def __init__(self, p: DriverPayload) -> None:
        self.p = p
        self.status_path = Path(logs_dir()) / "tsm" / p.app_id / "status.json"
        self.status_path.parent.mkdir(parents=True, exist_ok=True)
        self.roles = {r.name: r for r in p.roles}
        self.reps: dict[tuple[str, int], dict[str, Any]] = {
            (r.role, r.replica_id): {"state": "PENDING", "node_ip": "", "node_id": "", "pid": None, "exit_code": None,
                                     "restarts": 0, "attempt": 0, "msg": ""}
            for r in p.replicas
        }
        self.state, self.msg, self.num_restarts = "PENDING", "", 0
        self.lock = threading.Lock()
        self.stopping = False
        #: a cancel has begun (it may be warning the replicas): nothing is retried any more
        self.cancelling = False
        self.actors: dict[tuple[str, int], Any] = {}
        #: why each replica's previous attempt ended (``TSM_LAST_EXIT``)
        self.last_exit: dict[tuple[str, int], str] = {}
        #: the warning was sent (once per app)
        self.warned = False
        #: when the time limit counts from (monotonic; set as the run starts)
        self.t0 = time.monotonic()

    def write(self) -> None:
        with self.lock:
            roles = [[r.name, [dict(self.reps[(r.name, k)], id=k) for k in range(r.num_replicas)]] for r in self.p.roles]
            data = {"app_id": self.p.app_id, "state": self.state, "msg": self.msg, "num_restarts": self.num_restarts,
                    "roles": roles, "time": time.time()}
            tmp = self.status_path.with_suffix(".tmp")
            tmp.write_text(json.dumps(data))
            tmp.replace(self.status_path)

    def run(self) -> int:
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self.t0 = time.monotonic()
        self.write()
        pg = placement_group([r.bundle for r in self.p.replicas], strategy=self.p.strategy)
        ready, _ = ray.wait([pg.ready()], timeout=self.p.gang_timeout)
        if not ready:
            self.state = "FAILED"
            self.msg = (f"gang start timed out after {self.p.gang_timeout:g}s: the cluster could not place all "
                        f"{len(self.p.replicas)} replica(s) at once ({self.p.strategy})")
            for rep in self.reps.values():
                rep["state"], rep["msg"] = "FAILED", "not placed: " + self.msg
            self.write()
            return 1
        for i, r in enumerate(self.p.replicas):
            b = r.bundle
            self.actors[(r.role, r.replica_id)] = Replica.options(  # type: ignore[attr-defined]
                name=r.actor, namespace=NAMESPACE, num_cpus=b.get("CPU", 0), num_gpus=b.get("GPU", 0),
                memory=b.get("memory") or None, max_restarts=0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=i),
            ).remote(self.p.app_id, r.role, r.replica_id, self.p.grace_period)
        where = ray.get([self.actors[(r.role, r.replica_id)].where.remote() for r in self.p.replicas])
        for r, w in zip(self.p.replicas, where, strict=True):
            self.reps[(r.role, r.replica_id)].update(node_ip=w["node_ip"], node_id=w["node_id"])
        rank0 = where[0]["node_ip"]
        self.specs = {(r.role, r.replica_id): r for r in self.p.replicas}
        self.rank0 = rank0
        self.state = "RUNNING"
        waits: dict[Any, tuple[str, int]] = {}
        for key in self.specs:
            waits[self._start(key)] = key
        self.write()
        while waits and not self.stopping:
            if self._time_limit():
                waits.clear()
                break
            done, _ = ray.wait(list(waits), num_returns=1, timeout=1.0)
            for ref in done:
                key = waits.pop(ref)
                try:
                    code = int(ray.get(ref))
                except Exception as e:  # noqa: BLE001 (the actor died: report it as the replica's failure)
                    code, self.reps[key]["msg"] = -9, f"actor died: {type(e).__name__}"
                if self.stopping:
                    break
                rep = self.reps[key]
                rep["exit_code"] = code
                if code == 0:
                    rep["state"] = "SUCCEEDED"
                    continue
                if self.cancelling:  # ended during a cancel's warning: cancelled, not a failure to retry
                    rep["state"], rep["msg"] = "CANCELLED", "cancelled"
                    continue
                rep["state"], rep["msg"] = "FAILED", rep["msg"] or f"exited with code {code}"
                role = self.roles[key[0]]
                scope = [key] if role.retry_policy == "REPLICA" else (
                    [k for k in self.specs if k[0] == key[0]] if role.retry_policy == "ROLE" else list(self.specs))
                if rep["attempt"] < role.max_retries:
                    self.num_restarts += 1
                    for k in scope:
                        if k != key and self.reps[k]["state"] == "RUNNING":
                            ray.get(self.actors[k].stop.remote(self.p.grace_period))
                            stale = [ref for ref, kk in waits.items() if kk == k]
                            for sref in stale:
                                ray.get(sref)
                                waits.pop(sref)
                    for k in scope:
                        self.last_exit[k] = f"failed:{code}"
                        self.reps[k]["restarts"] += 1
                        self.reps[k]["attempt"] += 1
                        waits[self._start(k)] = k
                    continue
                self.state = "FAILED"
                self.msg = f"role '{key[0]}' replica {key[1]} exited with code {code}"
                for k, r2 in self.reps.items():
                    if r2["state"] == "RUNNING":
                        ray.get(self.actors[k].stop.remote(self.p.grace_period))
                        r2["state"], r2["msg"] = "CANCELLED", f"stopped after role '{key[0]}' replica {key[1]} failed"
                waits.clear()
                break
            self.write()
        if self.stopping or self.cancelling:
            return 0
        if self.state != "FAILED":
            self.state = "SUCCEEDED"
        self.write()
        return 0 if self.state == "SUCCEEDED" else 1

    def _start(self, key: tuple[str, int]) -> Any:
        spec: ReplicaSpec = self.specs[key]
        rep = self.reps[key]
        env = dict(spec.env)
        env["TSM_RANK0_HOST"] = self.rank0
        env.update(TSM_ATTEMPT=str(rep["attempt"]), TSM_RESTART_COUNT=str(self.num_restarts),
                   TSM_LAST_EXIT=self.last_exit.get(key, ""))
        if "TORCHX_JOB_ID" in env:  # the runner sets TorchX's names unless torchx_env=false
            env["TORCHX_RANK0_HOST"] = self.rank0
        pid = ray.get(self.actors[key].start.remote(spec.command, env, rep["attempt"]))
        rep.update(state="RUNNING", pid=pid, exit_code=None, msg="")
        return self.actors[key].wait.remote()

    def warn(self) -> int:
        """Send the warning signal to every replica still running, once per app; how many got it."""
        if not self.p.warn_signal or self.warned:
            return 0
        self.warned = True
        with contextlib.suppress(Exception):  # an actor already gone has nothing to warn
            return sum(ray.get([a.signal.remote(self.p.warn_signal) for a in self.actors.values()], timeout=30))
        return 0

    def _time_limit(self) -> bool:
        """Warn within ``warn_before`` of the time limit; at it, stop every replica (warned first) and record
        the app FAILED "time limit X reached". True once the limit is reached."""
        limit = self.p.time_limit
        if limit is None:
            return False
        elapsed = time.monotonic() - self.t0
        if elapsed >= limit - self.p.warn_before and elapsed < limit:
            self.warn()
        if elapsed < limit:
            return False
        self.warn()
        msg = f"time limit {format_duration(limit)} reached"
        running = [k for k, r in self.reps.items() if r["state"] == "RUNNING"]
        with contextlib.suppress(Exception):  # an actor already gone has nothing to stop
            ray.get([self.actors[k].stop.remote(self.p.grace_period) for k in running],
                    timeout=self.p.grace_period + 30)
        for k in running:
            self.reps[k]["state"], self.reps[k]["msg"] = "FAILED", msg
        self.state, self.msg = "FAILED", msg
        return True

    def _wait_warned(self) -> None:
        """After a warning, wait ``warn_before`` at most for the replicas to end by themselves."""
        end = time.monotonic() + self.p.warn_before
        while time.monotonic() < end:
            try:
                if not any(ray.get([a.running.remote() for a in self.actors.values()], timeout=10)):
                    return
            except Exception:  # noqa: BLE001 (an actor gone: stop the rest now)
                return
            time.sleep(0.2)

    def stop(self) -> None:
        """``ray job stop``: warn every replica and give them ``warn_before`` (with a ``warn_signal``), then
        stop them (grace period), record CANCELLED."""
        self.cancelling = True
        if self.warn():
            self._wait_warned()
        self.stopping = True
        refs = [a.stop.remote(self.p.grace_period) for a in self.actors.values()]
        with contextlib.suppress(Exception):  # an actor already gone has nothing to stop
            ray.get(refs, timeout=self.p.grace_period + 10)
        for rep in self.reps.values():
            if rep["state"] in ("RUNNING", "PENDING"):
                rep["state"], rep["msg"] = "CANCELLED", "cancelled"
        self.state, self.msg = "CANCELLED", "cancelled"
        self.write()
        for a in self.actors.values():
            ray.kill(a)


def main(argv: list[str]) -> int:
    module = importlib.import_module(argv[0])
    payload = DriverPayload.from_json((Path(module.__file__ or "").parent / "payload.json").read_text())
    ray.init(namespace=NAMESPACE, logging_level=30, log_to_driver=False)
    driver = Driver(payload)
    done = threading.Event()

    def stop_all() -> None:
        driver.stop()
        done.set()

    def on_term(signum: int, frame: object) -> None:
        threading.Thread(target=stop_all, daemon=True).start()

    signal.signal(signal.SIGTERM, on_term)
    code = driver.run()
    if driver.stopping or driver.cancelling:
        done.wait(driver.p.grace_period + 20)
        return 0
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
