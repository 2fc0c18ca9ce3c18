"""The dry run's text: a request's manifests as the YAML documents ``schedule`` creates, in order (the
Service, the Secret, each Job; a declared secret's value in the Secret as ``<secret>``: read at ``schedule``). Every string is quoted, so a YAML 1.1 reader (kubectl's) reads ``yes``,
``On``, ``NO`` or ``Null`` as the strings they are; needs no YAML library.
"""

from __future__ import annotations

import json
import re
from typing import Any

from tsm.schedulers.common.durations import format_duration
from tsm.schedulers.kubernetes.request import RANK0_VAR, KubernetesRequest
from tsm.schedulers.kubernetes.secrets import shown

#: plain words a YAML 1.1 reader takes for booleans or null (compared lower-case)
_YAML11_WORDS = {"y", "n", "yes", "no", "true", "false", "on", "off", "null", "~"}


def _yaml(obj: Any, indent: int = 0) -> list[str]:
    """A small YAML writer (block style, every string value quoted): exact under YAML 1.1 and 1.2 readers, and
    needs no YAML library. Keys stay plain only when they are plain identifiers no reader takes for anything else."""
    pad = "  " * indent
    lines: list[str] = []
    if isinstance(obj, dict):
        if not obj:
            return [pad + "{}"]
        for k, v in obj.items():
            plain = re.fullmatch(r"[A-Za-z][A-Za-z0-9_./-]*", k) and k.lower() not in _YAML11_WORDS
            key = k if plain else _quoted(k)
            if isinstance(v, (dict, list)) and v:
                lines.append(f"{pad}{key}:")
                lines += _yaml(v, indent + 1)
            else:
                lines.append(f"{pad}{key}: {_scalar(v)}")
    elif isinstance(obj, list):
        if not obj:
            return [pad + "[]"]
        for v in obj:
            if isinstance(v, (dict, list)) and v:
                sub = _yaml(v, indent + 1)
                lines.append(f"{pad}- {sub[0].lstrip()}")
                lines += sub[1:]
            else:
                lines.append(f"{pad}- {_scalar(v)}")
    else:
        lines.append(pad + _scalar(obj))
    return lines


def _scalar(v: Any) -> str:
    if isinstance(v, bool) or v is None or isinstance(v, (int, float)):
        return json.dumps(v)
    if isinstance(v, (dict, list)):
        return json.dumps(v)
    return _quoted(str(v))  # every string: YAML 1.1 reads plain yes/On/NO/Null/0x1f/1_000 as something else


def _quoted(s: str) -> str:
    """A YAML double-quoted scalar: printable characters as they are, the rest as YAML escapes."""
    out = ['"']
    for ch in s:
        o = ord(ch)
        if ch in '"\\':
            out.append("\\" + ch)
        elif (0x20 <= o <= 0x7E or 0xA0 <= o <= 0xD7FF) and o not in (0x2028, 0x2029) or (0xE000 <= o <= 0xFFFD and o != 0xFEFF) or o >= 0x10000:
            out.append(ch)
        elif o <= 0xFF:
            out.append(f"\\x{o:02x}")
        else:
            out.append(f"\\u{o:04x}")
    out.append('"')
    return "".join(out)


def to_yaml(manifest: dict[str, Any]) -> str:
    """One manifest as a YAML document."""
    return "\n".join(_yaml(manifest)) + "\n"


def format_request(req: KubernetesRequest) -> str:
    """The request as the YAML documents ``schedule`` creates, in order (``kubectl apply -f`` takes them)."""
    head = [
        f"# app {req.app_id} in namespace {req.namespace}: Service {req.app_id} (headless) + {len(req.jobs)} Job(s)",
        "# every Job gets ownerReferences -> the Service (its uid, known once created): deleting it deletes all",
        f"# rank 0: {RANK0_VAR} = Service DNS name; dns={req.dns}: without cluster DNS it becomes rank 0's pod IP",
        f"# gang_timeout {req.gang_timeout:g}s: not every replica Running by then -> deleted, FAILED with the reason",
    ]
    if req.stall_timeout is not None:
        head.append(f"# stall_timeout {format_duration(req.stall_timeout)} (no log line; no CPU where metrics.k8s.io "
                    f"answers), checked by tsm when it looks at the app; on_stall={req.on_stall}")
    if req.secrets:
        head.append(f"# secrets (read at submit into the Secret, never shown; k8s: the pod reads your Secret): "
                    f"{', '.join(req.secrets)}")
    for b in req.builds:
        what = "build" if b.get("build") else "reuse (already built)"
        head.append(f"# workspace image of role '{b['role']}': {what} {b['tag']} on {b['base_image']} "
                    f"from {b['snapshot']} (local Docker engine, the kubelet's runtime: no registry)")
    secret = shown(req)
    docs = [to_yaml(req.service)] + ([to_yaml(secret)] if secret else []) + [to_yaml(j) for j in req.jobs]
    return "\n".join(head) + "\n---\n" + "---\n".join(docs)
