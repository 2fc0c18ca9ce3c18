"""Run a TorchX program unchanged on tsm: ``import torchx...`` resolves to ``tsm...`` (opt-in, never by default).

Usage::

    python -m tsm.torchx_alias [--shadow] -m module [args...]
    python -m tsm.torchx_alias [--shadow] script.py [args...]
    python -m tsm.torchx_alias [--shadow] -c "code" [args...]

Under the alias, a meta path finder (first on ``sys.meta_path``) answers every import of ``torchx`` or
``torchx.<path>`` with tsm's module at the same path: ``torchx.specs.api`` *is* ``tsm.specs.api`` (one
module object under both names, so ``isinstance`` and ``except`` work across them). A TorchX path tsm does
not have fails as ``ModuleNotFoundError`` naming it and ``docs/torchx-compat.md``.

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
instead of exiting).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from types import ModuleType

#: The environment variable that carries the alias to child processes: ``on`` or ``shadow``.
ENV = "TSM_TORCHX_ALIAS"

_PREFIX = "torchx"
_TARGET = "tsm"


class TorchxInstalledError(ImportError):
    """The real torchx is importable and shadowing it was not asked for."""


class _AliasLoader(importlib.abc.Loader):
    """Gives the already imported tsm module as the torchx module: one object under both names."""

    def __init__(self, target: ModuleType) -> None:
        self._target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return self._target

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the tsm module was executed when it was imported under its own name."""


class TorchxAliasFinder(importlib.abc.MetaPathFinder):
    """Resolves ``torchx[.x.y]`` to ``tsm[.x.y]``; placed first on ``sys.meta_path`` by :func:`install`."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != _PREFIX and not fullname.startswith(_PREFIX + "."):
            return None
        tsm_name = _TARGET + fullname[len(_PREFIX):]
        try:
            module = importlib.import_module(tsm_name)
        except ModuleNotFoundError as e:
            if e.name != tsm_name:
                raise
            raise ModuleNotFoundError(
                f"No module named {fullname!r}: tsm has no {tsm_name!r} (tsm's torchx alias maps torchx.X to tsm.X; "
                "see docs/torchx-compat.md for what exists)",
                name=fullname,
            ) from None
        is_package = hasattr(module, "__path__")
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(module), is_package=is_package)


def _real_torchx_importable() -> bool:
    if any(isinstance(f, TorchxAliasFinder) for f in sys.meta_path):
        return False
    return importlib.util.find_spec(_PREFIX) is not None


def installed() -> bool:
    """True when the alias is active in this process."""
    return any(isinstance(f, TorchxAliasFinder) for f in sys.meta_path)


def install(shadow: bool = False) -> None:
    """Make ``import torchx...`` resolve to tsm in this process; idempotent.

    Raises :class:`TorchxInstalledError` when the real torchx is importable and ``shadow`` is False, or when
    a real torchx module is already imported (it cannot be swapped out under code that holds it).
    """
    if installed():
        return
    loaded = [name for name in sys.modules if name == _PREFIX or name.startswith(_PREFIX + ".")]
    if loaded:
        raise TorchxInstalledError(f"the real torchx is already imported here ({loaded[0]}); start the program "
                                   "under `python -m tsm.torchx_alias` instead")
    if not shadow and _real_torchx_importable():
        raise TorchxInstalledError(
            "the real torchx is installed in this environment; pass --shadow (or set TSM_TORCHX_ALIAS=shadow) to "
            "run this program on tsm anyway, or uninstall torchx"
        )
    sys.meta_path.insert(0, TorchxAliasFinder())


def uninstall() -> None:
    """Remove the alias from this process (modules already imported under ``torchx`` names stay imported)."""
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, TorchxAliasFinder)]


_SITE = '''"""Written by tsm.torchx_alias: turns the torchx alias on in Python processes started under it."""
import importlib.machinery as _m
import importlib.util as _u
import os as _os
import sys as _sys

if _os.environ.get("TSM_TORCHX_ALIAS") in ("on", "shadow"):
    import tsm.torchx_alias as _alias

    _alias.install(shadow=_os.environ["TSM_TORCHX_ALIAS"] == "shadow")

# then the environment's own sitecustomize, if there is one further down the path
_here = _os.path.dirname(_os.path.abspath(__file__))
_spec = _m.PathFinder.find_spec("sitecustomize", [p for p in _sys.path if _os.path.abspath(p or ".") != _here])
if _spec is not None and _spec.loader is not None:
    _mod = _u.module_from_spec(_spec)
    _spec.loader.exec_module(_mod)
'''


def _site_dir() -> str:
    """A private directory holding the children's ``sitecustomize.py`` (under ``$TSM_HOME``), written if stale."""
    from tsm.store import tsm_home

    path = os.path.join(str(tsm_home()), "torchx_alias")
    os.makedirs(path, mode=0o700, exist_ok=True)
    target = os.path.join(path, "sitecustomize.py")
    try:
        with open(target, encoding="utf-8") as f:
            current = f.read()
    except OSError:
        current = ""
    if current != _SITE:
        tmp = f"{target}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(_SITE)
        os.replace(tmp, target)
    return path


def export_to_children(shadow: bool) -> None:
    """Set ``TSM_TORCHX_ALIAS`` and lead ``PYTHONPATH`` with the children's sitecustomize directory."""
    site = _site_dir()
    os.environ[ENV] = "shadow" if shadow else "on"
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != site]
    os.environ["PYTHONPATH"] = os.pathsep.join([site, *parts])


_USAGE = "usage: python -m tsm.torchx_alias [--shadow] (-m module | -c code | script) [args...]"


def main(argv: Sequence[str] | None = None) -> int:
    """Run a module, code or script with the alias on; its exit status (2 for a usage error or a real torchx)."""
    import runpy

    args = list(sys.argv[1:] if argv is None else argv)
    shadow = os.environ.get(ENV) == "shadow"
    while args and args[0] in ("--shadow", "-h", "--help"):
        if args[0] != "--shadow":
            print(_USAGE + "\n\n" + (__doc__ or "").split("\n\n")[0])
            return 0
        shadow = True
        args.pop(0)
    if not args or (args[0] in ("-m", "-c") and len(args) < 2):
        print(_USAGE, file=sys.stderr)
        return 2
    try:
        install(shadow=shadow)
    except TorchxInstalledError as e:
        print(f"tsm.torchx_alias: {e}", file=sys.stderr)
        return 2
    export_to_children(shadow)
    if args[0] == "-m":
        sys.argv = [args[1], *args[2:]]
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    elif args[0] == "-c":
        sys.argv = ["-c", *args[2:]]
        exec(compile(args[1], "<string>", "exec"), {"__name__": "__main__"})  # noqa: S102 (the user's own code)
    else:
        sys.argv = list(args)
        sys.path.insert(0, os.path.dirname(os.path.abspath(args[0])))
        runpy.run_path(args[0], run_name="__main__")
    return 0
