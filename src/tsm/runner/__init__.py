"""The Runner and its config; see :mod:`tsm.runner.api`.

``Runner`` and ``get_runner`` are imported on first use, so a light submodule (:mod:`tsm.runner.plugins`)
can be imported without the runner's own imports.
"""

from __future__ import annotations

TYPE_CHECKING = False  # avoids importing typing at start-up; type checkers treat it as True

__all__ = ["Runner", "get_runner"]


def __getattr__(name: str) -> object:
    if name not in __all__:
        raise AttributeError(f"module 'tsm.runner' has no attribute {name!r}")
    from tsm.runner import api

    value = getattr(api, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from tsm.runner.api import Runner as Runner, get_runner as get_runner
