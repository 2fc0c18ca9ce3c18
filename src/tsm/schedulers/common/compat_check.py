"""Refuse a client library stack that cannot work, with one line saying what to do, before the first call.

Two packages can each install fine and still break every call together: TorchX 0.7 (the ``bench`` extra)
pins an old urllib3, whose pool manager has no ``ca_cert_data`` key, while the Kubernetes client passes
that key on every request. The first API call then fails deep inside urllib3 with ``TypeError:
PoolKey.__new__() got an unexpected keyword argument 'key_ca_cert_data'``, which says nothing about the
cause. A backend calls its check once, right after importing its client library::

    check_kubernetes_client()   # raises SchedulerUnavailableError naming the versions and the fix

The check reads what the installed urllib3 accepts (its ``PoolKey`` fields), not a version table, so it
stays right for urllib3 versions written after it.
"""

from __future__ import annotations

from importlib import metadata

from tsm.errors import SchedulerUnavailableError

#: urllib3 pool keys the Kubernetes client's REST layer passes on every request (``kubernetes/client/rest.py``).
KUBERNETES_POOL_KEYS = ("key_ca_cert_data",)


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "?"


def missing_pool_keys(fields: tuple[str, ...] | None = None) -> list[str]:
    """The pool keys the Kubernetes client needs that urllib3's ``PoolKey`` (or ``fields``) lacks."""
    if fields is None:
        import urllib3.poolmanager

        fields = tuple(urllib3.poolmanager.PoolKey._fields)
    return [k for k in KUBERNETES_POOL_KEYS if k not in fields]


def kubernetes_client_problem(fields: tuple[str, ...] | None = None) -> str | None:
    """Why the installed Kubernetes client cannot talk to a cluster with this urllib3, or None.

    ``fields`` stands for urllib3's ``PoolKey`` fields (the installed ones when None).
    """
    missing = missing_pool_keys(fields)
    if not missing:
        return None
    return (
        f"the kubernetes client {_version('kubernetes')} cannot work with urllib3 {_version('urllib3')} installed "
        f"beside it (its connection pool has no {', '.join(k.removeprefix('key_') for k in missing)}; TorchX 0.7, "
        "the bench extra, pins such an old urllib3): run pip install -U 'urllib3>=1.26' here and keep TorchX in a "
        "virtualenv of its own (make bench-venv)"
    )


def check_kubernetes_client() -> None:
    """Raise :class:`SchedulerUnavailableError` (one line, the fix in it) when the client stack is broken."""
    problem = kubernetes_client_problem()
    if problem:
        raise SchedulerUnavailableError(problem)
