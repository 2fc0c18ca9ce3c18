"""Lockfile environments on Ray: built on each node a role's replicas run on, once per node, before they start.

A Ray node need not see the submitting machine's files, so the dry run reads each role's lock (and, for a
``uv.lock``, the ``pyproject.toml`` beside it) into the driver's payload (:func:`shipped`). Once the
replicas' actors are placed, the driver asks each of them to make its role's environment ready on its node
(:func:`build_here`): the files are written under the node's ``<tsm home>/envs/.sources/<key>`` and the
environment is built there by :class:`tsm.env.build.EnvCache` -- under the key's lock, so the replicas on
one node build it once and the others wait; a build that died is never used. A build that fails ends the
app, FAILED with uv's one line, before any replica starts. A replica then runs with the environment's
``bin`` first on its ``PATH`` (unless its role sets ``PATH``), ``VIRTUAL_ENV`` (unless set) and
``TSM_ENV_KEY``.

The node needs ``uv`` (``tsm[env]`` in the Python Ray runs, or on its ``PATH``), and the ``find_links``
folders at the same paths as the submitting machine.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from tsm.errors import InvalidAppError

if TYPE_CHECKING:
    from tsm.env.spec import EnvPlan

#: The role metadata key the launched app's spec keeps each role's environment under (``tsm describe``).
METADATA_KEY = "tsm.environment"


def shipped(plan: EnvPlan, where: str) -> dict[str, Any]:
    """``plan`` with the text of its lock files, as the driver's payload carries them to the nodes."""
    files = {os.path.basename(plan.lock): _text(plan.lock, where)}
    if plan.project:
        files["pyproject.toml"] = _text(plan.project, where)
    return {"plan": plan.to_dict(), "files": files}


def _text(path: str, where: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except UnicodeDecodeError as e:
        raise InvalidAppError(f"{where}: {path} is not UTF-8 text; regenerate the lock") from e
    except OSError as e:
        raise InvalidAppError(f"{where}: cannot read {path}: {e.strerror or e}") from e


def build_here(data: dict[str, Any]) -> dict[str, Any]:
    """Make the environment ``data`` (see :func:`shipped`) ready on this node; ``{"key", "root", "built",
    "seconds"}``, or ``{"key", "error", "detail"}`` when it cannot be built here."""
    from dataclasses import replace
    from pathlib import Path

    from tsm.env.build import EnvCache
    from tsm.env.spec import EnvPlan
    from tsm.errors import TsmError
    from tsm.store import tsm_home

    plan = EnvPlan.from_dict(data["plan"])
    try:
        cache = EnvCache(tsm_home() / "envs")
        if not cache.is_ready(plan.key):
            src = cache.root / ".sources" / plan.key
            src.mkdir(parents=True, exist_ok=True, mode=0o700)
            for name, text in data["files"].items():
                _write(src, name, text)
            lock = src / os.path.basename(plan.lock)
            plan = replace(plan, lock=str(lock), project=str(src / "pyproject.toml") if plan.project else None)
        built = cache.ensure(plan)
    except TsmError as e:
        return {"key": plan.key, "error": str(e), "detail": str(getattr(e, "detail", "") or "")}
    except OSError as e:
        return {"key": plan.key, "error": f"environment {plan.key}: {e.strerror or e}", "detail": str(e)}
    return {"key": plan.key, "root": str(Path(built.root)), "built": built.built, "seconds": round(built.seconds, 3)}


def _write(folder: Any, name: str, text: str) -> None:
    """Write one shipped lock file into ``folder`` whole (a temporary name, then one rename): replicas of one
    node may write the same file at once, and a reader never sees half of it."""
    if name in ("", ".", "..") or os.path.basename(name) != name:
        raise OSError(f"a lock file name {name!r} that is not a plain file name")
    tmp = folder / f".{name}.{os.getpid()}.{os.urandom(3).hex()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, folder / name)


def replica_env(full: dict[str, str], role_env: dict[str, str], ready: dict[str, Any]) -> None:
    """Point a replica's environment ``full`` at the built environment ``ready`` (what :func:`build_here`
    answered): its ``bin`` first on ``PATH`` unless the role sets ``PATH``, ``VIRTUAL_ENV`` unless the role
    sets it, and ``TSM_ENV_KEY``."""
    root = str(ready["root"])
    if "PATH" not in role_env:
        full["PATH"] = os.path.join(root, "bin") + os.pathsep + full.get("PATH", os.defpath)
    if "VIRTUAL_ENV" not in role_env:
        full["VIRTUAL_ENV"] = root
    full.pop("PYTHONHOME", None)
    full["TSM_ENV_KEY"] = str(ready["key"])


def dryrun_line(role: str, data: dict[str, Any]) -> str:
    """The dry run's line for ``role``'s environment."""
    p = data["plan"]
    lock = p["lock"] if str(p["lock"]).isprintable() else repr(p["lock"])
    return (f"# environment of role {role}: {p['key']} from {lock}, Python {p['python']}: built on each node its "
            "replicas run on (once per node, under <tsm home>/envs there) before any replica starts")
