"""Typed scheduler run options: declared once with a type, default and help; resolved against user cfg.

A scheduler declares its options with :meth:`runopts.add`; :meth:`runopts.resolve` checks a user's
``cfg`` (wrong types name the expected type, required options must be given) and fills in defaults.
As in TorchX, a cfg may be shared by several schedulers, so a key this scheduler does not declare is
ignored, with a warning on the ``tsm`` logger that names it and suggests the closest option (a typo
stays visible); :meth:`runopts.check_known` is the strict check for callers that want an error.
:func:`parse_cfg_value` reads the command line's string forms: ``a,b`` for ``list[str]`` and
``k:v,k2:v2`` for ``dict[str, str]``; :meth:`runopts.cfg_from_str` a whole ``"k=v,k2=a;b"`` string.
Option types may be written ``list[str]`` or ``typing.List[str]`` (and ``dict``/``Dict``).
"""

from __future__ import annotations

import math
import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from tsm._logging import warn as _warn
from tsm.errors import InvalidRunOptionError, RunOptionDefaultError, brief, did_you_mean

CfgVal = str | int | float | bool | list[str] | dict[str, str] | None


#: ``typing`` spellings of the container types, as TorchX schedulers declare them.
_ALIASES: dict[Any, Any] = {typing.List[str]: list[str], typing.Dict[str, str]: dict[str, str]}  # noqa: UP006


def normalize_type(type_: Any) -> Any:
    """``typing.List[str]`` as ``list[str]`` and ``typing.Dict[str, str]`` as ``dict[str, str]``; others as given."""
    try:
        return _ALIASES.get(type_, type_)
    except TypeError:  # an unhashable "type"
        return type_

_TYPES: dict[Any, str] = {
    str: "str",
    int: "int",
    float: "float",
    bool: "bool",
    list[str]: "list[str]",
    dict[str, str]: "dict[str, str]",
}


def type_name(type_: Any) -> str:
    """The name of a run-option type as users read it (``list[str]``)."""
    type_ = normalize_type(type_)
    return _TYPES.get(type_, getattr(type_, "__name__", str(type_)))


def get_type_name(tp: Any) -> str:
    """TorchX's ``get_type_name``: a class's ``__name__`` (``int``, ``list``), any other type as ``str()`` writes it
    (``typing.List[int]``, ``typing.Union[str, int]``)."""
    return tp.__name__ if isinstance(tp, type) and not typing.get_args(tp) else str(tp)


def is_type(value: Any, type_: Any) -> bool:
    """True when ``value`` is of run-option type ``type_`` (bool is not an int; an int is a float)."""
    type_ = normalize_type(type_)
    if type_ is bool:
        return isinstance(value, bool)
    if type_ is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if type_ is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if type_ is str:
        return isinstance(value, str)
    if type_ == list[str]:
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    if type_ == dict[str, str]:
        return isinstance(value, dict) and all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()
        )
    raise InvalidRunOptionError(f"unsupported run option type {type_!r}")


def parse_cfg_value(name: str, text: str, type_: Any) -> CfgVal:
    """Parse the command-line string form of option ``name`` into ``type_``; raise a clear error if it can't."""
    type_ = normalize_type(type_)
    try:
        if type_ is str:
            return text
        if type_ is bool:
            low = text.strip().lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise ValueError(text)
        if type_ is int:
            return int(text)
        if type_ is float:
            value = float(text)
            if not math.isfinite(value):  # "nan", "inf", "1e999": no option means a time or size of those
                raise ValueError(text)
            return value
        if type_ == list[str]:
            return [p for p in (s.strip() for s in text.split(",")) if p]
        if type_ == dict[str, str]:
            out: dict[str, str] = {}
            for pair in filter(None, (s.strip() for s in text.split(","))):
                k, sep, v = pair.partition(":")
                if not sep or not k:
                    raise ValueError(pair)
                out[k.strip()] = v.strip()
            return out
    except ValueError:
        pass
    else:
        raise InvalidRunOptionError(f"run option '{name}' has unsupported type {type_!r}")
    example = {bool: "true or false", list[str]: "a,b,c", dict[str, str]: "key:value,key2:value2"}
    hint = f" ({example[type_]})" if type_ in example else ""
    raise InvalidRunOptionError(f"run option '{name}' expects {type_name(type_)}{hint}, got {text!r}")


