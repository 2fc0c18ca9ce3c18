"""Declared secrets (:mod:`tsm.specs.secrets`) on Kubernetes: a replica's env names them, never holds them.

* ``NAME``, ``NAME:env:VAR``, ``NAME:file:PATH``: the value is read at ``schedule`` (:func:`app_secret`), in the
  submitting process, and put under key ``s-NAME`` (:func:`key`) of the app's Secret, the one that holds the
  roles' env values (owned by the Service: deleted with the app). The container's env entry is a
  ``secretKeyRef`` to that key. The request, its dry run and ``request.json`` hold the entries and the key
  only; the dry run shows the key's value as :data:`PLACEHOLDER`.
* ``NAME:k8s:SECRET/KEY``: the env entry is a ``secretKeyRef`` to the user's own Secret of the app's
  namespace; tsm never reads it. When that Secret or key does not exist the kubelet keeps the pod waiting
  (``CreateContainerConfigError``): :func:`missing` makes that a reason the replica can never start, so the
  app fails with it at once rather than at its gang timeout.

New pods (a Job's REPLICA retries) and new Jobs (ROLE/APPLICATION retries, preemptions) copy the env entries
and the Secret lives as long as the app, so every try gets the values.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from tsm.errors import InvalidAppError, SecretError
from tsm.schedulers.api import Secrets
from tsm.schedulers.kubernetes.request import ANN_ROLE, SECRET_LIMIT, KubernetesRequest
from tsm.specs.api import AppDef
from tsm.specs.secrets import SecretRef, app_secrets, declared, parse_secret, resolve

#: what the dry run shows for a secret's value in the app's Secret
PLACEHOLDER = "<secret>"

#: the kubelet's words for a Secret, or a key of one, that a pod's env names and that does not exist
_MISSING = re.compile(r'secrets? "[^"]+" not found|couldn\'t find key \S+ in Secret \S+')


class KubernetesSecrets(Secrets):
    """The capability (:class:`tsm.schedulers.api.Secrets`) with Kubernetes' own source: ``k8s``."""

    __slots__ = ()
    secret_kinds: tuple[str, ...] = ("env", "file", "k8s")


def key(name: str) -> str:
    """The key of secret ``name`` in the app's Secret (the env values' keys start ``v-``: never the same)."""
    return f"s-{name}"


def env_entry(app_id: str, ref: SecretRef) -> dict[str, Any]:
    """The container's env entry of ``ref``: a reference to the app's Secret, or to the user's (``k8s``)."""
    secret, k = ref.k8s_secret if ref.kind == "k8s" else (app_id, key(ref.name))
    return {"name": ref.name, "valueFrom": {"secretKeyRef": {"name": secret, "key": k}}}


def with_secrets(req: KubernetesRequest, app: AppDef) -> KubernetesRequest:
    """``req`` (just built from ``app``) with the app's secrets: their entries in ``req.secrets`` and, in each
    Job, an env entry per secret its role declares. A name tsm sets itself in a replica (``TSM_APP_ID``, ...)
    is an :class:`InvalidAppError`."""
    if not any(role.secrets for role in app.roles):
        return req
    refs = app_secrets(app.roles)
    req.secrets = [str(ref) for ref in refs.values()]
    names = {role.name: [ref.name for ref in declared(role.secrets, f"role '{role.name}'")] for role in app.roles}
    for job in req.jobs:
        role = job["metadata"]["annotations"][ANN_ROLE]
        env: list[dict[str, Any]] = job["spec"]["template"]["spec"]["containers"][0]["env"]
        for name in names[role]:
            if any(e["name"] == name for e in env):
                raise InvalidAppError(f"role '{role}': secret {name}: tsm sets {name} itself in each replica; "
                                      "give the secret another name")
            env.append(env_entry(req.app_id, refs[name]))
    return req


def _refs(req: KubernetesRequest) -> list[SecretRef]:
    return [parse_secret(s) for s in req.secrets]


def shown(req: KubernetesRequest) -> dict[str, Any]:
    """The app's Secret as the dry run shows it: each secret tsm delivers under its key, as :data:`PLACEHOLDER`."""
    refs = [r for r in _refs(req) if r.kind != "k8s"]
    if not refs:
        return req.secret
    out = copy.deepcopy(req.secret)
    out.setdefault("stringData", {}).update({key(r.name): PLACEHOLDER for r in refs})
    return out


def app_secret(req: KubernetesRequest) -> dict[str, Any]:
    """The app's Secret as ``schedule`` creates it: the roles' env values and the secrets' values, read now
    (:func:`tsm.specs.secrets.resolve`). A value that cannot be read or does not fit in a Secret is a
    :class:`~tsm.errors.SecretError` that names it, never shows it."""
    values = resolve(_refs(req))
    if not values:
        return req.secret
    out = copy.deepcopy(req.secret)
    data = out.setdefault("stringData", {})
    data.update({key(name): value for name, value in values.items()})
    if sum(len(k) + len(v.encode("utf-8", "surrogatepass")) for k, v in data.items()) > SECRET_LIMIT - 4096:
        raise SecretError(f"secrets {', '.join(sorted(values))}: with the roles' env values they are over the "
                          f"{SECRET_LIMIT:,} bytes a Kubernetes Secret holds")
    return out


def missing(reason: str, message: str) -> str:
    """Why a pod waiting with ``reason``/``message`` can never start because a Secret or key its env names
    does not exist, as a hint to add to the kubelet's words; "" when that is not why it waits."""
    if reason != "CreateContainerConfigError" or not _MISSING.search(message):
        return ""
    return (" (a Secret or key that the pod's env names does not exist in the app's namespace: create it, or "
            "fix the secret declared NAME:k8s:SECRET/KEY)")
