"""TorchX's ``torchx.util.types`` helpers that tools import: :func:`none_throws`, :func:`to_dict`, :func:`to_list`.

``to_dict`` is the parser behind ``-c env=FOO=v1,BAR=v2`` style values: pairs are separated by ``,`` or
``;``; a value may itself be a list (``FOO=v1,v2,BAR=v3`` gives ``FOO`` the text ``"v1,v2"``: a piece
without ``=`` belongs to the value before it, and the delimiter in front of the next key is dropped); a
value in single or double quotes keeps ``=``, ``,`` and ``;`` as text. Malformed text raises
``ValueError`` as TorchX's does.
"""

from __future__ import annotations

from typing import TypeVar

_T = TypeVar("_T")

_DELIMS = ",;"
_QUOTES = "'\""


def none_throws(optional: _T | None, message: str = "Unexpected `None`") -> _T:
    """``optional`` itself, or ``AssertionError(message)`` when it is None (TorchX's and pyre's helper)."""
    if optional is None:
        raise AssertionError(message)
    return optional


def to_list(arg: str) -> list[str]:
    """``"a, b,c"`` -> ``["a", "b", "c"]``; blank text is the empty list."""
    if not arg.strip():
        return []
    return [piece.strip() for piece in arg.split(",")]


def _pieces(arg: str) -> list[tuple[str, str, bool]]:
    """Split at unquoted ``,``/``;``: ``(delimiter before the piece, piece, piece has an unquoted '=')``."""
    out: list[tuple[str, str, bool]] = []
    quote = ""
    delim, start, has_eq = "", 0, False
    for i, ch in enumerate(arg):
        if quote:
            if ch == quote:
                quote = ""
        elif ch in _QUOTES:
            quote = ch
        elif ch == "=":
            has_eq = True
        elif ch in _DELIMS:
            out.append((delim, arg[start:i], has_eq))
            delim, start, has_eq = ch, i + 1, False
    out.append((delim, arg[start:], has_eq))
    return out


def _unquote(val: str) -> str:
    val = val.strip()
    if len(val) >= 2 and val[0] == val[-1] and val[0] in _QUOTES:
        return val[1:-1]
    return val


def to_dict(arg: str) -> dict[str, str]:
    """Parse ``"FOO=v1,v2;BAR=v3"`` into ``{"FOO": "v1,v2", "BAR": "v3"}`` (rules in the module docstring)."""
    result: dict[str, str] = {}
    if not arg:
        return result
    key: str | None = None
    raw: dict[str, str] = {}
    for delim, piece, has_eq in _pieces(arg):
        if has_eq:
            k, _, v = piece.partition("=")
            key = k.strip()
            if not key:
                raise ValueError(f"`{arg}`: a value has no key before its '='")
            raw[key] = v
        elif key is None:
            raise ValueError(f"`{arg}` does not have at least one `key=value` pair")
        elif not piece.strip():
            raise ValueError(f"`{arg}`: empty list element after `{key}`")
        else:
            raw[key] += delim + piece
    for k, v in raw.items():
        result[k] = _unquote(v)
    return result
