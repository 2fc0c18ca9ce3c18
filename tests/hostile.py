"""The hostile-input corpus every hardening test shares: values that must arrive intact, and values that must be refused.

On the import path through ``pythonpath = ["tests"]``: ``from hostile import args, env, ...``.

*Delivered byte for byte* (as arguments and as env values, to local and Slurm replicas alike):
quotes, ``$()``, backticks, ``;``, ``&&``, ``|``, newlines, CR, tabs, ``#SBATCH`` lines, Slurm's ``%j``
patterns, ``${HOME}``, leading ``-``, 100 KB strings, bytes that are not UTF-8 (``os.fsdecode`` text with
surrogate escapes), combining, right-to-left, emoji and zero-width unicode, and the empty string. (tsm's
own macros, ``${app_id}`` and the like, are substituted by design and so are not in it.)
Payloads that would run a command try to create the file ``marker`` names, so a test passes a marker of
its own and checks it never appears: no shell ever ran them.

*Refused* with :class:`tsm.errors.InvalidAppError` naming the role and the field, before anything is
written (:func:`refused`): a NUL byte anywhere in an argument, an env name or value, or the entrypoint; a
lone surrogate that stands for no byte; one string longer than Linux's ``MAX_ARG_STRLEN``; a role whose
strings together exceed ``ARG_MAX``. Also :data:`BAD_NAMES` (app, role and session names) and
:data:`BAD_HANDLES` (handles that try to leave their directory).
"""

from __future__ import annotations

import os
from typing import Any

from tsm.specs.validate import MAX_ARG_BYTES

#: The file payloads try to create when no test-specific marker is given.
PWNED = "/tmp/tsm-pwned"

#: Values that need no marker: shell syntax, quoting, control characters, Slurm patterns, unicode, bytes.
PLAIN: list[str] = [
    "",
    " ",
    "a b",
    "plain",
    "'",
    '"',
    "'\"'",
    "'single' \"double\"",
    "\\",
    "\\'",
    "\\n",
    "back\\slash",
    # line breaks and other control characters
    "\n",
    "a\nb\n",
    "line1\nline2",
    "\r",
    "a\rb",
    "\r\n",
    "crlf\r\nline",
    "\t",
    "tab\there",
    "\x0b\x0c",
    "\x01\x1b[31mred\x1b[0m\x7f",
    "\x85",  # NEL: a line break to str.splitlines
    "\u2028\u2029",  # line and paragraph separators
    # shell syntax
    ";",
    "&&",
    "||",
    "|",
    "&",
    ">",
    "<",
    ">>/dev/null",
    "*",
    "?",
    "[a]",
    "~",
    "~root",
    "#",
    "!",
    "!!",
    "{a,b}",
    "a=b",
    "=",
    "; rm -rf / ;",
    "a && b || c",
    "$HOME",
    "${HOME}",
    "${HOME} $HOME",
    "$$",
    "$?",
    "$0",
    "$1",
    "$@",
    "$((1+1))",
    "$'\\x41'",
    "${IFS}",
    "$(echo INJECTED >&2)",
    "`echo INJECTED >&2`",
    # batch-script syntax: sbatch directives and Slurm filename patterns
    "#SBATCH --wrap=bad",
    "\n#SBATCH --output=/dev/null",
    "%j",
    "%t",
    "%%",
    "%x",
    "%A_%a",
    "%N %u %2j",
    # leading dashes: options to nobody
    "-",
    "--",
    "-c",
    "-rf",
    "--help",
    "--flag=value",
    "-n5",
    # unicode
    "\u00e9",
    "e\u0301",  # e + combining acute
    "\u65e5\u672c\u8a9e",
    "\u05e9\u05dc\u05d5\u05dd",  # Hebrew (right to left)
    "\u0645\u0631\u062d\u0628\u0627",  # Arabic (right to left)
    "\u202eright-to-left override\u202c",
    "\U0001f642",
    "\U0001f469\u200d\U0001f4bb",  # emoji joined by a zero-width joiner
    "\u200b",
    "zero\u200bwidth\u200c\u200d",
    "\ufeffbom",
    "\u00a0nbsp",
    "\U0010ffff",
    # bytes that are not UTF-8, as Python holds them (os.fsdecode: surrogate escapes)
    os.fsdecode(b"\xff\xfe"),
    os.fsdecode(b"a\x80b\xc3"),
    os.fsdecode(b"\xed\xa0\x80"),  # a UTF-8-encoded surrogate
    os.fsdecode(b"\xc0\xaf"),  # an overlong '/'
    os.fsdecode(b"latin-1 caf\xe9"),
]

