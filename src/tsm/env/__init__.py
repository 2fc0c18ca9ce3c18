"""Lockfile environments: the Python environment a role's replicas run in, built once per content key.

A role names a lock (``Role(environment=Environment("uv.lock", python="3.12"))``, or for every role of a
launch ``tsm run --environment uv.lock`` / ``-c environment=uv.lock``, also in the config file): a
``uv.lock`` with its ``pyproject.toml``, a ``pylock.toml``, or a ``requirements.txt`` (hashes honoured). Its
**key** is the content hash of the lock, the Python version, the platform and the index settings
(:func:`tsm.env.spec.content_key`). Where the replicas run, the scheduler builds the key's environment once
with uv, under a lock (concurrent launches wait for the one build), into a temporary folder renamed into
place only when complete (:mod:`tsm.env.build`); two roles, many replicas, retries and every trial of a
sweep reuse it, and ``python`` (and ``torchrun``) in each replica is its interpreter.

Air-gapped: ``-c find_links=/wheels`` builds from a wheelhouse alone (offline); ``-c index_url=URL`` names
the index. A lock that cannot be read, no such Python or a missing wheel is one line at submit, before any
replica starts (``--debug`` adds uv's message). ``tsm env list | show | rm | gc`` manage the cache.

Modules: :mod:`~tsm.env.spec` (the plan and key, pure), :mod:`~tsm.env.build` (the cache and the build),
:mod:`~tsm.env.options` (the run options, shared by backends).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tsm.specs.environment import Environment

if TYPE_CHECKING:
    from tsm.env.spec import EnvPlan, IndexSettings, content_key, plan

__all__ = ["EnvPlan", "Environment", "IndexSettings", "content_key", "plan"]


def __getattr__(name: str) -> Any:
    if name in ("EnvPlan", "IndexSettings", "content_key", "plan"):
        from tsm.env import spec

        return getattr(spec, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
