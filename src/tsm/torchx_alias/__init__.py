"""Run a TorchX program unchanged on tsm: ``import torchx...`` resolves to ``tsm...`` (opt-in, never by default).

Usage::

    python -m tsm.torchx_alias [--shadow] -m module [args...]
    python -m tsm.torchx_alias [--shadow] script.py [args...]
    python -m tsm.torchx_alias [--shadow] -c "code" [args...]

Under the alias, a meta path finder (first on ``sys.meta_path``) answers every import of ``torchx`` or
``torchx.<path>`` with a tsm module: the TorchX wing's (:mod:`tsm.compat.torchx`) where it has one at that
path (TorchX-only modules such as ``specs.finder``, and TorchX's face of a module whose tsm rules are
stricter, such as ``runner.api``), else tsm's at the same path: ``torchx.specs.api`` *is* ``tsm.specs.api``
(one module object under both names, so ``isinstance`` and ``except`` work across them). A name neither
has comes from a ``torchx/`` folder on ``sys.path`` that is not a package (no ``__init__.py``: a program's
own files at TorchX paths, such as TorchX's tests and their fixtures; a real torchx is never read), and
otherwise fails as ``ModuleNotFoundError`` naming it and ``docs/torchx-compat.md``.

Where it applies: this process, and the Python processes it starts with the same environment (a tool's
replicas import the tool, which imports torchx). Children get it through two environment variables the
alias sets: ``TSM_TORCHX_ALIAS`` (``on`` or ``shadow``) and ``PYTHONPATH`` led by a directory holding a
``sitecustomize.py`` that installs the alias (then runs any other ``sitecustomize`` on the path, so an
environment's own is not lost). Nothing changes for processes started without those variables.

The real ``torchx``: if it is importable, the alias refuses to start (exit 2, one line on stderr) unless
``--shadow`` (or ``TSM_TORCHX_ALIAS=shadow``) says to hide it for this process tree.

``sitecustomize`` switch: to turn it on for every program of an environment without ``python -m``, put
``import tsm.torchx_alias; tsm.torchx_alias.install()`` in that environment's ``sitecustomize.py``
(:func:`install` takes ``shadow=True`` as ``--shadow`` does, and raises :class:`TorchxInstalledError`
instead of exiting). The mechanism is :mod:`tsm.aliasing`, as for :mod:`tsm.submitit_alias`.
"""

from __future__ import annotations

from collections.abc import Sequence

from tsm.aliasing import Alias, AliasRefusedError

#: The environment variable that carries the alias to child processes: ``on`` or ``shadow``.
ENV = "TSM_TORCHX_ALIAS"


class TorchxInstalledError(AliasRefusedError):
    """The real torchx is importable (or imported) and shadowing it was not asked for."""


ALIAS = Alias(package="torchx", target="tsm", module="tsm.torchx_alias", env=ENV, doc="docs/torchx-compat.md",
              refused=TorchxInstalledError, wing="tsm.compat.torchx", folder_aliases=False)


def installed() -> bool:
    """True when the alias is active in this process."""
    return ALIAS.installed()


def install(shadow: bool = False) -> None:
    """Make ``import torchx...`` resolve to tsm in this process; idempotent.

    Raises :class:`TorchxInstalledError` when the real torchx is importable and ``shadow`` is False, or when
    a real torchx module is already imported (it cannot be swapped out under code that holds it).
    """
    ALIAS.install(shadow)


def uninstall() -> None:
    """Remove the alias from this process (modules already imported under ``torchx`` names stay imported)."""
    ALIAS.uninstall()


def export_to_children(shadow: bool) -> None:
    """Set ``TSM_TORCHX_ALIAS`` and lead ``PYTHONPATH`` with the children's sitecustomize directory."""
    ALIAS.export_to_children(shadow)


def main(argv: Sequence[str] | None = None) -> int:
    """Run a module, code or script with the alias on; its exit status (2 for a usage error or a real torchx)."""
    return ALIAS.main(argv, doc=__doc__ or "")
