"""Where a Ray app's replicas run, and whether a replica's node is gone: the driver's placement half.

:class:`Placement` is the part of :class:`~tsm.schedulers.ray.driver.Driver` that talks to Ray about nodes:
one placement group per app (a bundle per replica, off the excluded nodes), one named actor per replica
pinned to its bundle, the nodes excluded (given, lost, or found bad by an OOM kill or a GPU fault), and
what a replica's end says about its node (:meth:`Placement._why_gone`: lost with the node, only
unreachable, or dead on a live node). What an end *means* for the app is the lifecycle policy's
(:mod:`tsm.lifecycle.policy`), asked by the driver. The driver's module docstring describes the whole.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from pathlib import Path
from typing import Any

from tsm.schedulers.common.durations import format_duration
from tsm.schedulers.ray.replica import Replica
from tsm.schedulers.ray.request import (
    NAMESPACE,
    SHORT_ID,
    DriverPayload,
    ReplicaSpec,
    exclusion_selector,
    node_matches,
)

__all__ = ["LOSS_WAIT", "Placement"]

#: Seconds the driver asks Ray, once a second, whether an unreachable replica's node died or its actor is back.
LOSS_WAIT = 60.0


def _actor_info(ray: Any, actor: Any) -> dict[str, Any]:
    """The GCS's record of an actor (``State``, ``DeathCause``...); {} when it cannot be read."""
    try:
        info = ray._private.state.actors(actor._actor_id.hex())
    except Exception:  # noqa: BLE001 (the GCS busy: ask again)
        return {}
    return info if isinstance(info, dict) else {}


def _death_cause(cause: Any) -> tuple[bool, str]:
    """An actor's death cause (Ray's ``ActorDeathCause``): whether its node died, and Ray's words for it."""
    if cause is None:
        return False, ""
    try:
        which = cause.WhichOneof("context")
    except (AttributeError, ValueError):
        return False, str(cause)
    if which != "actor_died_error_context":
        return False, " ".join(str(getattr(cause, which, "") or which or "").split())[:300]
    ctx = cause.actor_died_error_context
    node_died = bool(ctx.HasField("node_death_info") and ctx.node_death_info.reason != 0)
    text = " ".join(str(ctx.error_message).split())[:300]
    return node_died, text


