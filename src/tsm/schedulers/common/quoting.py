"""Shell quoting for values written into generated scripts (sbatch scripts, container commands).

:func:`shell_quote` turns any string into one bash word that bash reads back byte for byte;
:func:`is_shell_name` says whether an env name can be set with ``export`` (else it needs ``env --``).
"""

from __future__ import annotations

import re
import shlex

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def is_shell_name(name: str) -> bool:
    """True when ``name`` is a shell variable name (``export NAME=...`` works)."""
    return bool(_IDENT.match(name))


def shell_quote(value: str) -> str:
    """Quote ``value`` as one bash word: ``shlex.quote``, or ``$'...'`` when it holds a carriage return.

    sbatch refuses a script with a CR-LF anywhere ("DOS line breaks"), so such values are written with
    bash's ANSI-C quoting, every control character as ``\\xHH``; bash turns them back into the same bytes.
    """
    if "\r" not in value:
        return shlex.quote(value)
    out = []
    for ch in value:
        if ch in "\\'":
            out.append("\\" + ch)
        elif ord(ch) < 32 or ord(ch) == 127:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return "$'" + "".join(out) + "'"
