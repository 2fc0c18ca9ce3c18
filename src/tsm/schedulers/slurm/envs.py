"""Lockfile environments on Slurm submitted from this machine: built at submit into ``<tsm home>/envs``.

The job's nodes see this machine's files (the rule the replicas' interpreter already follows, see
:mod:`tsm.schedulers.common.interpreter`), so the environment is built once per key on the shared file
system by the submitting process under the key's lock (:class:`tsm.env.build.EnvCache`: concurrent
submissions build once, a build that died is never used), before ``sbatch``; a failure is one line at
submit and no job exists. Each role with an environment runs its interpreter: the dry run names it as
the role's ``TSM_PYTHON`` (rule 1), with ``VIRTUAL_ENV`` and ``TSM_ENV_KEY`` beside it. Over ``-c ssh=``
the cluster's file system is not this one: refused at dry run until the login node builds them.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tsm.errors import NotSupportedError
from tsm.schedulers.common.interpreter import ROLE_ENV

if TYPE_CHECKING:
    from tsm.env.options import EnvOptions
    from tsm.specs.api import AppDef

#: The role metadata key the launched app keeps each role's environment under (``tsm describe``).
METADATA_KEY = "tsm.environment"


def apply(app: AppDef, opts: EnvOptions, home: str, ssh: str | None) -> tuple[AppDef, dict[str, dict[str, Any]]]:
    """``app`` with each role that names an environment pointed at its interpreter, and the plans to build.

    ``app`` itself is not changed (a copy is returned when any role has an environment).
    """
    if not opts.environment and not any(r.environment for r in app.roles):
        return app, {}
    from tsm.env.build import EnvCache
    from tsm.env.options import role_plan

    if ssh:
        if any(role_plan(r, opts, python_env=ROLE_ENV) for r in app.roles):
            raise NotSupportedError("lockfile environments over -c ssh= are not built yet (Slurm submitted from "
                                    "this machine, and local, build them); drop the environment or submit here")
        return app, {}
    cache = EnvCache(Path(home) / "envs")
    plans = {r.name: p for r in app.roles if (p := role_plan(r, opts, python_env=ROLE_ENV, built=cache.is_ready))}
    if not plans:
        return app, {}
    app = copy.deepcopy(app)
    for role in app.roles:
        p = plans.get(role.name)
        if p is None:
            continue
        role.env[ROLE_ENV] = cache.python(p.key)
        role.env.setdefault("VIRTUAL_ENV", str(cache.path(p.key)))
        role.env["TSM_ENV_KEY"] = p.key
        role.metadata[METADATA_KEY] = {"key": p.key, "lock": p.lock, "python": p.python}
    return app, {name: p.to_dict() for name, p in plans.items()}


def ensure(home: str, plans: dict[str, dict[str, Any]] | None) -> None:
    """Build every environment ``plans`` names that is not ready in ``<home>/envs`` (each key once)."""
    if not plans:
        return
    from tsm.env.build import EnvCache
    from tsm.env.spec import EnvPlan

    cache = EnvCache(Path(home) / "envs")
    for key in sorted({p["key"] for p in plans.values()}):
        cache.ensure(EnvPlan.from_dict(next(p for p in plans.values() if p["key"] == key)))


def lines(home: str, plans: dict[str, dict[str, Any]] | None) -> list[str]:
    """The script's comment lines: each role's key, its lock and whether it is cached."""
    if not plans:
        return []
    from tsm.env.build import EnvCache

    cache = EnvCache(Path(home) / "envs")
    return [f"# environment of role {role}: {p['key']} ("
            + ("cached" if cache.is_ready(p["key"]) else "not cached: built at submit")
            + f") from {_shown(p['lock'])}, Python {p['python']}" for role, p in plans.items()]


def _shown(path: str) -> str:
    """A path as one line of a dry run: quoted when it holds anything a terminal or a script would act on."""
    return path if path.isprintable() else repr(path)
