"""Opt-in module aliases: ``import <package>...`` answered by tsm's face of that package, in one process tree.

An :class:`Alias` maps a package name (``submitit``) onto tsm's module tree for it (``tsm.submitit``): under
it, a meta path finder (first on ``sys.meta_path``) answers ``submitit`` and ``submitit.<path>`` with tsm's
module at the same path -- the same module object under both names, so ``isinstance``, ``except`` and
``unittest.mock.patch("submitit.x.y")`` work across them. A path tsm lacks is looked for in a ``<package>/``
folder on ``sys.path`` that is not a package (no ``__init__.py``: a program's own files at the package's
paths, such as that package's tests), and otherwise fails as ``ModuleNotFoundError`` naming the page that
lists what tsm has. The real package is never read: when it is importable the alias refuses to start unless
asked to shadow it.

It reaches the Python processes the program starts with the same environment through two variables:
``<ENV>`` (``on`` or ``shadow``) and ``PYTHONPATH`` led by a private folder (``$TSM_HOME/<package>_alias``)
holding a ``sitecustomize.py`` that turns the alias on, then runs any other ``sitecustomize`` further down
the path. :meth:`Alias.main` is the ``python -m <alias module> [--shadow] (-m mod | -c code | script) ...``
entry point.

Each alias is one :class:`Alias` value (:mod:`tsm.torchx_alias`, :mod:`tsm.submitit_alias`). An alias may have
a wing (``tsm.compat.torchx``): a module there answers in place of tsm's at the same path (a module only that
package has, or that package's face of a module whose tsm rules are stricter).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType

#: tsm's own folder (this module's), where a wing's modules are looked for on disk
_TSM_DIR = os.path.dirname(os.path.abspath(__file__))


class AliasRefusedError(ImportError):
    """The real package is importable (or already imported) and shadowing it was not asked for."""


class _AliasLoader(importlib.abc.Loader):
    """Gives the already imported tsm module as the aliased module: one object under both names."""

    def __init__(self, target: ModuleType) -> None:
        self._target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return self._target

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the tsm module was executed when it was imported under its own name."""

    def get_code(self, fullname: str) -> object:
        """The tsm module's code, so ``runpy`` (``-m <package>.cli.main``) can run it as ``__main__``."""
        spec = self._target.__spec__
        loader = spec.loader if spec is not None else None
        return loader.get_code(self._target.__name__) if isinstance(loader, importlib.abc.InspectLoader) else None


class AliasFinder(importlib.abc.MetaPathFinder):
    """Resolves ``<package>[.x.y]`` for one :class:`Alias`; placed first on ``sys.meta_path``."""

    def __init__(self, alias: Alias) -> None:
        self.alias = alias

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        a = self.alias
        if a.folder_aliases and fullname.startswith(a.target + "."):
            return a.folder_alias_spec(fullname)
        if fullname != a.package and not fullname.startswith(a.package + "."):
            return None
        parent = sys.modules.get(fullname.rpartition(".")[0])
        if parent is not None and not a.is_target(parent.__name__):
            return None  # inside a package of a <package>/ folder: that package's own path finds its modules
        tsm_name = a.answer(fullname)
        try:
            if not a.tsm_has(tsm_name):
                raise ModuleNotFoundError(f"No module named {tsm_name!r}", name=tsm_name)
            module = importlib.import_module(tsm_name)
        except ModuleNotFoundError as e:
            if e.name != tsm_name:
                raise
            own = a.folder_spec(fullname)
            if own is not None:
                return own
            raise ModuleNotFoundError(
                f"No module named {fullname!r}: tsm has no {tsm_name!r} (tsm's {a.package} alias maps {a.package}.X "
                f"to {a.target}.X; see {a.doc} for what exists)",
                name=fullname,
            ) from None
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(module), is_package=hasattr(module, "__path__"))


_SITE = '''"""Written by {module}: turns the {package} alias on in Python processes started under it."""
import importlib.machinery as _m
import importlib.util as _u
import os as _os
import sys as _sys

if _os.environ.get("{env}") in ("on", "shadow"):
    import {module} as _alias

    _alias.ALIAS.install(shadow=_os.environ["{env}"] == "shadow")

# then the environment's own sitecustomize, if there is one further down the path
_here = _os.path.dirname(_os.path.abspath(__file__))
_spec = _m.PathFinder.find_spec("sitecustomize", [p for p in _sys.path if _os.path.abspath(p or ".") != _here])
if _spec is not None and _spec.loader is not None:
    _mod = _u.module_from_spec(_spec)
    _spec.loader.exec_module(_mod)
'''


