"""Overlays: patches of a scheduler's request for fields an AppDef or Role cannot express (TorchX's nightly ``specs.overlays``).

A user stores an overlay on a role (or app) with :func:`set_overlay`; the scheduler reads it back with
:func:`get_overlay`, checks it with :func:`validate_overlay` and merges it into the request it built with
:func:`apply_overlay`, so a dry run shows the patched request::

    set_overlay(role, "kubernetes", "V1Pod", {"spec": {"nodeSelector": {"accelerator": "a100"}}})

Merge rules (:func:`apply_overlay`): dicts merge key by key (recursively), lists append, anything else is
replaced; a tuple replaces a list (TorchX's older spelling of PUT). Operators, used as dict keys, change
that for one field: ``PUT(field)`` replaces the value whole, ``JOIN(field, on="name")`` merges the items of
a list of dicts that have the same ``on`` value (the others are appended), ``DEL(field)`` removes the key.
``"field": None`` is different from ``DEL``: it sets the field to null. A list or dict met by a value of
another kind is a ``TypeError``; other kinds replace each other.

Where overlays live: ``target.metadata[namespace][kind]`` (``metadata["kubernetes"]["V1Pod"]``). Several
:func:`set_overlay` calls accumulate with the same rules, keeping operators as written (the last operator
for a field wins), so they are resolved only when the scheduler applies them. A ``metadata[namespace]``
without ``kind`` that is a single flat dict is returned as the overlay (TorchX's older flat form).

This follows TorchX's ``torchx/specs/overlays.py`` as published in its nightly (2026). Overlay *files*
(``metadata[namespace]`` given as a path or URI) are not read here: load the file and pass the dict.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

logger = logging.getLogger(__name__)

__all__ = ["DEL", "JOIN", "PUT", "apply_overlay", "get_overlay", "set_overlay", "validate_overlay"]

_PUT = "__put__:"
_JOIN = "__join__:"
_DEL = "__del__:"


def PUT(key: str) -> str:  # noqa: N802 (TorchX's operator names)
    """The overlay key that replaces ``key``'s value whole (a list is not appended to, a dict not merged)."""
    return _PUT + key


def JOIN(key: str, *, on: str) -> str:  # noqa: N802
    """The overlay key that merges the list ``key`` item by item, matching dicts on their ``on`` field."""
    return f"{_JOIN}{key}:{on}"


def DEL(key: str) -> str:  # noqa: N802
    """The overlay key that removes ``key`` from the request (its value is ignored; write ``None``)."""
    return _DEL + key


def _field(key: str) -> str:
    """The field an overlay key is about: the key itself, or the field inside an operator."""
    for prefix in (_PUT, _DEL):
        if key.startswith(prefix):
            return key[len(prefix):]
    if key.startswith(_JOIN):
        return key[len(_JOIN):].split(":", 1)[0]
    return key


def _drop_field(base: dict[str, Any], field: str, keep: str | None = None) -> None:
    for k in [k for k in base if _field(k) == field and k != keep]:
        del base[k]


def _join(base: dict[str, Any], key: str, value: object, field: str) -> None:
    _drop_field(base, field, keep=field)
    _, _, on = key[len(_JOIN):].partition(":")
    if not on:
        raise ValueError(f"malformed JOIN key: `{key}`, expected the form JOIN(field, on=key)")
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise TypeError(f"JOIN needs a list of dicts as the overlay of `{field}`, got {type(value).__name__}")
    if field not in base:
        base[field] = copy.deepcopy(value)
        return
    current = base[field]
    if not isinstance(current, list) or not all(isinstance(v, dict) for v in current):
        raise TypeError(f"JOIN needs base[`{field}`] to be a list of dicts, got {type(current).__name__}")
    by_key = {item[on]: item for item in current if on in item}
    for item in value:
        match = by_key.get(item[on]) if on in item else None
        if match is None:
            current.append(copy.deepcopy(item))
        else:
            match.update({k: copy.deepcopy(v) for k, v in item.items() if k != on})


