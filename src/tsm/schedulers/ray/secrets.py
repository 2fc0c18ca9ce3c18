"""Secrets on Ray (:mod:`tsm.specs.secrets`): from the submitting process to the driver's memory, past the job.

Everything a Ray job is made of is kept and shown: its entrypoint, ``metadata`` and ``runtime_env`` (its
``env_vars`` too) are what ``get_job_info``/``list_jobs`` and the dashboard list, and its ``working_dir``
and ``py_modules`` packages are zips the job names, kept in the cluster's store for the job's life and
unpacked onto the disk of every node that runs a worker of it (and cached there after the job). A value
in any of them would be stored with the job's definition. So the values travel apart from the job:

1. ``schedule`` reads them (:func:`tsm.specs.secrets.resolve`) and puts them, as JSON behind the fixed
   header :data:`HEADER`, in the cluster's internal key-value store under a random key of their own
   (:func:`new_uri`, ``gcs://_tsm_secrets_<32 hex>``), through the dashboard's package API: the same
   store, and the same call, as the job's packages, but referenced by nothing in the job. The dashboard
   can say whether such a key exists, never what it holds; a read needs code running in the cluster
   (which anyone who may submit jobs has anyway). The put is followed by the dashboard's temporary pin,
   so Ray deletes the key by itself some minutes later (ten by default) whatever happens next;
2. only the key's name is in the job (in the driver's payload, :attr:`~.request.DriverPayload.secrets_uri`);
3. the driver takes the values at its start (:func:`take`: read, then deleted from the store) and keeps
   them in memory only; every attempt of a replica it starts -- retries, restarts after a lost node on
   another node, a requeued time limit -- gets them in its process's environment (an actor call's
   argument, which Ray hands to the actor and does not keep);
4. a cancel or ``tsm rm`` of an app whose driver never took them overwrites them (:func:`scrub`).

A secret's file inside the directory shipped as the job's ``working_dir`` is left out of it (:func:`excludes`).

A driver that finds no values (started after Ray deleted them, or after a cancel) fails the app saying so,
instead of running replicas without them.
"""

from __future__ import annotations

import json
import os
import re
import secrets as _random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tsm.schedulers.ray.client import RayClient

#: The start of every value put in the store: 15 fixed bytes, so an upload error that quotes the first
#: bytes of what it was given (Ray's does) quotes no value.
HEADER = b"tsm-secrets-v1\n"
#: What :func:`scrub` leaves under the key: the header and no values.
REVOKED = HEADER + b"null"
#: The keys' start (a ``gcs://`` URI, so the dashboard's package API takes it).
URI_PREFIX = "gcs://_tsm_secrets_"
#: What gitignore-style patterns would read as more than the character itself.
_GLOB = re.compile(r"[\\*?\[\]]|\s$")
#: Why a driver that found no values fails its app.
MISSING = ("the app's secrets were not in the Ray cluster's store when its driver started (they are kept there "
           "for some minutes after the submission, or were withdrawn by a cancel): submit the app again")


def new_uri() -> str:
    """A fresh key for one app's values: nothing else names it."""
    return URI_PREFIX + _random.token_hex(16)


def encode(values: Mapping[str, str]) -> bytes:
    """``values`` as stored: :data:`HEADER` then ASCII JSON (a value's undecodable bytes, kept as surrogate
    escapes, survive as ``\\udcXX``: the replica gets the original bytes back)."""
    return HEADER + json.dumps(dict(values), ensure_ascii=True).encode()


def decode(data: bytes | None) -> dict[str, str] | None:
    """What :func:`encode` wrote; None for nothing, a scrubbed key or anything else."""
    if not data or not data.startswith(HEADER):
        return None
    try:
        values = json.loads(data[len(HEADER):])
    except ValueError:
        return None
    if not isinstance(values, dict):
        return None
    return {str(k): str(v) for k, v in values.items()}


def upload(client: RayClient, uri: str, values: Mapping[str, str]) -> None:
    """Put ``values`` under ``uri`` in the cluster's store, pinned there for Ray's temporary time only."""
    client.put_package(uri, encode(values))


def scrub(client: RayClient, uri: str) -> bool:
    """Overwrite the values under ``uri`` if a driver has not taken them yet; whether there were any.

    What is left (the header, no value) goes with the key's temporary pin, as an untaken value would."""
    if not client.package_exists(uri):
        return False
    client.put_package(uri, REVOKED)
    return True


def recorded_uri(app_dir: Path, module: str) -> str:
    """The key an app's driver takes its values from, from the payload tsm wrote of it ("" when none)."""
    try:
        data: Any = json.loads((app_dir / module / "payload.json").read_text())
    except (OSError, ValueError):
        return ""
    uri = data.get("secrets_uri") if isinstance(data, dict) else None
    return uri if isinstance(uri, str) and uri.startswith(URI_PREFIX) else ""


def excludes(entries: Sequence[str], directory: str) -> list[str]:
    """Ray ``excludes`` patterns (anchored at ``directory``) for the secrets' files inside ``directory``, so a
    token file kept in the shipped working directory is not zipped into the job's ``working_dir``."""
    from tsm.specs.secrets import parse_secret

    out: list[str] = []
    roots = {os.path.abspath(directory), os.path.realpath(directory)}
    for text in entries:
        ref = parse_secret(text)
        if ref.kind != "file":
            continue
        path = os.path.expanduser(ref.ref)
        for p in (os.path.abspath(path), os.path.realpath(path)):
            for root in roots:
                rel = os.path.relpath(p, root)
                if rel != os.curdir and rel.split(os.sep)[0] != os.pardir:
                    out.append("/" + _GLOB.sub(r"\\\g<0>", rel.replace(os.sep, "/")))
    return sorted(set(out))


def take(uri: str) -> dict[str, str] | None:
    """In the driver: the values under ``uri``, deleted from the store as they are read; None when they are not
    there (never put, deleted by Ray's pin, scrubbed)."""
    from ray.experimental import internal_kv

    data = internal_kv._internal_kv_get(uri)
    if data is not None:
        internal_kv._internal_kv_del(uri)
    return decode(data)
