"""Launching a component through the runner: ``component_app``, ``dryrun_component`` and ``run_component``.

A component (builtin, entry point or ``file.py:fn``) is materialized into an :class:`~tsm.specs.AppDef` with
its arguments, over the defaults of the config files and of the runner; then it is an app like any other.
:class:`ComponentLaunch` is a mixin of :class:`tsm.runner.api.Runner`, kept here so the runner's module stays
its launch-and-watch core.
"""

from __future__ import annotations

import builtins
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tsm.runner.after import After
    from tsm.runner.config import Config
    from tsm.specs.api import AppDef, AppDryRunInfo
    from tsm.specs.runopts import CfgVal


class ComponentLaunch:
    """The runner's component methods (they ask only its ``config``, ``dryrun`` and ``schedule``)."""

    _component_defaults: dict[str, dict[str, str]]

    if TYPE_CHECKING:  # the runner's own
        @property
        def config(self) -> Config: ...

        def dryrun(self, app: AppDef, scheduler: str | None = None, cfg: Mapping[str, CfgVal] | None = None,
                   workspace: str | None = None, parent_run_id: str | None = None,
                   after: Iterable[str | After] | None = None) -> AppDryRunInfo[Any]: ...

        def schedule(self, dryrun_info: AppDryRunInfo[Any]) -> str: ...

    def component_app(self, component: str | None, component_args: builtins.list[str] | None = None) -> AppDef:
        """Materialize a component (builtin, entry point or ``file.py:fn``; None: the config's ``[cli:run]
        component``) with its arguments."""
        from tsm.components import get_component, materialize

        component = self.config.component(component)

        comp = get_component(component)
        defaults = dict(self.config.component_defaults.get(component, {}))
        defaults.update(self._component_defaults.get(component, {}))
        return materialize(comp.fn, list(component_args or []), defaults=defaults or None, prog=f"tsm run {component}")

    def dryrun_component(
        self,
        component: str | None,
        component_args: builtins.list[str] | None = None,
        scheduler: str | None = None,
        cfg: Mapping[str, CfgVal] | None = None,
        workspace: str | None = None,
        parent_run_id: str | None = None,
        after: Iterable[str | After] | None = None,
    ) -> AppDryRunInfo[Any]:
        """:meth:`dryrun` of a component."""
        return self.dryrun(self.component_app(component, component_args), scheduler, cfg,
                           workspace=workspace, parent_run_id=parent_run_id, after=after)

    def run_component(
        self,
        component: str | None,
        component_args: builtins.list[str] | None = None,
        scheduler: str | None = None,
        cfg: Mapping[str, CfgVal] | None = None,
        workspace: str | None = None,
        parent_run_id: str | None = None,
        after: Iterable[str | After] | None = None,
    ) -> str:
        """:meth:`run` of a component; returns the handle."""
        return self.schedule(self.dryrun_component(component, component_args, scheduler, cfg,
                                                   workspace=workspace, parent_run_id=parent_run_id, after=after))
