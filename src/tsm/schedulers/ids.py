"""TorchX's ``schedulers.ids``: unique, Kubernetes-safe app ids (``make_unique``, ``random_id``).

A suffix is lower-case letters and digits only and starts with a letter, so ``name-suffix`` is a valid
Kubernetes object name, Slurm job name and Docker container name whatever the scheduler.
"""

from __future__ import annotations

import os
import string

_FIRST = string.ascii_lowercase
_REST = string.ascii_lowercase + string.digits


def random_uint64() -> int:
    """A random unsigned 64-bit int from the OS's entropy source."""
    return int.from_bytes(os.urandom(8), "big")


def random_id() -> str:
    """A random id from 64 bits of entropy: starts with a letter, then letters and digits."""
    v = random_uint64()
    out = _FIRST[v % len(_FIRST)]
    v //= len(_FIRST)
    while v:
        out += _REST[v % len(_REST)]
        v //= len(_REST)
    return out


def get_len_random_id(string_length: int) -> str:
    """A random id of exactly ``string_length`` characters (letters and digits, a letter first)."""
    if string_length <= 0:
        return ""
    data = os.urandom(string_length)
    return _FIRST[data[0] % len(_FIRST)] + "".join(_REST[b % len(_REST)] for b in data[1:])


def make_unique(name: str, string_length: int = 0) -> str:
    """``name-<suffix>``: a random suffix (:func:`random_id`, or ``string_length`` characters when > 0)."""
    suffix = get_len_random_id(string_length) if string_length > 0 else random_id()
    return f"{name}-{suffix}"
