"""tsm, the Training Session Manager: define a distributed app once; run, watch, log and stop it anywhere.

    import tsm

    app = tsm.AppDef("hello", roles=[tsm.Role("echo", entrypoint="echo", args=["hi"], num_replicas=2)])
    with tsm.get_runner() as runner:
        handle = runner.run(app, scheduler="local")
        print(runner.wait(handle))

Names are imported on first use so ``import tsm`` stays fast and never loads a scheduler backend.
"""

from __future__ import annotations

import importlib

TYPE_CHECKING = False  # avoids importing typing at start-up; type checkers treat it as True

__version__ = "0.1.0"

_EXPORTS: dict[str, str] = {
    # specs
    "AppDef": "tsm.specs.api",
    "AppDryRunInfo": "tsm.specs.api",
    "AppState": "tsm.specs.api",
    "AppStatus": "tsm.specs.api",
    "ReplicaStatus": "tsm.specs.api",
    "Resource": "tsm.specs.api",
    "RetryPolicy": "tsm.specs.api",
    "Role": "tsm.specs.api",
    "RoleStatus": "tsm.specs.api",
    "NULL_IMAGE": "tsm.specs.api",
    "is_terminal": "tsm.specs.api",
    "macros": "tsm.specs.api",
    "runopts": "tsm.specs.runopts",
    "make_app_handle": "tsm.specs.handles",
    "parse_app_handle": "tsm.specs.handles",
    "get_named_resource": "tsm.specs.named_resources",
    # runner
    "Runner": "tsm.runner.api",
    "get_runner": "tsm.runner.api",
    # schedulers
    "Stream": "tsm.schedulers.api",
    # seed TSM program style
    "Container": "tsm.seed",
    "ElasticRole": "tsm.seed",
    "Application": "tsm.seed",
    "RunConfig": "tsm.seed",
    "session": "tsm.seed",
    # errors
    "TsmError": "tsm.errors",
    "InvalidAppError": "tsm.errors",
    "InvalidRunOptionError": "tsm.errors",
    "UnknownAppError": "tsm.errors",
    "UnknownSchedulerError": "tsm.errors",
    "MalformedAppHandleError": "tsm.errors",
    "ComponentNotFoundError": "tsm.errors",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str) -> object:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'tsm' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__


if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from tsm.errors import (  # noqa: F401
        ComponentNotFoundError,
        InvalidAppError,
        InvalidRunOptionError,
        MalformedAppHandleError,
        TsmError,
        UnknownAppError,
        UnknownSchedulerError,
    )
    from tsm.runner.api import Runner, get_runner  # noqa: F401
    from tsm.schedulers.api import Stream  # noqa: F401
    from tsm.seed import Application, Container, ElasticRole, RunConfig, session  # noqa: F401
    from tsm.specs.api import (  # noqa: F401
        NULL_IMAGE,
        AppDef,
        AppDryRunInfo,
        AppState,
        AppStatus,
        ReplicaStatus,
        Resource,
        RetryPolicy,
        Role,
        RoleStatus,
        is_terminal,
        macros,
    )
    from tsm.specs.handles import make_app_handle, parse_app_handle  # noqa: F401
    from tsm.specs.named_resources import get_named_resource  # noqa: F401
    from tsm.specs.runopts import runopts  # noqa: F401
