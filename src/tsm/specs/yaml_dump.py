"""A small block-YAML emitter for TorchX's readable dump of an app's status (tsm does not depend on PyYAML)."""

from __future__ import annotations

import json
import re
from typing import Any

_PLAIN = re.compile(r"^[A-Za-z_/<][A-Za-z0-9_ ./()<>+-]*\Z")
_YAML_WORDS = {"null", "true", "false", "yes", "no", "on", "off", "y", "n", "~"}


def _yaml_scalar(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    text = str(v)
    if _PLAIN.match(text) and text.lower() not in _YAML_WORDS and not text.endswith(" "):
        return text
    return json.dumps(text) if text else "''"  # a JSON string is a valid YAML scalar; '' as YAML writers write it


def to_yaml(obj: Any, indent: int = 0) -> str:
    """``obj`` (dicts, lists, scalars) as block YAML with sorted keys, ending in a newline."""
    pad = " " * indent
    if isinstance(obj, dict):
        if not obj:
            return pad + "{}\n"
        out = []
        for k in sorted(obj):
            v = obj[k]
            if isinstance(v, (dict, list)) and v:
                out.append(f"{pad}{k}:\n" + to_yaml(v, indent + 2))
            else:
                out.append(f"{pad}{k}: {'{}' if v == {} else '[]' if v == [] else _yaml_scalar(v)}\n")
        return "".join(out)
    if isinstance(obj, list):
        out = []
        for v in obj:
            body = to_yaml(v, indent + 2) if isinstance(v, (dict, list)) and v else " " * (indent + 2) + _yaml_scalar(v) + "\n"
            out.append(pad + "- " + body[indent + 2:])
        return "".join(out)
    return pad + _yaml_scalar(obj) + "\n"
