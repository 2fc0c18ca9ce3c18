"""The program inside a tsm Ray job: gang-places one named actor per replica and runs, retries and reports them.

Run by Ray as ``python -m tsm.schedulers.ray.driver <payload module>`` (see :mod:`.request`). It asks for no
CPU itself. Steps:

1. one placement group with a bundle per replica (``SPREAD``/``PACK``); not ready within ``gang_timeout``
   -> the app FAILS with that reason (nothing started);
2. one actor :class:`~tsm.schedulers.ray.replica.Replica` per replica (its own small module: each replica's
   Ray worker imports it), all created at once and awaited together, named ``<app>/<role>/<k>`` in
   namespace ``tsm`` (a replica re-placed after a lost node: ``<app>/<role>/<k>#<n>``), pinned to its
   bundle; role 0 replica 0's node address becomes every replica's ``TSM_RANK0_HOST`` (deterministic ranks);
3. once every actor answers, the app is RUNNING and every replica's first attempt is started by one batch
   of calls (one round trip for the app, :meth:`Driver._start_all`; a retried scope likewise); each actor
   runs its command as a subprocess (args and env byte-exact: surrogate escapes become the
   original bytes), in a session of its own, writing its output to
   ``<ray logs>/tsm/<app>/<role>.<k>.<attempt>.log`` on its node as records ``<time> <o|e|O|E> <line>``
   (capital: the last line had no newline) -- the scheduler reads them with Ray's log API;
4. a failure is retried per the role's policy (REPLICA: that replica; ROLE: the role's; APPLICATION: all),
   spending ``max_retries``; a node lost under a replica is restarted likewise, spending ``max_preemptions``;
5. the status record ``<ray logs>/tsm/<app>/status.json`` on the driver's node is rewritten on every change.

SIGTERM (``ray job stop``) stops every replica's process group: SIGTERM, then SIGKILL after the grace
period. A watchdog per replica kills its process group if the actor dies without doing so.

Long runs (issue 25):

* **Time limit**: with a ``time_limit`` the driver warns every replica (each of its processes that handles ``warn_signal``)
  ``warn_before`` ahead of it (checked once a second), and at the limit stops them all (the warning first if
  it had not gone yet) and records the app FAILED "time limit X reached" -- or, with
  ``requeue_on_time_limit`` and ``max_preemptions`` left, restarts it whole as a preemption
  (``TSM_LAST_EXIT=time_limit``; the limit counts again). A cancel with a ``warn_signal`` warns first and
  gives the replicas ``warn_before`` to end before SIGTERM.
* **Lost nodes are preemptions**: waiting on a replica's actor raises when the actor is gone or unreachable
  (a node killed outright first shows as ``ActorUnavailableError``; Ray marks the node dead once its health
  checks fail). The driver asks the GCS, once a second for up to :data:`LOSS_WAIT`, whether the actor's node
  died (``ray.nodes()``) or the actor's death cause is its node's death (``ActorDiedErrorContext.
  node_death_info``); then the replica's scope (its role's retry policy) restarts elsewhere, spending
  ``max_preemptions`` and never ``max_retries``, with ``TSM_LAST_EXIT=preempted``; the replica's record is
  ``preempted`` with the reason. An actor dead on a live node is the replica's failure, as before. A
  replica that ends with an error while its actor's raylet is gone (the dying worker killed it and
  reported the exit first) is lost with its node too (:meth:`Driver._lost_with_node`).
* **Excluded nodes**: the lost node, a node whose kernel OOM killer ended a replica (:meth:`Driver._oom_on_node`)
  or under whose failed replica one of its GPUs became unreachable or returned new uncorrectable ECC errors
  (:meth:`Driver._gpu_on_node`; both not when it is the only alive node), and the nodes ``exclude_nodes`` names (ids, IPs, hostnames, resolved at
  each placement), are kept off by the placement groups' ``bundle_label_selector`` on the label every Ray
  node carries, ``ray.io/node-id: !in(<ids>)``. The app keeps one placement group: a whole-app restart gets
  a new one (the old removed first), a REPLICA or ROLE scope goes back into its own bundles, the lost one
  re-placed by Ray (see :meth:`Driver._place`; after an OOM kill a part of the app stays in its bundles on
  the live node, and the exclusion holds from the next whole placement); the record lists the excluded
  nodes and why.
* **Stalls**: with ``stall_timeout``, one batched call per tick reads every running replica's output bytes
  and CPU time (:meth:`Replica.progress`); none for that long: warned, stopped ``warn_before`` later, then
  restarted as its own failure (``TSM_LAST_EXIT=stalled``) or the app fails (``on_stall=fail``), both saying
  "stalled for 15m, last line: ..." (:mod:`tsm.schedulers.common.stall`'s tick and message). A stalled
  replica's end is a failure whatever its exit code (a handler may checkpoint on the warning and exit 0),
  and every new attempt starts with no stall record, whatever restarted it.

Every attempt gets ``TSM_ATTEMPT``, ``TSM_RESTART_COUNT`` and ``TSM_LAST_EXIT`` (``failed:<code>``,
``preempted``, ``time_limit``, ``stalled``).

Secrets (:mod:`.secrets`): the driver takes their values from the cluster's store as it starts (deleting
them there) and gives each replica's attempts its role's, from memory; none found fails the app at once.

What each end, stall, lost node or time limit means (retry, requeue, fail, and the words) is decided by the
lifecycle policy (:mod:`tsm.lifecycle.policy`); the driver records the events, asks it and carries out the
answer. Placement, exclusions and telling a lost node from a replica's own end are :mod:`.placement`'s.
"""