#: Strings of 100 KB (each below Linux's 128 KiB per-argument limit).
LONG: list[str] = [
    "x" * 100_000,
    ("'$(`\"\\\n;|&\u00e9%j " * 10_000)[:50_000],  # hostile characters, multi-byte ones included: ~100 KB
]

#: Environment names that are not shell identifiers, yet are valid (the replica must see them as given).
ODD_ENV_NAMES: list[str] = [
    "--unset",  # first: must not become an option of env(1), which would unset PATH (see env())
    "-i",
    "odd.name",
    "with space",
    "1digit",
    "x-dash",
    "\u00fcn\u00efc\u00f6d\u00e9",
    "new\nline",
    os.fsdecode(b"K\xff"),
]


def payloads(marker: str) -> list[str]:
    """Values that would create ``marker`` if any shell, ``eval`` or ``env -S`` ever interpreted them."""
    m = marker
    return [
        f"$(touch {m})",
        f"`touch {m}`",
        f"'; touch {m} #",
        f'"; touch {m}; "',
        f"a; touch {m}",
        f"a && touch {m}",
        f"a | touch {m}",
        f"a\ntouch {m}\n",
        f"a\r\ntouch {m}",
        f"\n#SBATCH --wrap='touch {m}'\ntouch {m}",
        f"${{IFS}}touch${{IFS}}{m}",
        f"-S touch {m}",
    ]


def args(marker: str = PWNED) -> list[str]:
    """The whole corpus, in order: every value a replica must receive exactly as given."""
    return [*PLAIN, *payloads(marker), *LONG]


def env(marker: str = PWNED) -> dict[str, str]:
    """The corpus as env values (``E_000``, ``E_001``, ...), plus odd but valid names, each with a hostile value."""
    out = {f"E_{i:03d}": v for i, v in enumerate(args(marker))}
    out.update({name: f"$(touch {marker}) {name}" for name in ODD_ENV_NAMES})
    out["--unset"] = "PATH"
    return out


# -- refused ----------------------------------------------------------------------------------------------
#: Strings no process can receive: a NUL byte anywhere, or a lone surrogate that stands for no byte.
NUL_VALUES: list[str] = ["\x00", "a\x00b", "trailing\x00", "\x00" + "x" * 100_000]
UNENCODABLE: list[str] = ["\ud800", "a\udfffb"]
#: One byte longer than Linux passes in one argument or environment entry.
TOO_LONG = "x" * (MAX_ARG_BYTES + 1)


def refused() -> list[tuple[str, str, dict[str, Any]]]:
    """``(case, field the error must name, Role keyword arguments)`` for every value that must be refused.

    The role is always named ``r``; a test builds ``Role("r", **{"entrypoint": "true", **kwargs})``.
    """
    cases: list[tuple[str, str, dict[str, Any]]] = []
    for i, bad in enumerate([*NUL_VALUES, *UNENCODABLE]):
        cases += [
            (f"arg {i}", "args[1]", {"args": ["ok", bad]}),
            (f"env value {i}", "env['E']", {"env": {"OK": "v", "E": bad}}),
            (f"env name {i}", "env name", {"env": {f"K{bad}": "v"}}),
            (f"entrypoint {i}", "entrypoint", {"entrypoint": f"true{bad}"}),
        ]
    cases += [
        ("arg too long", "args[0]", {"args": [TOO_LONG]}),
        ("env value too long", "env['E']", {"env": {"E": TOO_LONG}}),
        ("entrypoint too long", "entrypoint", {"entrypoint": TOO_LONG}),
        ("too much in total", "ARG_MAX", {"args": ["y" * 120_000] * 60}),  # 7.2 MB: over any Linux limit
    ]
    return cases


