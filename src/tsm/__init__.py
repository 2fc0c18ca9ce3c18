"""tsm, the Training Session Manager: define a distributed app once; run, watch, log and stop it anywhere.

    import tsm

    app = tsm.AppDef("hello", roles=[tsm.Role("echo", entrypoint="echo", args=["hi"], num_replicas=2)])
    with tsm.get_runner() as runner:
        handle = runner.run(app, scheduler="local")
        print(runner.wait(handle))

Names are imported on first use so ``import tsm`` stays fast and never loads a scheduler backend.
"""

from __future__ import annotations

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
    "NULL_RESOURCE": "tsm.specs.api",
    "IMAGE": "tsm.specs.api",
    "BindMount": "tsm.specs.mounts",
    "VolumeMount": "tsm.specs.mounts",
    "DeviceMount": "tsm.specs.mounts",
    "Environment": "tsm.specs.environment",
    "named_resources": "tsm.specs.named_resources",
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
    "AppStatusError": "tsm.errors",
    "AppStillRunningError": "tsm.errors",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str) -> object:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'tsm' has no attribute {name!r}")
    import importlib  # here, not at the top: every `tsm` command imports this package, most need no name of it

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__


if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from tsm.errors import (
        AppStatusError as AppStatusError,
        AppStillRunningError as AppStillRunningError,
        ComponentNotFoundError as ComponentNotFoundError,
        InvalidAppError as InvalidAppError,
        InvalidRunOptionError as InvalidRunOptionError,
        MalformedAppHandleError as MalformedAppHandleError,
        TsmError as TsmError,
        UnknownAppError as UnknownAppError,
        UnknownSchedulerError as UnknownSchedulerError,
    )
    from tsm.runner.api import Runner as Runner, get_runner as get_runner
    from tsm.schedulers.api import Stream as Stream
    from tsm.seed import (
        Application as Application,
        Container as Container,
        ElasticRole as ElasticRole,
        RunConfig as RunConfig,
        session as session,
    )
    from tsm.specs.api import (
        NULL_IMAGE as NULL_IMAGE,
        NULL_RESOURCE as NULL_RESOURCE,
        AppDef as AppDef,
        AppDryRunInfo as AppDryRunInfo,
        AppState as AppState,
        AppStatus as AppStatus,
        ReplicaStatus as ReplicaStatus,
        Resource as Resource,
        RetryPolicy as RetryPolicy,
        Role as Role,
        RoleStatus as RoleStatus,
        is_terminal as is_terminal,
        macros as macros,
    )
    from tsm.specs.environment import Environment as Environment
    from tsm.specs.handles import make_app_handle as make_app_handle, parse_app_handle as parse_app_handle
    from tsm.specs.mounts import (
        BindMount as BindMount,
        DeviceMount as DeviceMount,
        VolumeMount as VolumeMount,
    )
    from tsm.specs.named_resources import (
        get_named_resource as get_named_resource,
        named_resources as named_resources,
    )
    from tsm.specs.runopts import runopts as runopts