class Placement:
    """Placement, exclusions and lost nodes for the driver (which sets every attribute below)."""

    #: Ray itself (the driver's module-level handle, so a test's fake reaches every call)
    ray: Any
    p: DriverPayload
    status_path: Path
    lock: threading.Lock
    state: str
    msg: str
    num_restarts: int
    preemptions: int
    reps: dict[tuple[str, int], dict[str, Any]]
    specs: dict[tuple[str, int], ReplicaSpec]
    actors: dict[tuple[str, int], Any]
    excluded: dict[str, dict[str, str]]
    pg: Any
    bundle: dict[tuple[str, int], int]
    rank0: str
    pgs_made: int
    placed: dict[tuple[str, int], int]

    def write(self) -> None:
        """Rewrite the status record (``status.json``) the scheduler reads, atomically."""
        with self.lock:
            roles = [[r.name, [dict(self.reps[(r.name, k)], id=k) for k in range(r.num_replicas)]] for r in self.p.roles]
            data = {"app_id": self.p.app_id, "state": self.state, "msg": self.msg, "num_restarts": self.num_restarts,
                    "preemptions": self.preemptions, "max_preemptions": self.p.max_preemptions,
                    "excluded": [dict(v, node_id=k) for k, v in self.excluded.items()],
                    "roles": roles, "time": time.time()}
            tmp = self.status_path.with_suffix(".tmp")
            tmp.write_text(json.dumps(data))
            tmp.replace(self.status_path)

    def _oom_on_node(self, key: tuple[str, int]) -> bool:
        """Whether the kernel's OOM killer ended ``key``'s attempt (its actor says, :meth:`Replica.oom_killed`);
        if so the replica's message says it and the node is excluded (:meth:`_exclude_for`)."""
        if not self._ask_actor(key, "oom_killed"):
            return False
        rep = self.reps[key]
        self._exclude_for(key, f"killed by the kernel's OOM killer on {self._where(key)}",
                          f"the kernel's OOM killer ended role '{key[0]}' replica {key[1]} (attempt {rep['attempt']})")
        return True

    def _gpu_on_node(self, key: tuple[str, int]) -> bool:
        """Whether ``key``'s failed attempt points at its node's GPUs (its actor says, :meth:`Replica.gpu_fault`:
        one became unreachable or their uncorrectable ECC errors rose while it ran); if so the node is excluded
        as after an OOM kill."""
        why = str(self._ask_actor(key, "gpu_fault") or "")
        if not why:
            return False
        rep = self.reps[key]
        self._exclude_for(key, f"a GPU fault on {self._where(key)}: {why}",
                          f"a GPU fault under role '{key[0]}' replica {key[1]} (attempt {rep['attempt']}): {why}")
        return True

    def _ask_actor(self, key: tuple[str, int], method: str) -> Any:
        """``key``'s actor's answer to ``method()``; None when the actor is gone (it cannot tell, and the end
        stays as it was)."""
        try:
            return self.ray.get(getattr(self.actors[key], method).remote(), timeout=30)
        except Exception:  # noqa: BLE001
            return None

    def _where(self, key: tuple[str, int]) -> str:
        rep = self.reps[key]
        return f"node {str(rep['node_id'])[:SHORT_ID]} ({rep['node_ip']})"

    def _exclude_for(self, key: tuple[str, int], what: str, why: str) -> None:
        """``key``'s failure was its node's: its message says ``what`` and the node is excluded from later
        placements for ``why``, unless it is the only alive node left (excluding it would leave the app
        nowhere to run)."""
        rep = self.reps[key]
        node_id = str(rep["node_id"])
        rep["msg"] = f"exited with code {rep['exit_code']}: {what}"
        alive = {str(n.get("NodeID")) for n in self.ray.nodes() if n.get("Alive")}
        if alive - set(self.excluded) - {node_id}:
            self.excluded.setdefault(node_id, {"node_ip": str(rep["node_ip"]), "why": why})
            rep["msg"] += " (later placements avoid it)"
        else:
            rep["msg"] += " (not excluded: no other node is alive)"

    def _exclude_given(self) -> None:
        """Resolve ``exclude_nodes`` (node ids, IPs, hostnames) against the cluster's nodes into :attr:`excluded`."""
        if not self.p.exclude_nodes:
            return
        for n in self.ray.nodes():
            for entry in self.p.exclude_nodes:
                if node_matches(entry, n["NodeID"], n.get("NodeManagerAddress", ""), n.get("NodeManagerHostname", "")):
                    self.excluded.setdefault(n["NodeID"], {"node_ip": n.get("NodeManagerAddress", ""),
                                                           "why": f"exclude_nodes={entry}"})

    def _place(self, keys: list[tuple[str, int]]) -> bool:
        """Place ``keys`` and start one actor each; False (the app FAILED, the reason recorded) when the
        cluster cannot place them within ``gang_timeout``.

        The app has one placement group, a bundle per replica. The whole app (the first placement, or an
        APPLICATION scope -- or a ROLE scope of the only role -- restarted after a lost node) gets a new group
        off every node excluded now; the old group is removed first (its actors were killed), so nothing is
        held twice while the new one is placed. A part of the app (a REPLICA or ROLE scope restarted after a
        lost node) goes back into its own bundles of the group: Ray re-places the lost node's bundles on
        other nodes by itself (with the group's strategy and label selector; the lost node is dead), and the
        scope's other bundles stay where they are. A group of its own for the part would hold the lost
        bundle's resources twice -- Ray's re-placed copy and the new group's -- for as long as the old group
        held any live replica, and a tight cluster could not place the restart. The cost: an
        ``exclude_nodes`` entry that matches only a node which joined after the group was made does not keep
        a re-placed bundle off it."""
        if self.pg is not None and set(keys) != set(self.specs):
            return self._make_actors(keys, f"restart timed out after {self.p.gang_timeout:g}s: Ray could not "
                                           f"re-place the placement group bundle(s) of {len(keys)} replica(s)")
        from ray.util.placement_group import placement_group

        if self.pg is not None:  # the whole app restarts: its old group goes first (its actors were killed)
            with contextlib.suppress(Exception):
                self.ray.util.remove_placement_group(self.pg)
            self.pg = None
        if self.p.exclude_nodes:
            self._exclude_given()  # a node that joined since, with an excluded IP or hostname
        selector = exclusion_selector(set(self.excluded))
        keys = list(self.specs)
        specs = [self.specs[k] for k in keys]
        pg = placement_group([r.bundle for r in specs], strategy=self.p.strategy, name=f"tsm/{self.p.app_id}/{self.pgs_made}",
                             bundle_label_selector=[dict(selector) for _ in specs] if selector else None)
        self.pgs_made += 1
        ready, _ = self.ray.wait([pg.ready()], timeout=self.p.gang_timeout)
        if not ready:
            with contextlib.suppress(Exception):
                self.ray.util.remove_placement_group(pg)
            msg = (f"gang start timed out after {self.p.gang_timeout:g}s: the cluster could not place all "
                   f"{len(specs)} replica(s) at once ({self.p.strategy})")
            if self.excluded:
                msg += f" off the {len(self.excluded)} excluded node(s)"
            self._unplaced(keys, msg)
            return False
        self.pg, self.bundle = pg, {k: i for i, k in enumerate(keys)}
        return self._make_actors(keys, "")

    def _make_actors(self, keys: list[tuple[str, int]], timeout_msg: str) -> bool:
        """One actor per replica of ``keys``, each pinned to its bundle of :attr:`pg`; record where each
        runs. With ``timeout_msg`` (bundles Ray may still be re-placing) the actors get ``gang_timeout`` to
        start, else the app FAILS with it (False)."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        for k in keys:
            r, b = self.specs[k], self.specs[k].bundle
            n = self.placed[k] = self.placed.get(k, -1) + 1
            self.actors[k] = Replica.options(  # type: ignore[attr-defined]
                name=r.actor + (f"#{n}" if n else ""), namespace=NAMESPACE, num_cpus=b.get("CPU", 0), num_gpus=b.get("GPU", 0),
                memory=b.get("memory") or None, max_restarts=0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(self.pg, placement_group_bundle_index=self.bundle[k]),
            ).remote(self.p.app_id, r.role, r.replica_id, self.p.grace_period)
        refs = [self.actors[k].where.remote() for k in keys]
        try:
            where = self.ray.get(refs, timeout=self.p.gang_timeout if timeout_msg else None)
        except self.ray.exceptions.GetTimeoutError:
            for k in keys:
                with contextlib.suppress(Exception):
                    self.ray.kill(self.actors[k])
            self._unplaced(keys, timeout_msg)
            return False
        for k, w in zip(keys, where, strict=True):
            self.reps[k].update(node_ip=w["node_ip"], node_id=w["node_id"])
        if not self._prepare_envs(keys):
            return False
        first = self.p.replicas[0]
        if (first.role, first.replica_id) in keys:  # rank 0 (re)placed: the replicas started from now on see it
            self.rank0 = self.reps[(first.role, first.replica_id)]["node_ip"]
        return True

    def _prepare_envs(self, keys: list[tuple[str, int]]) -> bool:
        """Each replica of ``keys`` whose role names a lockfile environment has it made ready on its node by its
        actor (built once per node, the others waiting on its lock: :mod:`.envs`), all at once; False (the app
        FAILED, with uv's line) when one cannot be built, before any replica of ``keys`` starts."""
        shipped = {r.name: r.environment for r in self.p.roles if r.environment}
        todo = [k for k in keys if k[0] in shipped]
        if not todo:
            return True
        got = self.ray.get([self.actors[k].prepare_env.remote(shipped[k[0]]) for k in todo])
        for k, out in zip(todo, got, strict=True):
            if out.get("error"):
                print(f"tsm: environment of {k[0]}/{k[1]} on node {self.reps[k]['node_ip']}: {out['error']}\n"
                      f"{out.get('detail', '')}", flush=True)  # uv's whole message, in the job's log
                msg = str(out["error"]).replace("(--debug shows uv's message)", "(uv's message: the job's log)")
                self._unplaced(keys, f"{msg} (node {self.reps[k]['node_ip']})", "not started")
                return False
        return True

    def _unplaced(self, keys: list[tuple[str, int]], msg: str, prefix: str = "not placed") -> None:
        """``keys`` could not be placed (or made ready: ``prefix``): the app FAILS with ``msg``, the replicas
        still running are stopped."""
        self.state, self.msg = "FAILED", msg
        self._stop_running("stopped: " + msg)
        for k in keys:
            self.reps[k]["state"], self.reps[k]["msg"] = "FAILED", f"{prefix}: {msg}"
        self.write()

    def _stop_running(self, why: str) -> None:
        """Stop every running replica (the app ends): each is recorded CANCELLED with ``why``."""
        for k, r in self.reps.items():
            if r["state"] == "RUNNING":
                with contextlib.suppress(Exception):  # an actor already gone has nothing to stop
                    self.ray.get(self.actors[k].stop.remote(self.p.grace_period), timeout=self.p.grace_period + 30)
                r["state"], r["msg"] = "CANCELLED", why

    def _node_death(self, node_id: str) -> str | None:
        """Why the node died ("" unknown), or None while Ray counts it alive (or does not know it)."""
        for n in self.ray.nodes():
            if n.get("NodeID") == node_id:
                if n.get("Alive"):
                    return None
                return str(n.get("DeathReasonMessage") or "")
        return None

    def _lost_with_node(self, key: tuple[str, int]) -> str | None:
        """Why ``key``'s attempt, which ended with a non-zero code, was lost with its node; None when its node
        is alive (the program's own end).

        A node killed outright can still report such an end: its workers outlive the raylet for a moment and
        SIGKILL their children as they exit, and the actor's reply (exit code -9) may reach the driver before
        the actor is seen gone. So the actor is asked whether its raylet is still there
        (:meth:`Replica.node_alive`, one call); when it is not, or the actor no longer answers, the GCS is
        asked as :meth:`_why_gone` does, without taking an answering actor for a live node.
        """
        try:
            if self.ray.get(self.actors[key].node_alive.remote(), timeout=10):
                return None
            err: Exception = RuntimeError("the replica's raylet is gone")
        except Exception as e:  # noqa: BLE001 (gone or unreachable: the GCS says which)
            err = e
        verdict, why = self._why_gone(key, err, probe=False)
        return why if verdict == "node" else None

    def _why_gone(self, key: tuple[str, int], err: Exception, probe: bool = True) -> tuple[str, str]:
        """Why waiting on a replica's actor raised: ``("node", why)`` when it was lost with its node (Ray says
        the node died, or the actor's death cause is its node's death), ``("alive", "")`` when the actor
        answers again (it was only unreachable), else ``("died", why)``: the actor died on a live node.

        A node killed outright is first only unreachable (``ActorUnavailableError``); Ray marks it dead once
        its health checks fail (seconds), so this asks the GCS once a second for up to :data:`LOSS_WAIT`.
        Without ``probe`` an actor that still answers is not taken for a live node (its raylet is gone).
        """
        rep = self.reps[key]
        node_id, actor = str(rep["node_id"]), self.actors[key]
        where = f"node {node_id[:SHORT_ID]} ({rep['node_ip']})"
        if getattr(err, "preempted", False):  # Ray drained the node for preemption
            return "node", f"{where} was preempted (drained by Ray)"
        deadline = time.monotonic() + LOSS_WAIT
        while True:
            death = self._node_death(node_id)
            if death is not None:
                return "node", f"{where} was lost" + (f" ({death})" if death else "")
            info = _actor_info(self.ray, actor)
            if info.get("State") == "DEAD":
                node_died, text = _death_cause(info.get("DeathCause"))
                if node_died:
                    return "node", f"{where} was lost" + (f" ({text})" if text else "")
                return "died", text or type(err).__name__
            if probe:
                try:
                    self.ray.get(actor.running.remote(), timeout=5)
                    return "alive", ""
                except Exception:  # noqa: BLE001 (still unreachable: ask again)
                    pass
            if time.monotonic() >= deadline:
                return "died", f"{type(err).__name__}; unreachable for {format_duration(LOSS_WAIT)} on {where}"
            time.sleep(1.0)
