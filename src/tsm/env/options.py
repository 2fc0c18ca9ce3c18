"""The run options of lockfile environments, shared by every backend that builds them, and a role's plan.

A backend's options dataclass inherits :class:`EnvOptions`; :func:`role_plan` decides which environment
(if any) a role runs in: the role's own :attr:`~tsm.specs.api.Role.environment` first, else the run option
``environment`` unless the role picks its interpreter itself (env ``TSM_PYTHON``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tsm.schedulers.common.options import RunOptions, option
from tsm.specs.environment import Environment

if TYPE_CHECKING:  # the plan's module is imported when a role names an environment, not by every launch
    from tsm.env.spec import EnvPlan, IndexSettings
    from tsm.specs.api import Role


@dataclass(frozen=True)
class EnvOptions(RunOptions):
    """``environment``, ``environment_python``, ``index_url``, ``find_links`` (see :mod:`tsm.env`)."""

    environment: str | None = option(
        "lock file of the Python environment the replicas run in (uv.lock beside its pyproject.toml, "
        "pylock.toml, or requirements.txt with hashes honoured), built once per content; a role's own wins"
    )
    environment_python: str | None = option(
        "Python version environments are built for (e.g. 3.12); default: the version running tsm"
    )
    index_url: str | None = option("package index environments are built from; default: uv's own setting")
    find_links: list[str] | None = option(
        "wheelhouse folders environments are built from; without index_url, from these alone (offline)"
    )

    @property
    def index_settings(self) -> IndexSettings:
        from tsm.env.spec import IndexSettings

        return IndexSettings(self.index_url, tuple(self.find_links or ()))


def role_plan(role: Role, opts: EnvOptions, platform: str | None = None,
              python_env: str = "TSM_PYTHON", built: Callable[[str], bool] | None = None) -> EnvPlan | None:
    """The environment ``role`` runs in under ``opts``, read and keyed; None when it names none.

    ``built(key)``: whether that key is ready already (its lock is then not parsed again).
    """
    env = role.environment
    if env is None and opts.environment and not role.env.get(python_env):
        env = Environment(opts.environment, opts.environment_python)
    elif env is not None and env.python is None and opts.environment_python:
        env = Environment(env.lock, opts.environment_python)
    if env is None:
        return None
    from tsm.env.spec import plan

    return plan(env, opts.index_settings, platform, where=f"role '{role.name}': environment", built=built)
