"""Run a submitit program unchanged on tsm: ``import submitit...`` resolves to ``tsm.submitit...`` (opt-in).

Usage::

    python -m tsm.submitit_alias [--shadow] script.py [args...]
    python -m tsm.submitit_alias [--shadow] -m module [args...]
    python -m tsm.submitit_alias [--shadow] -c "code" [args...]

Under the alias ``submitit.X`` *is* ``tsm.submitit.X`` (one module object under both names), in this
process and in the Python processes it starts, including every replica of the jobs it submits: the worker
turns the alias on before it loads a call when the job was submitted under it (``TSM_SUBMITIT_ALIAS``), so a
function that uses ``submitit.JobEnvironment()`` runs the same on a Kubernetes pod as on Slurm. A path tsm
lacks fails as ``ModuleNotFoundError`` naming ``docs/submitit.md``; a ``submitit/`` folder on the path that
is not a package (submitit's own test files) supplies what tsm does not have.

If the real submitit is importable the alias refuses to start (exit 2, one line on stderr) unless
``--shadow`` (or ``TSM_SUBMITIT_ALIAS=shadow``) says to hide it for this process tree. To turn it on in an
environment without ``python -m``: ``import tsm.submitit_alias; tsm.submitit_alias.install()`` in its
``sitecustomize.py``. The mechanism is :mod:`tsm.aliasing`, as for :mod:`tsm.torchx_alias`.
"""

from __future__ import annotations

from tsm.aliasing import Alias, AliasRefusedError

#: the environment variable that carries the alias to child processes (and to a job's replicas)
ENV = "TSM_SUBMITIT_ALIAS"


class SubmititInstalledError(AliasRefusedError):
    """The real submitit is importable (or imported) and shadowing it was not asked for."""


ALIAS = Alias(package="submitit", target="tsm.submitit", module="tsm.submitit_alias", env=ENV,
              doc="docs/submitit.md", refused=SubmititInstalledError)


def install(shadow: bool = False) -> None:
    """Make ``import submitit...`` resolve to tsm in this process (see the module doc); idempotent."""
    ALIAS.install(shadow)


def uninstall() -> None:
    """Remove the alias from this process (modules already imported under ``submitit`` names stay)."""
    ALIAS.uninstall()


def installed() -> bool:
    """True when the alias is active in this process."""
    return ALIAS.installed()
