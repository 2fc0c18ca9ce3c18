"""Lockfile environments on the local scheduler: cached under ``$TSM_HOME/envs``, built at submit.

The dry run decides each role's environment (:func:`role_python`: its key, its interpreter, cached or
not) without building anything; :func:`ensure` (called by ``schedule`` before any file or record is
written) builds what is missing, once per key across processes (:class:`tsm.env.build.EnvCache`). The
supervisor then starts replicas with the environment's ``bin`` first on PATH, as any other interpreter.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from tsm.schedulers.common.interpreter import ROLE_ENV, Interpreter, replica_python

if TYPE_CHECKING:
    from tsm.env.build import EnvCache
    from tsm.env.options import EnvOptions
    from tsm.env.spec import EnvPlan
    from tsm.specs.api import Role

#: The role metadata key a launched app's spec keeps its environment's key under (``tsm describe``).
METADATA_KEY = "tsm.environment"


def cache() -> EnvCache:
    """This machine's environment cache, ``$TSM_HOME/envs``."""
    from tsm.env.build import EnvCache
    from tsm.store import tsm_home

    return EnvCache(tsm_home() / "envs")


def role_python(role: Role, opts: EnvOptions, option: str | None,
                plans: dict[str, EnvPlan] | None = None) -> tuple[Interpreter, EnvPlan | None]:
    """The interpreter ``role``'s replicas run and, when it is a lockfile environment, its plan (also put in
    ``plans`` under the role's name)."""
    if role.environment is None and not opts.environment:
        return replica_python(role.env, option), None
    from tsm.env.options import role_plan

    c = cache()
    plan = role_plan(role, opts, python_env=ROLE_ENV, built=c.is_ready)
    if plan is None:
        return replica_python(role.env, option), None
    state = "cached" if c.is_ready(plan.key) else "built at submit"
    if plans is not None:
        plans[role.name] = plan
    return Interpreter(c.python(plan.key), f"environment {plan.key}, {state}"), plan


def replica_env(plan: EnvPlan | None, env: dict[str, str]) -> None:
    """What a replica in ``plan``'s environment is told: ``VIRTUAL_ENV`` (unless the role sets it), the key."""
    if plan is None:
        return
    env.setdefault("VIRTUAL_ENV", str(cache().path(plan.key)))
    env["TSM_ENV_KEY"] = plan.key


def annotate(spec: dict[str, Any], plans: dict[str, EnvPlan]) -> dict[str, Any]:
    """``spec`` with each role's key in its role metadata (what ``tsm describe`` shows)."""
    for role in spec.get("roles", []):
        p = plans.get(role.get("name"))
        if p is not None:
            role.setdefault("metadata", {})[METADATA_KEY] = {"key": p.key, "lock": p.lock, "python": p.python}
    return spec


def lines(plans: dict[str, dict[str, Any]]) -> list[str]:
    """The dry run's comment lines: each role's key, its lock and whether it is cached."""
    if not plans:
        return []
    c = cache()
    out = []
    for role, data in plans.items():
        state = "cached" if c.is_ready(data["key"]) else "not cached: built at submit"
        out.append(f"# environment of role {role}: {data['key']} ({state}) from {_shown(data['lock'])}, "
                   f"Python {data['python']}")
    return out


def will_exist(path: str, plans: dict[str, dict[str, Any]]) -> bool:
    """Whether ``path`` is an environment's interpreter that the submit will build (not there at dry run)."""
    root = str(cache().root)
    return any(path == os.path.join(root, p["key"], "bin", "python") for p in plans.values())


def ensure(plans: dict[str, dict[str, Any]]) -> None:
    """Build every environment the request names that is not ready yet (each key once)."""
    if not plans:
        return
    from tsm.env.spec import EnvPlan

    c = cache()
    seen: set[str] = set()
    for data in plans.values():
        if data["key"] not in seen:
            seen.add(data["key"])
            c.ensure(EnvPlan.from_dict(data))


def running_app_dirs() -> list[str]:
    """The folders of this home's local apps that have not ended (their environments are in use)."""
    from tsm.specs.api import AppState
    from tsm.store import Store

    terminal = ", ".join(str(int(s)) for s in AppState if s.is_terminal)
    rows = Store().query(f"SELECT app_dir FROM local_apps WHERE state NOT IN ({terminal})")
    return [str(r["app_dir"]) for r in rows]


def _shown(path: str) -> str:
    """A path as one line of a dry run: quoted when it holds anything a terminal or a script would act on."""
    return path if path.isprintable() else repr(path)