@dataclass(frozen=True)
class Alias:
    """``package`` answered by ``target`` (see the module doc); ``module`` is the alias's own module (what a
    child's ``sitecustomize`` imports: it holds this value as ``ALIAS``), ``env`` its variable, ``doc`` the page
    that lists what tsm has, ``refused`` the error :meth:`install` raises over the real package, ``wing`` a
    package of tsm whose modules answer before ``target``'s (see the module doc), ``folder_aliases`` whether a
    ``<target>.X`` tsm lacks is looked for in a ``<package>/`` folder (off where ``target`` is ``tsm`` itself:
    every import of tsm would look)."""

    package: str
    target: str
    module: str
    env: str
    doc: str
    refused: type[AliasRefusedError] = AliasRefusedError
    wing: str = ""
    folder_aliases: bool = True

    def answer(self, fullname: str) -> str:
        """The tsm module that is ``fullname`` (``<package>`` or ``<package>.<path>``): the wing's where it has
        a module at that path (found on disk: the wing is not imported to look), else ``target``'s."""
        rest = fullname[len(self.package):]
        if rest and self.wing:
            base = os.path.join(_TSM_DIR, *self.wing.split(".")[1:], *rest[1:].split("."))
            if os.path.isfile(base + ".py") or os.path.isfile(os.path.join(base, "__init__.py")):
                return self.wing + rest
        return self.target + rest

    def is_target(self, name: str) -> bool:
        return name == self.target or name.startswith(self.target + ".")

    def folder_spec(self, fullname: str) -> importlib.machinery.ModuleSpec | None:
        """``fullname``'s spec from a ``<package>/`` folder on ``sys.path`` that is not a package (a real
        installation is a package, so it is never read)."""
        parts = fullname.split(".")
        dirs = []
        for entry in sys.path:
            root = os.path.join(entry or ".", self.package)
            if os.path.isdir(root) and not os.path.exists(os.path.join(root, "__init__.py")):
                dirs.append(os.path.join(root, *parts[1:-1]))
        return importlib.machinery.PathFinder.find_spec(fullname, dirs) if dirs else None

    def tsm_has(self, tsm_name: str) -> bool:
        """Whether tsm has module ``tsm_name`` (its parent is imported to look: a package of tsm's)."""
        parent_name = tsm_name.rpartition(".")[0]
        if tsm_name == self.target or tsm_name in sys.modules or not self.is_target(parent_name):
            return True
        try:
            parent = importlib.import_module(parent_name)
        except ModuleNotFoundError:
            return False
        path = getattr(parent, "__path__", None)
        return path is not None and importlib.machinery.PathFinder.find_spec(tsm_name, list(path)) is not None

    def folder_alias_spec(self, fullname: str) -> importlib.machinery.ModuleSpec | None:
        """``<target>.X`` that tsm lacks, when a ``<package>/`` folder has ``X``: the folder's module under both
        names (a folder file's ``from . import x`` asks for it by the tsm package's name). None otherwise."""
        if self.tsm_has(fullname):
            return None  # the ordinary import goes on
        name = self.package + fullname[len(self.target):]
        if self.folder_spec(name) is None:
            return None
        module = importlib.import_module(name)
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(module), is_package=hasattr(module, "__path__"))

    def installed(self) -> bool:
        """True when the alias is active in this process."""
        return any(isinstance(f, AliasFinder) and f.alias == self for f in sys.meta_path)

    def _real_importable(self) -> bool:
        spec = importlib.util.find_spec(self.package)
        return spec is not None and spec.origin not in (None, "namespace")  # a folder alone is not the package

    def install(self, shadow: bool = False) -> None:
        """Answer ``import <package>...`` with tsm in this process; idempotent. Raises :attr:`refused` when the
        real package is importable and ``shadow`` is False, or when a module of it is already imported."""
        if self.installed():
            return
        loaded = [n for n in sys.modules if n == self.package or n.startswith(self.package + ".")]
        if loaded:
            raise self.refused(f"the real {self.package} is already imported here ({loaded[0]}); start the program "
                               f"under `python -m {self.module}` instead")
        if not shadow and self._real_importable():
            raise self.refused(
                f"the real {self.package} is installed in this environment; pass --shadow (or set {self.env}=shadow) "
                f"to run this program on tsm anyway, or uninstall {self.package}"
            )
        sys.meta_path.insert(0, AliasFinder(self))

    def uninstall(self) -> None:
        """Remove the alias from this process (modules already imported under its names stay imported)."""
        sys.meta_path[:] = [f for f in sys.meta_path if not (isinstance(f, AliasFinder) and f.alias == self)]

    def _site_dir(self) -> str:
        """The private folder of the children's ``sitecustomize.py`` (under ``$TSM_HOME``), written if stale."""
        from tsm.store import tsm_home

        path = os.path.join(str(tsm_home()), f"{self.package}_alias")
        os.makedirs(path, mode=0o700, exist_ok=True)
        text = _SITE.format(module=self.module, package=self.package, env=self.env)
        target = os.path.join(path, "sitecustomize.py")
        try:
            with open(target, encoding="utf-8") as f:
                current = f.read()
        except OSError:
            current = ""
        if current != text:
            tmp = f"{target}.{os.getpid()}.tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(text)
            os.replace(tmp, target)
        return path

    def export_to_children(self, shadow: bool) -> None:
        """Set ``<ENV>`` and lead ``PYTHONPATH`` with the children's sitecustomize folder."""
        site = self._site_dir()
        os.environ[self.env] = "shadow" if shadow else "on"
        parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != site]
        os.environ["PYTHONPATH"] = os.pathsep.join([site, *parts])

    def main(self, argv: Sequence[str] | None = None, doc: str = "") -> int:
        """Run a module, code or script with the alias on; its exit status (2: a usage error or a refusal)."""
        import runpy

        usage = f"usage: python -m {self.module} [--shadow] (-m module | -c code | script) [args...]"
        args = list(sys.argv[1:] if argv is None else argv)
        shadow = os.environ.get(self.env) == "shadow"
        while args and args[0] in ("--shadow", "-h", "--help"):
            if args[0] != "--shadow":
                print(usage + ("\n\n" + doc.split("\n\n")[0] if doc else ""))
                return 0
            shadow = True
            args.pop(0)
        if not args or (args[0] in ("-m", "-c") and len(args) < 2):
            print(usage, file=sys.stderr)
            return 2
        try:
            self.install(shadow=shadow)
        except AliasRefusedError as e:
            print(f"{self.module}: {e}", file=sys.stderr)
            return 2
        self.export_to_children(shadow)
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
