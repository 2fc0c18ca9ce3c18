"""Secrets: values a replica needs (tokens, keys, passwords) that tsm never stores, prints or submits.

A role names them in :attr:`tsm.specs.Role.secrets`, and the run option ``-c secrets=...`` names them for
every role of the app. Each entry is a variable name, optionally with where its value comes from::

    WANDB_API_KEY                  the submitter's environment variable WANDB_API_KEY
    HF_TOKEN:env:MY_HF_TOKEN       the submitter's environment variable MY_HF_TOKEN, as HF_TOKEN
    DB_PASSWORD:file:~/.db_pass    the content of that file (one trailing newline dropped)
    DB_PASSWORD:k8s:db-creds/pass  key ``pass`` of the Kubernetes Secret ``db-creds`` in the app's namespace
                                   (Kubernetes only: the pod references it, tsm never reads it)

What the app definition, its dry run and tsm's records hold is this declaration, never a value: the value is
read when the app is submitted (:func:`resolve`, in the submitting process) and handed to the scheduler's
own channel to its replicas, where it becomes the replica's environment variable of that name. Pure but for
:func:`resolve`, which reads the environment and files.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from tsm.errors import InvalidAppError, InvalidRunOptionError, SecretError

__all__ = [
    "KINDS", "MAX_VALUE", "REDACTED", "SECRETS_OPTION", "SecretRef", "app_secrets", "declared", "option_entries",
    "parse_secret", "redact", "resolve", "source_variables",
]

#: The run option every scheduler takes (handled by the runner: it adds the names to every role).
SECRETS_OPTION = "secrets"

#: Where a value can come from.
KINDS = ("env", "file", "k8s")

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_K8S_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?\Z")
_K8S_KEY = re.compile(r"[-._a-zA-Z0-9]{1,253}\Z")
#: The largest value taken (a token or a key; environments hold a few hundred KiB in all).
MAX_VALUE = 64 * 1024


@dataclass(frozen=True)
class SecretRef:
    """One declared secret: the replica's variable ``name`` and where its value is read (``kind``, ``ref``)."""

    name: str
    kind: str = "env"
    #: the variable (env), the path (file) or ``SECRET/KEY`` (k8s)
    ref: str = ""

    def __str__(self) -> str:
        return self.name if self.kind == "env" and self.ref == self.name else f"{self.name}:{self.kind}:{self.ref}"

    @property
    def k8s_secret(self) -> tuple[str, str]:
        """(Secret, key) of a ``k8s`` reference."""
        secret, _, key = self.ref.partition("/")
        return secret, key


def parse_secret(text: str) -> SecretRef:
    """Parse one entry (``NAME`` or ``NAME:KIND:REF``); a malformed one is an :class:`InvalidRunOptionError`."""
    entry = text.strip()
    name, sep, rest = entry.partition(":")
    if not _NAME.match(name):
        raise InvalidRunOptionError(f"secret {entry!r}: {name!r} is not a variable name (letters, digits, _)")
    if not sep:
        return SecretRef(name, "env", name)
    kind, sep, ref = rest.partition(":")
    if kind not in KINDS or not sep or not ref:
        raise InvalidRunOptionError(
            f"secret {entry!r}: write NAME, NAME:env:VARIABLE, NAME:file:PATH or NAME:k8s:SECRET/KEY"
        )
    if kind == "env" and not _NAME.match(ref):
        raise InvalidRunOptionError(f"secret {entry!r}: {ref!r} is not a variable name")
    if kind == "k8s":
        secret, _, key = ref.partition("/")
        if not _K8S_NAME.match(secret) or not _K8S_KEY.match(key):
            raise InvalidRunOptionError(f"secret {entry!r}: write NAME:k8s:SECRET/KEY with a Kubernetes Secret's "
                                        "name and one of its keys")
    return SecretRef(name, kind, ref)