#: App, role and session names that must be refused (they become paths, process titles, host labels).
BAD_NAMES: list[str] = [
    "",
    ".",
    "..",
    "../x",
    "a/b",
    "/abs",
    "a\\b",
    "a b",
    " a",
    "a ",
    "a\tb",
    "a\nb",
    "a\n",
    "a\rb",
    "a\x00b",
    "a\x1bb",
    "a\x7f",
    "-a",
    "_a",
    "a.b",
    "a:b",
    "a%2fb",
    "$(id)",
    "x" * 64,
    "\u00e9",
    "tr\u0430iner",  # Cyrillic a
    "\uff54rainer",  # fullwidth t
    "a\u200b",  # zero-width space
    "\u0661",  # Arabic-Indic digit one
    os.fsdecode(b"a\xff"),
]

#: Handles that try to reach outside their directory, or are not handles at all.
BAD_HANDLES: list[str] = [
    "local://x/../../etc",
    "local://default/..",
    "local://default/.",
    "local://../x",
    "local://./x",
    "local:///..",
    "local:///etc/passwd",
    "local://default/a/b",
    "local://default/../../../../etc/passwd",
    "local://default/a%2fb",
    "local://default/a%2F..%2F..",
    "local://default/a\x00b",
    "local://default/a\nb",
    "local://default/a b",
    "local://default/\u2024\u2024",  # one-dot leaders that look like ".."
    "local://default/\uff0e\uff0e",  # fullwidth full stops
    "local://default/" + "a" * 256,
    "local://default/" + "a" * 100_000,
    "local://" + "s" * 256 + "/a",
    "slurm://default/../1",
    "slurm://default/1/..",
    "file:///etc/passwd",
    "../local://default/x",
    "",
]


# -- checking what a replica received ---------------------------------------------------------------------
#: Python code a replica runs (``python -c DUMP ARGS...``): prints one JSON line with the exact bytes of its
#: arguments and environment, hex-encoded, so nothing is lost to decoding on the way back.
DUMP = (
    "import json, os, sys; sys.stdout.write(json.dumps({"
    "'argv': [os.fsencode(a).hex() for a in sys.argv[1:]], "
    "'env': {os.fsencode(k).hex(): os.fsencode(v).hex() for k, v in os.environ.items()}}) + '\\n')"
)


def read_dump(text: str) -> tuple[list[bytes], dict[bytes, bytes]]:
    """The argv and environment bytes a :data:`DUMP` replica printed (the last JSON line of ``text``)."""
    import json

    line = [ln for ln in text.splitlines() if ln.startswith("{")][-1]
    data = json.loads(line)
    return [bytes.fromhex(a) for a in data["argv"]], {
        bytes.fromhex(k): bytes.fromhex(v) for k, v in data["env"].items()
    }


def _show(b: bytes | None) -> str:
    if b is None:
        return "missing"
    return repr(b) if len(b) <= 60 else f"{b[:40]!r}... ({len(b)} bytes)"


def mismatches(
    argv: list[bytes], environ: dict[bytes, bytes], want_args: list[str], want_env: dict[str, str]
) -> list[str]:
    """What differs between what a replica received and what it was given (empty when byte-exact)."""
    out = []
    want_argv = [os.fsencode(a) for a in want_args]
    if len(argv) != len(want_argv):
        out.append(f"{len(argv)} arguments arrived, {len(want_argv)} were given")
    for i, (got, want) in enumerate(zip(argv, want_argv, strict=False)):
        if got != want:
            out.append(f"argument {i}: got {_show(got)}, want {_show(want)}")
    for k, v in want_env.items():
        got_v = environ.get(os.fsencode(k))
        if got_v != os.fsencode(v):
            out.append(f"env {k!r}: got {_show(got_v)}, want {_show(os.fsencode(v))}")
    return out


def is_utf8(value: str) -> bool:
    """True when ``value`` encodes as UTF-8 (no lone surrogate): what an API that takes only text accepts
    (Docker's and Kubernetes' JSON), so the byte-exact tests of those backends keep to such values."""
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True
