"""The edits a running app's manifests get from tsm's looks, after the dry run: each object owned by the
app's Service (one delete removes all), rank 0's address handed to the others on a cluster without DNS, and
a Job made anew for a ROLE/APPLICATION retry (a new name, the attempt's label and env, the nodes it avoids).
Pure: manifests in, manifests out (copies); no API call.
"""

from __future__ import annotations

import copy
from typing import Any

from tsm.schedulers.kubernetes.request import (
    ANN_RANK0,
    ANN_ROLE,
    CLUSTER_DOMAIN,
    LABEL_ATTEMPT,
    LABEL_REPLICA,
    RANK0_VAR,
    TORCHX_RANK0_VAR,
    env_var,
    escape,
    job_name,
    with_excluded_nodes,
)


def with_owner(manifest: dict[str, Any], service_uid: str, app_id: str) -> dict[str, Any]:
    """``manifest`` owned by the app's Service (deleting it deletes the manifest's object)."""
    out = copy.deepcopy(manifest)
    out["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "Service", "name": app_id,
                                           "uid": service_uid, "blockOwnerDeletion": False}]
    return out


def rank0_names(job: dict[str, Any]) -> list[str]:
    """Every name rank 0's pod knows itself by (its ``/etc/hosts`` line, written by the kubelet):
    ``<host>``, ``<host>.<app_id>``, ``<host>.<app_id>.<ns>.svc`` and ``...svc.<CLUSTER_DOMAIN>`` (what
    ``socket.getfqdn()`` returns inside it, hence what torch's c10d rendezvous advertises)."""
    dns = job["metadata"]["annotations"].get(ANN_RANK0)  # "<host>.<app_id>"
    if not dns:  # a request saved before the annotation existed: the env still holds the DNS name
        env = {e["name"]: e.get("value", "") for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
        dns = env[RANK0_VAR].replace("$$", "$")
    short = dns.split(".", 1)[0]
    svc = f"{dns}.{job['metadata']['namespace']}.svc"
    return [short, dns, svc, f"{svc}.{CLUSTER_DOMAIN}"]


def with_rank0(job: dict[str, Any], host: str) -> dict[str, Any]:
    """``job`` with ``TSM_RANK0_HOST`` set to ``host`` (rank 0's pod IP on a cluster without DNS).

    The pod also gets ``hostAliases`` mapping rank 0's host names (:func:`rank0_names`) to that IP: a
    process in rank 0's pod that advertises its own name (torch's c10d rendezvous does, with its FQDN)
    is then reachable from this pod without cluster DNS.
    """
    out = copy.deepcopy(job)
    pod = out["spec"]["template"]["spec"]
    names = rank0_names(job)
    for e in pod["containers"][0]["env"]:
        if e["name"] in (RANK0_VAR, TORCHX_RANK0_VAR):
            e["value"] = escape(host)
    aliases = [a for a in pod.get("hostAliases", []) if a.get("hostnames") != names]
    pod["hostAliases"] = [*aliases, {"ip": host, "hostnames": names}]
    return out


def with_own_ip_as_rank0(job: dict[str, Any]) -> dict[str, Any]:
    """Rank 0's ``job`` on a cluster without DNS: ``TSM_RANK0_HOST`` is its own pod IP (the downward API's
    ``status.podIP``), the address the others are given, so a rendezvous on it sees itself as the host."""
    out = copy.deepcopy(job)
    for e in out["spec"]["template"]["spec"]["containers"][0]["env"]:
        if e["name"] in (RANK0_VAR, TORCHX_RANK0_VAR):
            e.pop("value", None)
            e["valueFrom"] = {"fieldRef": {"fieldPath": "status.podIP"}}
    return out


def retried(job: dict[str, Any], app_id: str, attempt: int, env: dict[str, str] | None = None,
            exclude: list[str] | None = None) -> dict[str, Any]:
    """``job`` for the ``attempt``-th ROLE/APPLICATION retry: a new name, the attempt label, ``env`` (the
    attempt's ``TSM_ATTEMPT``, ``TSM_RESTART_COUNT``, ``TSM_LAST_EXIT``) laid over the container's, and the
    nodes to ``exclude`` (:func:`with_excluded_nodes`: the ones a replica was lost with)."""
    out = copy.deepcopy(job)
    if exclude:
        out["spec"]["template"]["spec"] = with_excluded_nodes(out["spec"]["template"]["spec"], exclude)
    container_env = out["spec"]["template"]["spec"]["containers"][0]["env"]
    for k, v in (env or {}).items():
        for e in container_env:
            if e["name"] == k:
                e.pop("valueFrom", None)
                e.pop("value", None)
                e.update(env_var(k, v))
                break
        else:
            container_env.append(env_var(k, v))
    labels = out["metadata"]["labels"]
    name = out["metadata"]["annotations"][ANN_ROLE]
    out["metadata"]["name"] = job_name(app_id, name, int(labels[LABEL_REPLICA]), attempt)
    for meta in (out["metadata"], out["spec"]["template"]["metadata"]):
        meta["labels"][LABEL_ATTEMPT] = str(attempt)
    return out