def _merge(base: dict[str, Any], key: str, value: object, resolve: bool) -> None:
    if key not in base:
        base[key] = list(value) if isinstance(value, tuple) else copy.deepcopy(value)
        return
    current = base[key]
    if isinstance(current, dict) and isinstance(value, dict):
        apply_overlay(current, value, _resolve=resolve)
    elif isinstance(current, list) and isinstance(value, tuple):
        base[key] = list(value)
    elif isinstance(current, list) and isinstance(value, list):
        current.extend(copy.deepcopy(value))
    elif isinstance(current, (dict, list)) or isinstance(value, (dict, list)):
        if type(current) is not type(value):
            raise TypeError(f"type mismatch for attr: `{key}`. {type(current).__qualname__} != {type(value).__qualname__}")
    else:
        base[key] = value


def apply_overlay(base: dict[str, Any], overlay: dict[str, Any], *, _resolve: bool = True) -> None:
    """Merge ``overlay`` into ``base`` in place, with the rules and operators of the module docstring.

    ``_resolve=False`` keeps operator keys as written (how :func:`set_overlay` accumulates); schedulers
    leave it alone.
    """
    for key, value in overlay.items():
        field = _field(key)
        if _resolve and key.startswith(_DEL):
            _drop_field(base, field)
            continue
        if _resolve and key.startswith(_PUT):
            _drop_field(base, field)
            base[field] = copy.deepcopy(value)
            continue
        if _resolve and key.startswith(_JOIN):
            _join(base, key, value, field)
            continue
        _drop_field(base, field, keep=key)  # an earlier operator (or plain key) for this field is superseded
        _merge(base, key, value, _resolve)


def set_overlay(target: Any, namespace: str, kind: str, overlay: dict[str, Any]) -> None:
    """Add ``overlay`` to ``target.metadata[namespace][kind]`` (a Role or AppDef), accumulating with earlier ones."""
    metadata: dict[str, Any] = target.metadata
    ns = metadata.get(namespace)
    if not isinstance(ns, dict):
        if ns is not None:
            logger.warning("replacing the %s value of metadata[%r] with overlays", type(ns).__name__, namespace)
        ns = metadata[namespace] = {}
    existing = ns.get(kind)
    if not isinstance(existing, dict):
        existing = ns[kind] = {}
    apply_overlay(existing, overlay, _resolve=False)


def get_overlay(target: Any, namespace: str, kind: str) -> dict[str, Any]:
    """The overlay stored as ``target.metadata[namespace][kind]``; ``{}`` when there is none.

    A ``metadata[namespace]`` dict without ``kind`` that is not several kinds' dicts is itself the overlay
    (the older flat form), with a warning.
    """
    ns = target.metadata.get(namespace)
    if not isinstance(ns, dict):
        if isinstance(ns, str):
            raise ValueError(f"metadata[{namespace!r}] is {ns!r}: overlay files are not read here; load it and "
                             "pass the dict to set_overlay")
        return {}
    if isinstance(ns.get(kind), dict):
        return ns[kind]  # type: ignore[no-any-return]
    nested = len(ns) > 1 and all(isinstance(v, dict) for v in ns.values())
    if ns and not nested:
        logger.warning("overlay kind %r not in metadata[%r]; using it as a flat overlay (use set_overlay(target, %r, "
                       "%r, overlay) for the nested form)", kind, namespace, namespace, kind)
        return ns
    return {}


def validate_overlay(
    overlay: dict[str, Any],
    *,
    blocklist: list[str] | None = None,
    forbidden_keys: set[str] | None = None,
    overlay_name: str = "overlay",
    suggestion: str = "",
) -> None:
    """``ValueError`` if the overlay sets a field of ``blocklist`` (set it on the role) or of ``forbidden_keys``."""
    if blocklist:
        bad = [_field(k) for k in overlay if _field(k) in blocklist]
        if bad:
            names = ", ".join(f"`{overlay_name}.{k}`" for k in bad)
            raise ValueError(f"disallowed overlay attributes {names} since they can be set directly on the role's attributes.")
    if forbidden_keys:
        misplaced = {_field(k) for k in overlay} & forbidden_keys
        if misplaced:
            msg = f"{overlay_name} overlay contains misplaced keys: {misplaced}."
            raise ValueError(f"{msg} {suggestion}" if suggestion else msg)
