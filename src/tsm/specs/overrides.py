"""``Role.overrides`` (TorchX 710f6541): attribute name -> a zero-argument callable, or an awaitable, giving its value.

TorchX evaluates an override on the first read of the attribute. tsm evaluates every override once, at dry
run, before anything reads the role (the value is the same; it is computed then): :func:`apply_overrides`
sets each attribute and clears ``overrides``, so the app a scheduler sees, and the one the history keeps,
holds plain values.
"""

from __future__ import annotations

from typing import Any

from tsm.specs.api import AppDef, Role

__all__ = ["apply_overrides"]


async def _awaited(value: Any) -> Any:
    return await value


def apply_overrides(target: AppDef | Role) -> None:
    """Apply the overrides of ``target`` (a role, or every role of an app) and clear them."""
    roles = target.roles if isinstance(target, AppDef) else [target]
    if not any(role.overrides for role in roles):
        return  # the common case: nothing to import, nothing to do
    import asyncio
    import inspect

    for role in roles:
        for name, make in list(role.overrides.items()):
            value = make if inspect.isawaitable(make) else make()
            if inspect.isawaitable(value):
                value = asyncio.run(_awaited(value))
            setattr(role, name, value)
        role.overrides = {}