from __future__ import annotations

import contextlib
import importlib
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import ray as _ray

from tsm.lifecycle import PREEMPTED_PREFIX, policy
from tsm.schedulers.common.stall import stall_message, tick
from tsm.schedulers.ray import secrets as ray_secrets
from tsm.schedulers.ray.placement import Placement
from tsm.schedulers.ray.replica import Replica, last_line, logs_dir, session_cpu
from tsm.schedulers.ray.request import (
    NAMESPACE,
    SHORT_ID,
    DriverPayload,
    ReplicaSpec,
)

__all__ = ["Driver", "Replica", "last_line", "logs_dir", "main", "session_cpu"]

#: Ray, untyped here: its stubs do not cover actor options or the internals the driver reads.
ray: Any = _ray


def _at_limit(out: policy.Outcome) -> bool:
    """Whether the policy's ``out`` is the time limit's (a requeue, or the app's end at it)."""
    return isinstance(out, (policy.Restart, policy.Fail)) and out.time_limit


class Driver(Placement):
    """Runs the app of a payload; the status record is its only output the scheduler reads."""

    def __init__(self, p: DriverPayload, secrets: dict[str, str] | None = None) -> None:
        self.ray, self.p = ray, p
        #: the secrets' values, taken from the cluster's store as the driver started (:mod:`.secrets`): kept
        #: in memory only, and put in each replica's environment at every start
        self.secrets = dict(secrets or {})
        self.status_path = Path(logs_dir()) / "tsm" / p.app_id / "status.json"
        self.status_path.parent.mkdir(parents=True, exist_ok=True)
        self.roles = {r.name: r for r in p.roles}
        self.reps: dict[tuple[str, int], dict[str, Any]] = {
            (r.role, r.replica_id): {"state": "PENDING", "node_ip": "", "node_id": "", "pid": None, "exit_code": None,
                                     "restarts": 0, "attempt": 0, "msg": "", "preempted": False, "failures": 0,
                                     "nodes": []}
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
        #: the warning was sent (once per app); the replicas it has not reached yet (none of their processes
        #: handled it: a launcher whose program had not set its handler), tried again until the stop
        self.warned = False
        self.unwarned: set[tuple[str, int]] = set()
        #: when the time limit counts from (monotonic; set as the run starts, again at each requeue)
        self.t0 = time.monotonic()
        #: restarts spent from ``max_preemptions`` (lost nodes, requeued time limits)
        self.preemptions = 0
        #: node id -> {"node_ip", "why"}: the nodes no later placement may use
        self.excluded: dict[str, dict[str, str]] = {}
        #: the app's placement group (one bundle per replica) and each replica's bundle index in it
        self.pg: Any = None
        self.bundle: dict[tuple[str, int], int] = {}
        self.specs: dict[tuple[str, int], ReplicaSpec] = {}
        self.rank0 = ""
        #: how many placement groups the app made (each named ``tsm/<app>/<n>``: a name stays taken until its
        #: group is removed)
        self.pgs_made = 0
        #: stall detection: each running replica's last (output bytes, CPU ticks) and since when it is unchanged
        self.progress: dict[tuple[str, int], tuple[int, int]] = {}
        self.quiet_since: dict[tuple[str, int], float] = {}
        #: stalled replicas being stopped -> why ("stalled for 15m, last line: ..."), and when to stop each
        self.stalled: dict[tuple[str, int], str] = {}
        self.stall_stop_at: dict[tuple[str, int], float] = {}
        self.next_stall_check = 0.0
        #: the app's lifecycle settings as the policy reads them (:meth:`_settings`)
        self.lc_settings: policy.Settings | None = None
        #: how many times each replica was placed before (a re-placed actor is named ``<app>/<role>/<k>#<n>``:
        #: the killed actor's name may not be free yet)
        self.placed: dict[tuple[str, int], int] = {}

    def run(self) -> int:
        self.t0 = time.monotonic()
        self.specs = {(r.role, r.replica_id): r for r in self.p.replicas}
        self.rank0 = ""
        self._exclude_given()
        self.write()
        if not self._place(list(self.specs)):
            return 1
        self.state = "RUNNING"  # every replica placed: the app runs (the record says so as the starts are written)
        waits = self._start_all(list(self.specs))
        self.write()
        while waits and not self.stopping:
            if self._time_limit(waits):
                if self.state == "FAILED":
                    waits.clear()
                    break
                self.write()
                continue
            self._check_stalls()
            done, _ = ray.wait(list(waits), num_returns=1, timeout=self._tick())
            for ref in done:
                if ref not in waits:  # consumed by a restart handled earlier in this round
                    continue
                key = waits.pop(ref)
                try:
                    code = int(ray.get(ref))
                except Exception as e:  # noqa: BLE001 (the actor is gone or unreachable: find out why)
                    if self.stopping:  # a cancel killed it
                        break
                    verdict, why = self._why_gone(key, e)
                    if self.stopping:
                        break
                    if verdict == "alive":  # it was only unreachable for a while: keep waiting on it
                        waits[self.actors[key].wait.remote()] = key
                        continue
                    if verdict == "node" and not self.cancelling:
                        if not self._preempted(key, why, waits):
                            break
                        continue
                    code, self.reps[key]["msg"] = -9, f"actor died: {why}"
                else:
                    lost = None if code == 0 or self.stopping or self.cancelling else self._lost_with_node(key)
                    if self.stopping:
                        break
                    if lost is not None:
                        if not self._preempted(key, lost, waits):
                            break
                        continue
                if self.stopping or not self._ended(key, code, waits):
                    break
            self.write()
        if self.stopping or self.cancelling:
            return 0
        if self.state != "FAILED":
            self.state = "SUCCEEDED"
        self.write()
        return 0 if self.state == "SUCCEEDED" else 1

    def _ended(self, key: tuple[str, int], code: int, waits: dict[Any, tuple[str, int]]) -> bool:
        """``key``'s attempt ended with ``code``: record it and retry it (its role's policy, ``max_retries``)
        or fail the app; False when the app ended (the loop stops).

        A replica stopped for a stall failed whatever its code (a handler that checkpoints on the warning
        and exits 0 did not finish its work): ``on_stall=restart`` retries it as its own failure
        (``TSM_LAST_EXIT=stalled``), ``on_stall=fail`` fails the app "stalled for ...". One that ends during a
        cancel is CANCELLED."""
        rep = self.reps[key]
        rep["exit_code"] = code
        stall = self.stalled.pop(key, None)
        self.stall_stop_at.pop(key, None)
        if code == 0 and stall is None:
            rep["state"] = "SUCCEEDED"
            return True
        if self.cancelling:  # ended during a cancel's warning: cancelled, not a failure to retry
            rep["state"], rep["msg"] = "CANCELLED", "cancelled"
            return True
        who = f"role '{key[0]}' replica {key[1]}"
        events: list[policy.Event] = [policy.Exit(key[0], key[1], code, f"exited with code {code}", who)]
        if stall is not None:
            events.append(policy.Stalled(key[0], key[1], stall, who))
        out = self._ask(events, {key[0]: rep["failures"]})
        if _at_limit(out):
            rep["state"], rep["msg"] = "FAILED", policy.time_limit_message(self.p.time_limit or 0)
            return self._limit_now(waits)
        if isinstance(out, policy.Fail) and out.stall:
            rep["state"], rep["msg"], rep["preempted"] = "FAILED", stall, False
            self.state, self.msg = "FAILED", out.msg
            self._stop_running(f"stopped after {who} stalled")
            waits.clear()
            return False
        rep["state"], rep["msg"] = "FAILED", stall or rep["msg"] or f"exited with code {code}"
        rep["preempted"] = False
        # the node's doing (its OOM killer, its GPUs): the node is excluded and a whole-app retry moves off it
        node_fault = stall is None and (
            (code in (-signal.SIGKILL, 128 + signal.SIGKILL) and self._oom_on_node(key)) or self._gpu_on_node(key))
        scope = self._scope(key)
        if isinstance(out, policy.Restart):
            self.num_restarts += 1
            self._stop_scope(key, scope, waits)
            if node_fault and set(scope) == set(self.specs) and str(rep["node_id"]) in self.excluded:
                # the whole app restarts: a new placement group, off the node (a part of the app goes back
                # into its own bundles, which Ray does not move off a live node)
                for k in scope:
                    with contextlib.suppress(Exception):
                        ray.kill(self.actors[k])
                if not self._place(scope):
                    waits.clear()
                    return False
            for k in scope:
                self.last_exit[k] = out.cause
                self.reps[k]["failures"] += 1
                self.reps[k]["restarts"] += 1
                self.reps[k]["attempt"] += 1
            waits.update(self._start_all(scope))
            return True
        self.state = "FAILED"
        self.msg = out.msg if isinstance(out, policy.Fail) else f"{who} exited with code {code}"
        self._stop_running(f"stopped after {who} failed")
        waits.clear()
        return False

    # -- the policy ---------------------------------------------------------------------------------------
    def _settings(self) -> policy.Settings:
        """The app's lifecycle settings as the policy reads them (built on first use)."""
        if self.lc_settings is None:
            p = self.p
            self.lc_settings = policy.Settings(
                [policy.Rule(r.name, r.num_replicas, r.max_retries, r.retry_policy) for r in p.roles],
                max_preemptions=p.max_preemptions, time_limit=p.time_limit,
                requeue_on_time_limit=p.requeue_on_time_limit, warn_before=p.warn_before, warn=bool(p.warn_signal),
                stall_timeout=p.stall_timeout, on_stall=p.on_stall)
        return self.lc_settings

    def _ask(self, events: list[policy.Event], retries: dict[str, int] | None = None) -> policy.Outcome:
        """The policy's outcome for ``events``, with the preemptions spent, ``retries`` (the failed replica's
        failure restarts, by its role) and the time limit's clock (which counts from :attr:`t0`)."""
        record = policy.Record(events, policy.Spent(retries, self.preemptions), now=time.monotonic(),
                               started=self.t0, warned=self.warned)
        return policy.decide(self._settings(), record)

    def _limit_now(self, waits: dict[Any, tuple[str, int]]) -> bool:
        """An end came as the time limit was reached: the limit's (:meth:`_time_limit`); False when the app ended."""
        self._time_limit(waits)
        if self.state == "FAILED":
            waits.clear()
            return False
        return True


    def _start(self, key: tuple[str, int]) -> Any:
        """Start ``key``'s next attempt (see :meth:`_start_all`); the ref its end resolves."""
        return next(iter(self._start_all([key])))

    def _start_all(self, keys: list[tuple[str, int]]) -> dict[Any, tuple[str, int]]:
        """Start the next attempt of every replica of ``keys`` (each one's ``attempt`` and :attr:`last_exit` set
        by the caller) on its actor; ``{ref its end resolves: key}``. The start calls go out together and are
        awaited together -- one round trip for a whole app (or restart scope), not one per replica, so 32
        replicas start as fast as one. Whatever stopped a previous attempt -- its own end, a peer's retry, a
        lost node, a requeued time limit -- the new one starts with no stall record and a fresh quiet clock."""
        calls = []
        for key in keys:
            self.stalled.pop(key, None)
            self.stall_stop_at.pop(key, None)
            self.progress.pop(key, None)
            self.quiet_since[key] = time.monotonic()
            spec: ReplicaSpec = self.specs[key]
            rep = self.reps[key]
            env = dict(spec.env)
            env.update((n, self.secrets[n]) for n in spec.secrets if n in self.secrets)
            env["TSM_RANK0_HOST"] = self.rank0
            env.update(TSM_ATTEMPT=str(rep["attempt"]), TSM_RESTART_COUNT=str(self.num_restarts),
                       TSM_LAST_EXIT=self.last_exit.get(key, ""))
            if "TORCHX_JOB_ID" in env:  # the runner sets TorchX's names unless torchx_env=false
                env["TORCHX_RANK0_HOST"] = self.rank0
            calls.append(self.actors[key].start.remote(spec.command, env, rep["attempt"]))
        pids = ray.get(calls)
        waits: dict[Any, tuple[str, int]] = {}
        for key, pid in zip(keys, pids, strict=True):
            rep = self.reps[key]
            rep.update(state="RUNNING", pid=pid, exit_code=None)
            self.quiet_since[key] = time.monotonic()
            rep["nodes"] = [*rep["nodes"][:rep["attempt"]], rep["node_id"]]  # where each attempt ran (its log is there)
            if self.last_exit.get(key) not in ("preempted", "time_limit"):  # a preemption's reason stays shown
                rep.update(msg="", preempted=False)
            waits[self.actors[key].wait.remote()] = key
        return waits

    # -- stalls -----------------------------------------------------------------------------------------------
    def _tick(self) -> float:
        """Seconds the loop waits for a replica to end before it looks at the clock (and the stalls) again."""
        if self.p.stall_timeout is None:
            return 1.0
        return min(1.0, tick(self.p.stall_timeout))

    def _check_stalls(self) -> None:
        """With ``stall_timeout``: one batched call to every running replica's actor per tick (a tenth of the
        timeout, 0.2 to 30 s) reads its progress (output bytes and CPU time of its session); one with none
        for ``stall_timeout`` is stalled: warned (``warn_signal``), stopped ``warn_before`` later (at once
        without a warning), then restarted as its own failure or the app fails (``on_stall``)."""
        timeout = self.p.stall_timeout
        if timeout is None or self.cancelling:
            return
        now = time.monotonic()
        for k, at in list(self.stall_stop_at.items()):  # warned stalled replicas whose time is up
            if now >= at:
                del self.stall_stop_at[k]
                self.actors[k].stop.remote(self.p.grace_period)  # its wait ends; the loop handles the end
        if now < self.next_stall_check:
            return
        self.next_stall_check = now + tick(timeout)
        live = [k for k, r in self.reps.items() if r["state"] == "RUNNING" and k not in self.stalled]
        if not live:
            return
        try:
            got = ray.get([self.actors[k].progress.remote() for k in live], timeout=30)
        except Exception:  # noqa: BLE001 (an actor gone: its wait says why; look again next tick)
            return
        for k, (size, cpu, line) in zip(live, got, strict=True):
            if size < 0:
                continue
            if (size, cpu) != self.progress.get(k):
                self.progress[k], self.quiet_since[k] = (size, cpu), now
            elif now - self.quiet_since.get(k, now) >= timeout:
                self._stalled(k, line, timeout)

    def _stalled(self, key: tuple[str, int], line: str, timeout: float) -> None:
        """Record ``key`` stalled and start stopping it: warned first (``warn_signal``; with ``on_stall=fail``
        every replica of the app is warned, as it is about to end), stopped ``warn_before`` later."""
        why = stall_message(timeout, line)
        self.stalled[key] = why
        self.reps[key]["msg"] = why
        warned = False
        if self.p.warn_signal:
            if self.p.on_stall == "fail":
                warned = self.warn() > 0
            else:
                with contextlib.suppress(Exception):
                    warned = bool(ray.get(self.actors[key].signal.remote(self.p.warn_signal), timeout=30))
        self.stall_stop_at[key] = time.monotonic() + (self.p.warn_before if warned else 0.0)
        self.write()


    def _scope(self, key: tuple[str, int]) -> list[tuple[str, int]]:
        """The replicas a restart of ``key`` restarts, by its role's retry policy."""
        policy = self.roles[key[0]].retry_policy
        if policy == "REPLICA":
            return [key]
        return [k for k in self.specs if k[0] == key[0]] if policy == "ROLE" else list(self.specs)

    def _stop_scope(self, key: tuple[str, int], scope: list[tuple[str, int]], waits: dict[Any, tuple[str, int]]) -> None:
        """Stop the running replicas of ``scope`` other than ``key`` and drop their pending waits."""
        for k in scope:
            if k != key and self.reps[k]["state"] == "RUNNING":
                with contextlib.suppress(Exception):  # lost with the same node: nothing to stop
                    ray.get(self.actors[k].stop.remote(self.p.grace_period), timeout=self.p.grace_period + 30)
            for sref in [ref for ref, kk in waits.items() if kk == k]:
                with contextlib.suppress(Exception):
                    ray.get(sref, timeout=30)
                waits.pop(sref)


    def _preempted(self, key: tuple[str, int], why: str, waits: dict[Any, tuple[str, int]]) -> bool:
        """``key``'s actor was lost with its node: exclude the node and restart its scope (its role's retry
        policy) elsewhere, spending ``max_preemptions`` (never ``max_retries``); past the budget the app
        FAILS. False when the app ended."""
        rep = self.reps[key]
        node_id = str(rep["node_id"])
        self.excluded.setdefault(node_id, {
            "node_ip": str(rep["node_ip"]), "why": f"lost under role '{key[0]}' replica {key[1]} (attempt {rep['attempt']})"})
        scope = self._scope(key)
        budget = self.p.max_preemptions
        who = f"role '{key[0]}' replica {key[1]}"
        out = self._ask([policy.Lost(key[0], key[1], PREEMPTED_PREFIX + why, who)])
        if _at_limit(out):
            rep.update(state="FAILED", msg=PREEMPTED_PREFIX + why, preempted=True, exit_code=None)
            return self._limit_now(waits)
        if not isinstance(out, policy.Restart):
            text = policy.budget_spent(PREEMPTED_PREFIX + why, budget)
            rep.update(state="FAILED", msg=text, preempted=True, exit_code=None)
            self.state, self.msg = "FAILED", out.msg if isinstance(out, policy.Fail) else f"{who} {text}"
            self._stop_running(f"stopped after {who} was lost with its node")
            waits.clear()
            self.write()
            return False
        self.preemptions += 1
        self.num_restarts += 1
        self._stop_scope(key, scope, waits)
        text = out.note
        for k in scope:
            with contextlib.suppress(Exception):
                ray.kill(self.actors[k])
            self.reps[k].update(msg=text if k == key else f"{PREEMPTED_PREFIX}restarted with role '{key[0]}' "
                                f"replica {key[1]}, whose node {node_id[:SHORT_ID]} ({rep['node_ip']}) was lost",
                                preempted=True, exit_code=None, state="PENDING")
        self.write()
        if not self._place(scope):
            waits.clear()
            return False
        for k in scope:
            self.last_exit[k] = "preempted"
            self.reps[k]["restarts"] += 1
            self.reps[k]["attempt"] += 1
        waits.update(self._start_all(scope))
        self.write()
        return True

    def warn(self) -> int:
        """Send the warning signal to every replica still running, once per replica: a replica none of whose
        processes handles it yet is tried again at the next call (each tick until the stop). How many got it."""
        if not self.p.warn_signal:
            return 0
        if not self.warned:
            self.warned, self.unwarned = True, set(self.actors)
        keys = [k for k in self.unwarned if k in self.actors]
        with contextlib.suppress(Exception):  # an actor already gone has nothing to warn
            got = ray.get([self.actors[k].signal.remote(self.p.warn_signal) for k in keys], timeout=30) if keys else []
            self.unwarned.difference_update(k for k, ok in zip(keys, got, strict=True) if ok)
            return sum(got)
        return 0

    def _time_limit(self, waits: dict[Any, tuple[str, int]]) -> bool:
        """Warn within ``warn_before`` of the time limit; at it, stop every replica (warned first) and either
        record the app FAILED "time limit X reached" or, with ``requeue_on_time_limit`` and ``max_preemptions``
        left, restart it whole as a preemption (``TSM_LAST_EXIT=time_limit``; the limit counts again). True
        once the limit is reached (the app FAILED, or restarted with fresh ``waits``)."""
        if self.p.time_limit is None:
            return False
        out = self._ask([])
        if isinstance(out, policy.Warn) or self.unwarned or _at_limit(out):  # at the limit: warned before the stop
            self.warn()
        if not _at_limit(out):
            return False
        running = [k for k, r in self.reps.items() if r["state"] == "RUNNING"]
        with contextlib.suppress(Exception):  # an actor already gone has nothing to stop
            ray.get([self.actors[k].stop.remote(self.p.grace_period) for k in running],
                    timeout=self.p.grace_period + 30)
        if isinstance(out, policy.Restart) and not self.cancelling:
            for ref in list(waits):  # the stopped attempts' ends
                with contextlib.suppress(Exception):
                    ray.get(ref, timeout=30)
            waits.clear()
            self.preemptions += 1
            self.num_restarts += 1
            for k, r in self.reps.items():
                self.last_exit[k] = out.cause
                r.update(msg=out.note, preempted=True, restarts=r["restarts"] + 1, attempt=r["attempt"] + 1)
            self.t0, self.warned, self.unwarned = time.monotonic(), False, set()
            waits.update(self._start_all(list(self.specs)))
            return True
        msg = out.msg if isinstance(out, policy.Fail) else policy.time_limit_message(self.p.time_limit)
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
    values = ray_secrets.take(payload.secrets_uri) if payload.secrets_uri else {}
    driver = Driver(payload, values)
    if values is None:  # nothing to give the replicas: the app fails before any is placed
        driver._unplaced(list(driver.reps), ray_secrets.MISSING)
        return 1
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
