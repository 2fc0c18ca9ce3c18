"""TorchX nightly's ``StructuredOpts``: a scheduler's run options written as a dataclass.

A subclass is a ``@dataclass`` whose fields are the options: :meth:`StructuredOpts.as_runopts` declares them
(type from the annotation, ``X | None`` read as ``X``; default from the field; required when it has none; help
from the string literal under the field), :meth:`StructuredOpts.from_cfg` reads a cfg into an instance
(each field also under its camelCase name; a field given under two spellings with different values is an
:class:`~tsm.errors.InvalidRunOptionError`; ``metadata={"cfg_key": "mail-user"}`` names a key no field can
have; a nested ``StructuredOpts`` field reads the ``name.``-prefixed keys). An instance is a read-only
mapping of its options (keys it was given but does not declare are kept and readable), and ``a | b`` merges
two into a dict. Fields whose names start with ``_`` are not options.
"""

from __future__ import annotations

import ast
import inspect
import re
import textwrap
import types
import typing
from collections.abc import Iterator, Mapping
from dataclasses import MISSING, Field, dataclass, field, fields
from typing import Any, Union

from tsm.errors import InvalidRunOptionError
from tsm.specs.runopts import CfgVal, runopts

__all__ = ["StructuredOpts", "camel_to_snake", "snake_to_camel"]


def snake_to_camel(name: str) -> str:
    """``cluster_name`` -> ``clusterName``."""
    head, *rest = name.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


def camel_to_snake(name: str) -> str:
    """``clusterName`` -> ``cluster_name``."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def _unwrap_optional(tp: Any) -> Any:
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if typing.get_origin(tp) in (Union, types.UnionType) and len(args) < len(typing.get_args(tp)):
        return args[0] if len(args) == 1 else Union[tuple(args)]  # noqa: UP007 (a runtime union)
    return tp


def _is_structured(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, StructuredOpts) and tp is not StructuredOpts


def _option_fields(obj: Any) -> list[Field[Any]]:
    return [f for f in fields(obj) if not f.name.startswith("_")]


@dataclass
class StructuredOpts(Mapping[str, CfgVal]):
    """Typed run options (see the module doc)."""

    _extra_cfg: dict[str, CfgVal] = field(default_factory=dict, repr=False, compare=False, kw_only=True)

    @classmethod
    def _hints(cls) -> dict[str, Any]:
        return {k: _unwrap_optional(v) for k, v in typing.get_type_hints(cls).items()}

    @classmethod
    def from_cfg(cls, cfg: Mapping[str, CfgVal]) -> Any:
        """An instance from ``cfg`` (snake or camel keys, nested groups by prefix; unknown keys kept)."""
        hints = cls._hints()
        kwargs: dict[str, Any] = {}
        for f in _option_fields(cls):
            tp = hints.get(f.name, str)
            if _is_structured(tp):
                nested = {k[len(f.name) + 1:]: v for k, v in cfg.items() if k.startswith(f.name + ".")}
                if nested or (f.default is MISSING and f.default_factory is MISSING):
                    kwargs[f.name] = tp.from_cfg(nested)
                continue
            key = f.metadata.get("cfg_key", f.name)
            spellings = [k for k in dict.fromkeys((key, f.name, snake_to_camel(f.name))) if k in cfg]
            if not spellings:
                continue
            value = cfg[spellings[0]]
            for other in spellings[1:]:
                if cfg[other] != value:
                    raise InvalidRunOptionError(
                        f"Run option `{key}` was passed under two spellings (`{spellings[0]}` and `{other}`) with "
                        f"conflicting values. Pass it once, as `{key}`")
            kwargs[f.name] = value
        opts = cls(**kwargs)
        opts._extra_cfg = {k: v for k, v in cfg.items() if k not in opts}
        return opts

    @classmethod
    def get_docstrings(cls) -> dict[str, str]:
        """``{field: the string literal under it}`` (nested groups as ``name.field``)."""
        docs: dict[str, str] = {}
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
        except (OSError, TypeError, SyntaxError):
            tree = None
        body = tree.body[0].body if tree is not None and isinstance(tree.body[0], ast.ClassDef) else []
        for node, after in zip(body, body[1:], strict=False):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(after, ast.Expr)
                    and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str)):
                docs[node.target.id] = inspect.cleandoc(after.value.value)
        hints = cls._hints()
        for f in _option_fields(cls):
            if _is_structured(hints.get(f.name)):
                docs.update({f"{f.name}.{k}": v for k, v in hints[f.name].get_docstrings().items()})
        return docs

    @classmethod
    def as_runopts(cls) -> runopts:
        """The options as :class:`~tsm.specs.runopts.runopts` (nested groups flattened as ``name.field``)."""
        opts = runopts()
        hints, docs = cls._hints(), cls.get_docstrings()
        for f in _option_fields(cls):
            tp = hints.get(f.name, str)
            if _is_structured(tp):
                for key, opt in tp.as_runopts():
                    opts.add(f"{f.name}.{key}", type_=opt.opt_type, help=opt.help, default=opt.default,
                             required=opt.is_required)
                continue
            required = f.default is MISSING and f.default_factory is MISSING
            opts.add(f.metadata.get("cfg_key", f.name), type_=tp, help=docs.get(f.name, f.name),
                     default=None if f.default is MISSING else f.default, required=required)
        return opts

    def __getitem__(self, key: str) -> CfgVal:
        if "." in key:
            prefix, rest = key.split(".", 1)
            nested = getattr(self, camel_to_snake(prefix), None)
            if isinstance(nested, StructuredOpts):
                return nested[rest]
            raise KeyError(key)
        names = {f.name for f in _option_fields(self)}
        if camel_to_snake(key) in names:
            return getattr(self, camel_to_snake(key))  # type: ignore[no-any-return]
        for f in _option_fields(self):
            if f.metadata.get("cfg_key") == key:
                return getattr(self, f.name)  # type: ignore[no-any-return]
        if key in self._extra_cfg:
            return self._extra_cfg[key]
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        hints = self._hints()
        for f in _option_fields(self):
            if _is_structured(hints.get(f.name)):
                nested = getattr(self, f.name)
                if nested is not None:
                    yield from (f"{f.name}.{k}" for k in nested)
            else:
                yield f.metadata.get("cfg_key", f.name)
        yield from self._extra_cfg

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, str):
            return False
        try:
            self[key]
        except KeyError:
            return False
        return True

    def __or__(self, other: StructuredOpts) -> dict[str, CfgVal]:  # type: ignore[override]
        """Both as one cfg dict, ``other`` winning a key both have."""
        return {**{k: self[k] for k in self}, **{k: other[k] for k in other}}