def declared(entries: Iterable[str], where: str) -> list[SecretRef]:
    """The entries of one declaration (a role's field, the run option), parsed; a name given twice with two
    sources is an :class:`InvalidAppError` naming ``where``."""
    out: dict[str, SecretRef] = {}
    for text in entries:
        try:
            ref = parse_secret(text)
        except InvalidRunOptionError as e:
            raise InvalidAppError(f"{where}: {e}") from None
        if out.get(ref.name, ref) != ref:
            raise InvalidAppError(f"{where}: secret {ref.name} is declared twice with different sources")
        out[ref.name] = ref
    return list(out.values())


def option_entries(value: object) -> list[str]:
    """The ``secrets`` run option's value (a list, or one comma-separated string) as entries."""
    if value is None:
        return []
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not all(isinstance(i, str) for i in items):
        raise InvalidRunOptionError(f"run option '{SECRETS_OPTION}' expects a list of names, got {value!r}")
    return [i.strip() for i in items if i.strip()]


def app_secrets(roles: Sequence[object]) -> dict[str, SecretRef]:
    """Every secret the roles declare (each role has ``name``, ``env`` and ``secrets``), by name; one name
    with two sources, or a name that is also in a role's ``env``, is an :class:`InvalidAppError`."""
    out: dict[str, SecretRef] = {}
    for role in roles:
        rname = getattr(role, "name", "?")
        env: Mapping[str, str] = getattr(role, "env", {})
        for ref in declared(getattr(role, "secrets", ()), f"role '{rname}'"):
            if ref.name in env:
                raise InvalidAppError(f"role '{rname}': {ref.name} is both in env and a secret; a secret's value "
                                      "never goes in env (it would be stored and shown): drop it from env")
            if out.get(ref.name, ref) != ref:
                raise InvalidAppError(f"secret {ref.name} has two sources in two roles ({out[ref.name]}, {ref})")
            out[ref.name] = ref
    return out


def resolve(refs: Iterable[SecretRef], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The values of ``refs`` (``k8s`` ones are left out: the pod reads them), read now.

    A variable that is not set, a file that cannot be read, or a value that is empty, larger than
    :data:`MAX_VALUE` or holds a NUL byte is a :class:`~tsm.errors.SecretError` naming the secret and
    where it was looked for (never the value).
    """
    env = os.environ if environ is None else environ
    out: dict[str, str] = {}
    for ref in refs:
        if ref.kind == "k8s":
            continue
        if ref.kind == "env":
            value = env.get(ref.ref)
            if value is None:
                raise SecretError(f"secret {ref.name}: ${ref.ref} is not set in this environment; export it, or "
                                  f"declare it as {ref.name}:file:PATH")
            where = f"${ref.ref}"
        else:
            path = os.path.expanduser(ref.ref)
            try:
                with open(path, "rb") as f:
                    raw = f.read(MAX_VALUE + 2)
            except OSError as e:
                raise SecretError(f"secret {ref.name}: cannot read {path}: {e.strerror or e}") from None
            try:
                value = raw.decode()
            except UnicodeDecodeError:
                raise SecretError(f"secret {ref.name}: {path} is not UTF-8 text") from None
            value = value[:-1] if value.endswith("\n") else value
            where = path
        if not value:
            raise SecretError(f"secret {ref.name}: {where} is empty")
        try:
            value.encode()
        except UnicodeEncodeError:  # an environment value of bytes that are not UTF-8 (kept as surrogates)
            raise SecretError(f"secret {ref.name}: {where} is not UTF-8 text") from None
        if len(value.encode()) > MAX_VALUE or "\0" in value:
            raise SecretError(f"secret {ref.name}: {where} is over {MAX_VALUE // 1024} KiB or holds a NUL byte")
        out[ref.name] = value
    return out


def source_variables(refs: Iterable[SecretRef]) -> set[str]:
    """The submitter's variables that hold secrets' values (to keep out of an environment tsm records)."""
    return {r.ref for r in refs if r.kind == "env"} | {r.name for r in refs}


#: What a secret's value is shown as.
REDACTED = "<redacted>"


def redact(text: str, values: Iterable[str]) -> str:
    """``text`` with every occurrence of each value replaced by :data:`REDACTED` (longest first)."""
    for value in sorted({v for v in values if v}, key=len, reverse=True):
        text = text.replace(value, REDACTED)
    return text
