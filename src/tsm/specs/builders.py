"""TorchX's ``specs.builders`` names: make an AppDef from a component function and its command line.

``materialize_appdef`` is :func:`tsm.components.materialize` under TorchX's name and parameter names
(imported when called, so ``tsm.specs`` stays free of the components package until then);
``parse_mounts`` and ``make_app_handle`` are re-exported from where tsm keeps them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from tsm.specs.api import AppDef
from tsm.specs.handles import make_app_handle as make_app_handle
from tsm.specs.mounts import parse_mounts as parse_mounts

if TYPE_CHECKING:  # annotations only: every command imports tsm.specs, and argparse with gettext is ~2 ms
    import argparse


def materialize_appdef(
    cmpnt_fn: Callable[..., AppDef],
    cmpnt_args: Sequence[str],
    cmpnt_defaults: Mapping[str, str] | None = None,
) -> AppDef:
    """Call component ``cmpnt_fn`` with ``cmpnt_args`` (its command line) and ``cmpnt_defaults``; its AppDef.

    Bad arguments raise :class:`~tsm.errors.ComponentArgumentError` carrying the component's usage.
    """
    from tsm.components.cmdline import materialize

    fn: Any = cmpnt_fn
    return materialize(fn, list(cmpnt_args), defaults=cmpnt_defaults)


def make_args_parser(
    cmpnt_fn: Callable[..., AppDef],
    cmpnt_defaults: Mapping[str, str] | None = None,
    config: Mapping[str, Any] | None = None,
) -> argparse.ArgumentParser:
    """The argparse parser of component ``cmpnt_fn``: one option per parameter, help from its docstring.

    This is the parser :func:`materialize_appdef` reads a component's command line with (``--help`` lists
    its options, ``-h`` stays free for a parameter named ``h``). ``cmpnt_defaults`` override the
    function's defaults as strings; ``config`` (TorchX's ``.torchxconfig`` component section) does too.
    TorchX 0.7 calls it ``_create_args_parser``; both names are here.
    """
    from tsm.components.cmdline import _Component

    defaults = {**(cmpnt_defaults or {}), **{k: str(v) for k, v in (config or {}).items()}}
    fn: Any = cmpnt_fn
    parser: argparse.ArgumentParser = _Component(fn, None, defaults).parser
    return parser


_create_args_parser = make_args_parser
