"""What every ``torchx`` command shares: its runner, its scheduler names, TorchX's table layout.

The command's runner is the TorchX face's (:func:`tsm.compat.torchx.runner.get_runner`: session ``torchx``,
TorchX's registry and default), with one change for a command that exits: ``local_cwd`` is tsm's
(:mod:`tsm.compat.torchx.local_cwd`, the app owned by a detached supervisor, so ``torchx status`` and
``torchx log`` of a later command see it) instead of TorchX's in-process scheduler, and tsm's own ``local``
is offered beside it. When ``torchx.schedulers`` entry points replace TorchX's defaults, they alone are
offered, as in TorchX.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tsm.compat.torchx.runner.api import Runner, get_configured_trackers
from tsm.compat.torchx.schedulers import (
    DEFAULT_SCHEDULER_MODULES,
    get_scheduler_factories as torchx_factories,
)

__all__ = ["command_runner", "get_configured_trackers", "scheduler_factories", "tabulate"]

#: The module whose ``create_scheduler`` makes each scheduler the command adds or replaces.
_COMMAND_SCHEDULERS = {
    "local_cwd": "tsm.compat.torchx.local_cwd",
    "local": "tsm.schedulers.local",
}


def _deferred(module: str) -> Any:
    def create(*args: Any, **kwargs: Any) -> Any:
        import importlib

        return importlib.import_module(module).create_scheduler(*args, **kwargs)

    return create


def scheduler_factories() -> dict[str, Any]:
    """``{name: factory}`` of the command (see the module doc); the first name is the default."""
    factories = dict(torchx_factories())
    if set(factories) == set(DEFAULT_SCHEDULER_MODULES):
        for name, module in _COMMAND_SCHEDULERS.items():
            factories[name] = _deferred(module)
    return factories


def command_runner(component_defaults: Mapping[str, Mapping[str, str]] | None = None) -> Runner:
    """The command's runner: session ``torchx`` over :func:`scheduler_factories`."""
    return Runner("torchx", scheduler_factories(), component_defaults)


def tabulate(rows: Sequence[Sequence[object]], headers: Sequence[str]) -> str:
    """Rows under headers as TorchX prints them (``tabulate``'s plain layout: a dashed rule as wide as each
    column, at least its header and two, two spaces between columns, text left-aligned, no trailing blanks)."""
    cells = [[str(c) for c in row] for row in rows]
    widths = [max([len(h) + 2, *(len(row[i]) for row in cells)]) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip(),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    return "\n".join(lines)
