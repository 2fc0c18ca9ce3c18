"""TorchX's ``specs.builders``: an AppDef from a component function and its command line, TorchX's way.

tsm's own command-line reader is :func:`tsm.components.materialize` (strict: unknown defaults, bad values
and missing arguments raise :class:`~tsm.errors.ComponentArgumentError`, it never exits). This module keeps
TorchX's contract for code that calls TorchX's functions:

* :func:`_create_args_parser` (also :func:`make_args_parser`) is a plain :class:`argparse.ArgumentParser`:
  ``--name`` per parameter (``-x`` too for one-letter names), ``--help``, help text from the docstring
  with ``(required)``/``(default: X)``; a bad command line prints usage and exits (``SystemExit``), as
  argparse does;
* ``cmpnt_defaults`` are strings (a ``.torchxconfig`` ``[component:...]`` section) laid over the
  function's defaults; a key that names no parameter is ignored; the ``*args`` default is a string split
  on whitespace;
* values are decoded as TorchX does: ``bool`` from ``true``/``false``, ``list`` from ``a,b``, ``dict``
  from ``k=v,k2=v2`` (tsm's value parser, :func:`tsm.components.cmdline.parse_value`), an empty string
  as None;
* :func:`parse_mounts` reads ``type=bind,src=...,dst=...`` as TorchX does (``KeyError`` for an unknown or
  misplaced option, ``ValueError`` for an unknown type, ``~`` expanded in a bind source, any destination).
"""

from __future__ import annotations

import argparse
import inspect
import os
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tsm.compat.torchx.specs.file_linter import TorchXArgumentHelpFormatter, get_fn_docstring
from tsm.components.cmdline import param_type, parse_value
from tsm.specs.api import AppDef
from tsm.specs.handles import make_app_handle
from tsm.specs.mounts import BindMount, DeviceMount, Mount, MountType, VolumeMount

__all__ = ["BindMount", "DeviceMount", "MountType", "VolumeMount", "_create_args_parser", "make_app_handle",
           "make_args_parser", "materialize_appdef", "parse_args", "parse_mounts"]

_PRIMITIVES = (int, str, float)


def _hints(fn: Callable[..., Any]) -> dict[str, Any]:
    """The function's resolved annotations (string annotations too); the raw ones when they cannot be resolved."""
    try:
        return typing.get_type_hints(fn)
    except Exception:  # noqa: BLE001 - an unresolvable forward reference: fall back to what is written
        return {n: p.annotation for n, p in inspect.signature(fn).parameters.items()}


class _Remainder(argparse.Action):
    """``*args``: the words left on the command line, or the (string) default split on whitespace."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        setattr(namespace, self.dest, values if values else str(self.default or "").split())


def _create_args_parser(
    cmpnt_fn: Callable[..., AppDef],
    cmpnt_defaults: Mapping[str, str] | None = None,
    config: Mapping[str, Any] | None = None,
) -> argparse.ArgumentParser:
    """TorchX's argparse parser of component ``cmpnt_fn`` (``-h`` stays free for a parameter named ``h``)."""
    description, arg_help = get_fn_docstring(cmpnt_fn)
    parser = argparse.ArgumentParser(
        prog=f"torchx run <run args...> {getattr(cmpnt_fn, '__name__', 'component')} ", description=description,
        formatter_class=TorchXArgumentHelpFormatter, add_help=False,
    )
    parser.add_argument("--help", action="help", default=argparse.SUPPRESS, help="show this help message and exit")
    hints = _hints(cmpnt_fn)
    for name, p in inspect.signature(cmpnt_fn).parameters.items():
        annotation = hints.get(name, p.annotation)
        kwargs: dict[str, Any] = {"help": arg_help.get(name, " "),
                                  "type": annotation if annotation in _PRIMITIVES else str}
        if p.default is not inspect.Parameter.empty:
            kwargs["default"] = str(p.default) if isinstance(p.default, bool) else p.default
        if cmpnt_defaults and name in cmpnt_defaults:
            kwargs["default"] = cmpnt_defaults[name]
        if p.kind is inspect.Parameter.VAR_POSITIONAL:
            parser.add_argument(name, nargs=argparse.REMAINDER, action=_Remainder, **kwargs)
            continue
        flags = [f"-{name}", f"--{name}"] if len(name) == 1 else [f"--{name}"]
        if "default" not in kwargs and not (config and name in config):
            kwargs["required"] = True
        parser.add_argument(*flags, **kwargs)
    return parser