def _as_float(name: str, value: Any) -> float:
    """``value`` as a finite float: NaN and infinities (which TOML can spell) are refused like a wrong type."""
    try:
        out = float(value)
    except OverflowError:
        raise InvalidRunOptionError(f"run option '{name}' expects float, got an integer too large for one") from None
    if not math.isfinite(out):
        raise InvalidRunOptionError(f"run option '{name}' expects a finite float, got {out}")
    return out


@dataclass(frozen=True)
class runopt:  # noqa: N801 (mirrors the runopts container name)
    """One declared option: its type, default, whether it is required, and its help.

    A ``trusted`` option names something whose content runs code on this machine (a kubeconfig's ``exec``
    credential plugin): it is taken from the command line, the API and the user's own config files only,
    never from a project file found in the working directory.
    """

    name: str
    type_: Any
    default: CfgVal
    required: bool
    help: str
    trusted: bool = False

    @property
    def opt_type(self) -> Any:
        """TorchX's name for :attr:`type_`."""
        return self.type_

    @property
    def is_required(self) -> bool:
        """TorchX's name for :attr:`required`."""
        return self.required


class runopts:  # noqa: N801 (established name)
    """The options a scheduler accepts; printing it gives a help table."""

    def __init__(self) -> None:
        self._opts: dict[str, runopt] = {}

    #: ``runopts.is_type(value, type_)``, as TorchX spells it.
    is_type = staticmethod(is_type)

    def add(
        self,
        cfg_key: str,
        type_: Any,
        help: str,
        default: CfgVal = None,
        required: bool = False,
        trusted: bool = False,
    ) -> None:
        """Declare option ``cfg_key``; a required option may not have a default; ``trusted``: see :class:`runopt`."""
        name = cfg_key
        type_ = normalize_type(type_)
        if type_ not in _TYPES:
            raise InvalidRunOptionError(
                f"run option '{name}': type must be one of {', '.join(_TYPES.values())}"
            )
        if required and default is not None:
            raise InvalidRunOptionError(f"run option '{name}' is required and so cannot have a default")
        if type_ == dict[str, str] and default == []:
            default = {}  # TorchX's "empty" for a dict option (its type check lets any list of strings pass)
        if default is not None and type_ is int and isinstance(default, float) and default.is_integer():
            # TorchX's plugins declare e.g. ``add("timeout", int, default=60.0)``; refusing it would stop the
            # plugin's scheduler from being created at all
            _warn(
                f"run option '{name}': default {default!r} is a float, not an int; accepted as a whole number "
                "(values given on the command line must still be whole numbers)"
            )
        elif default is not None and not is_type(default, type_):
            raise RunOptionDefaultError(
                f"run option '{name}': default {default!r} is not of type {type_name(type_)}"
            )
        if type_ is float and default is not None:
            default = _as_float(name, default)  # an int default of a float option resolves as a float
        self._opts[name] = runopt(name, type_, default, required, help, trusted)

    def get(self, name: str) -> runopt | None:
        """The declared option ``name``, or None."""
        return self._opts.get(name)

    def __iter__(self) -> Iterator[tuple[str, runopt]]:
        return iter(self._opts.items())

    def __len__(self) -> int:
        return len(self._opts)

    def __contains__(self, name: object) -> bool:
        return name in self._opts

    def update(self, other: runopts) -> None:
        """Add every option of ``other`` (later declarations win)."""
        self._opts.update(other._opts)

    def resolve(self, cfg: Mapping[str, CfgVal] | None, *, ignore_unknown: bool = True) -> dict[str, CfgVal]:
        """Check ``cfg`` against the declarations and return it complete with defaults.

        String values for non-string options are parsed with :func:`parse_cfg_value`, so config files
        and the command line may give ``"true"`` or ``"a,b"``. A key this scheduler does not declare is kept
        as it is (TorchX's rule: the cfg is the union of several schedulers' options), with a warning;
        ``ignore_unknown=False`` (TorchX nightly's keyword) refuses it instead, as :meth:`check_known` does.
        """
        cfg = dict(cfg or {})
        if not ignore_unknown:
            self.check_known(cfg)
        out: dict[str, CfgVal] = {}
        for key in cfg:
            if key not in self._opts:
                _warn("%s; ignored by this scheduler", self._unknown_message(key))
                out[key] = cfg[key]  # passed on unchecked: a cfg may be shared by several schedulers
        for name, opt in self._opts.items():
            if name in cfg and cfg[name] is not None:
                val = cfg[name]
                if isinstance(val, str) and opt.type_ is not str:
                    val = parse_cfg_value(name, val, opt.type_)
                if not is_type(val, opt.type_):
                    raise InvalidRunOptionError(
                        f"run option '{name}' expects {type_name(opt.type_)}, got {type(val).__name__} {brief(val)}"
                    )
                if opt.type_ is float:
                    val = _as_float(name, val)
                out[name] = val
            elif opt.required:
                raise InvalidRunOptionError(
                    f"run option '{name}' is required: pass it with -c {name}=<{type_name(opt.type_)}> ({opt.help})"
                )
            else:
                out[name] = opt.default
        return out

    def _unknown_message(self, key: str) -> str:
        known = ", ".join(sorted(self._opts)) or "none"
        return f"unknown run option '{key}'{did_you_mean(key, self._opts)}; known options: {known}"

    def check_known(self, cfg: Mapping[str, Any]) -> None:
        """Raise :class:`~tsm.errors.InvalidRunOptionError` for the first key of ``cfg`` not declared here."""
        for key in cfg:
            if key not in self._opts:
                raise InvalidRunOptionError(self._unknown_message(key))

    def cfg_from_str(self, cfg_str: str) -> dict[str, CfgVal]:
        """Parse ``"k=v,k2=v2"`` (``,`` or ``;`` between pairs) into typed values; no defaults are added.

        A piece without ``=`` continues the previous value, so list options read ``FOO=a,b;BAR=c`` as
        ``{"FOO": ["a", "b"], "BAR": "c"}``. Keys this scheduler does not declare are left out with a
        warning naming them, as in TorchX; values are checked and typed as :func:`parse_cfg_value` does.
        """
        pairs: dict[str, str] = {}
        last: str | None = None
        for piece in cfg_str.replace(";", ",").split(","):
            key, sep, value = piece.partition("=")
            if sep and key.strip():
                last = key.strip()
                pairs[last] = value.strip()
            elif last is not None:
                if piece.strip():
                    pairs[last] = f"{pairs[last]},{piece.strip()}" if pairs[last] else piece.strip()
            elif piece.strip():
                raise InvalidRunOptionError(f"run options {brief(cfg_str)}: {brief(piece)} is not key=value")
        out: dict[str, CfgVal] = {}
        for key, text in pairs.items():
            opt = self._opts.get(key)
            if opt is None:
                _warn("%s; ignored", self._unknown_message(key))
                continue
            out[key] = parse_cfg_value(key, text, opt.type_)
        return out

    def __str__(self) -> str:
        if not self._opts:
            return "    (no run options)"
        rows = [("name", "type", "default", "help")]
        for name, o in self._opts.items():
            default = "(required)" if o.required else repr(o.default)
            rows.append((name, type_name(o.type_), default, o.help))
        widths = [max(len(r[i]) for r in rows) for i in range(3)]
        return "\n".join(
            "    " + "  ".join(c.ljust(w) for c, w in zip(r[:3], widths, strict=True)) + "  " + r[3] for r in rows
        )

    def __repr__(self) -> str:
        return f"runopts({list(self._opts)})"