#: tsm's name for :func:`_create_args_parser`.
make_args_parser = _create_args_parser


def parse_args(
    cmpnt_fn: Callable[..., AppDef],
    cmpnt_args: Sequence[str],
    cmpnt_defaults: Mapping[str, Any] | None = None,
    config: Mapping[str, Any] | None = None,
) -> argparse.Namespace:
    """The parsed command line of ``cmpnt_fn``, with ``config`` (a component's config values) laid over it."""
    parsed = _create_args_parser(cmpnt_fn, cmpnt_defaults, config).parse_args(list(cmpnt_args))
    for key, value in (config or {}).items():
        if key in parsed:
            setattr(parsed, key, value)
    return parsed


def _decode(value: Any, annotation: Any) -> Any:
    """A parsed value as the parameter's type: text of a bool, list or dict decoded, anything else as it is."""
    if value is None:
        return None
    ptype = param_type(annotation)
    if ptype is not None and ptype.base is bool:
        return bool(value) and str(value).lower() == "true"
    if isinstance(value, str) and ptype is not None and ptype.base in (list, dict):
        return parse_value(value, ptype) if value else None
    return value


def materialize_appdef(
    cmpnt_fn: Callable[..., AppDef],
    cmpnt_args: Sequence[str],
    cmpnt_defaults: Mapping[str, Any] | None = None,
    config: Mapping[str, Any] | None = None,
) -> AppDef:
    """Call component ``cmpnt_fn`` with its command line ``cmpnt_args`` (TorchX's rules, above); its AppDef."""
    parsed = parse_args(cmpnt_fn, cmpnt_args, cmpnt_defaults, config)
    hints = _hints(cmpnt_fn)
    positional: list[Any] = []
    varargs: list[Any] = []
    keyword: dict[str, Any] = {}
    for name, p in inspect.signature(cmpnt_fn).parameters.items():
        if p.kind is inspect.Parameter.VAR_KEYWORD:
            raise TypeError("**kwargs are not supported for component definitions")
        value = _decode(getattr(parsed, name), hints.get(name, p.annotation))
        if p.kind is inspect.Parameter.VAR_POSITIONAL:
            varargs = list(value or [])
        elif p.kind is inspect.Parameter.KEYWORD_ONLY:
            keyword[name] = value
        else:
            positional.append(value)
    if varargs[:1] == ["--"]:
        varargs = varargs[1:]
    return cmpnt_fn(*positional, *varargs, **keyword)


#: Mount option spellings -> the option they set.
_MOUNT_OPTIONS: Mapping[str, str] = {
    "type": "type", "destination": "dst", "dst": "dst", "target": "dst", "read_only": "readonly",
    "readonly": "readonly", "source": "src", "src": "src", "perm": "perm",
}


def parse_mounts(opts: Sequence[str]) -> list[Mount]:
    """``["type=bind", "src=/a", "dst=/b", "readonly", "type=device", "src=/dev/x", ...]`` as typed mounts.

    Each mount starts with ``type=``: ``bind`` (``src``, ``dst``, ``readonly``), ``volume`` (the same) or
    ``device`` (``src``, ``dst`` defaulting to it, ``perm`` of ``rwm``, the default).
    """
    groups: list[dict[str, str]] = []
    for opt in opts:
        key, _, value = opt.partition("=")
        if key not in _MOUNT_OPTIONS:
            raise KeyError(f"unknown mount option {key}, must be one of {list(_MOUNT_OPTIONS)}")
        key = _MOUNT_OPTIONS[key]
        if key == "type":
            groups.append({})
        elif not groups:
            raise KeyError("type must be specified first")
        groups[-1][key] = value
    return [_mount(g) for g in groups]


def _mount(opts: dict[str, str]) -> Mount:
    kind = opts.get("type")
    if kind == MountType.BIND:
        return BindMount(src_path=os.path.expanduser(opts["src"]), dst_path=opts["dst"], read_only="readonly" in opts)
    if kind == MountType.VOLUME:
        return VolumeMount(src=opts["src"], dst_path=opts["dst"], read_only="readonly" in opts)
    if kind == MountType.DEVICE:
        perm = opts.get("perm", "rwm")
        bad = [c for c in perm if c not in "rwm"]
        if bad:
            raise ValueError(f"{bad[0]} is not a valid permission flag: flags must be any of r, w, m")
        return DeviceMount(src_path=opts["src"], dst_path=opts.get("dst", opts["src"]), permissions=perm)
    raise ValueError(f"invalid mount type {kind!r}, must be one of {[m.value for m in MountType]}")
