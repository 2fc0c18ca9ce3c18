"""Which ``python`` a replica runs: one rule for every scheduler whose nodes see the launcher's files.

A replica that runs ``python`` (``utils.python``, ``dist.ddp``'s launcher, a ``*.py`` entrypoint, a
script's ``#!/usr/bin/env python``) gets the interpreter chosen here, first of these that applies:

1. the role's env ``TSM_PYTHON`` (an interpreter, a ``bin`` directory or an environment's root);
2. the run option ``python`` (``-c python=...``), the same forms;
3. the environment the user **activated**: ``$VIRTUAL_ENV``, or ``$CONDA_PREFIX`` unless it is conda's
   ``base`` -- so a ``tsm`` installed in an environment of its own (``pipx install``) runs the user's
   activated environment with torch in it, not its own;
4. the interpreter running tsm (``sys.executable``, symlinks kept so a virtualenv stays itself) -- so the
   Python API run by a virtualenv's interpreter, or ``venv/bin/tsm``, runs that virtualenv even when it
   is not activated.

The chosen interpreter's directory goes first on the replica's ``PATH`` (unless the role sets ``PATH``
itself, which then is exactly the role's), and the dry run names it with the reason.

A scheduler that builds lockfile environments (:mod:`tsm.env`; local) puts one rule before these: a role's
own ``environment``, and after rule 1 the run option ``environment``, run the environment's interpreter
(:mod:`tsm.schedulers.local.envs`).

A role may name the Python packages its replicas import (role metadata :data:`NEEDS_KEY`, a comma-separated
list: ``dist.ddp`` names ``torch``); a scheduler that runs replicas with this host's interpreters checks them at
dry run (:func:`check_needs`), so a missing one is refused with the line that installs it instead of failing
in every replica.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass

from tsm.errors import InvalidRunOptionError

#: The role env variable that picks a role's interpreter (rule 1 of the module doc).
ROLE_ENV = "TSM_PYTHON"

#: The role metadata naming the Python packages its replicas import (comma-separated), checked by :func:`check_needs`.
NEEDS_KEY = "tsm.python_needs"

#: (interpreter, package) -> whether it is there: one look per process.
_found: dict[tuple[str, str], bool] = {}


@dataclass(frozen=True)
class Interpreter:
    """The ``python`` a replica runs and why it was chosen (what the dry run prints)."""

    path: str
    why: str

    @property
    def bin_dir(self) -> str:
        """The directory that goes first on the replica's PATH."""
        return os.path.dirname(self.path)

    def describe(self) -> str:
        """``/x/venv/bin/python (the activated environment $VIRTUAL_ENV)``."""
        return f"{self.path} ({self.why})"


def _resolve(value: str, where: str) -> str:
    """An interpreter path from an interpreter, a ``bin`` directory, an environment root or a command name."""
    value = os.path.expanduser(value)
    if os.path.isdir(value):
        for cand in (os.path.join(value, "python"), os.path.join(value, "bin", "python")):
            if os.path.isfile(cand) and os.access(cand, os.X_OK):
                return os.path.abspath(cand)
        raise InvalidRunOptionError(f"{where}={value!r}: the directory has no python (nor bin/python)")
    if os.sep in value:
        return os.path.abspath(value)  # a path on the nodes, perhaps not on this host: taken as given
    found = shutil.which(value)
    if found is None:
        raise InvalidRunOptionError(f"{where}={value!r}: no such command on PATH; give an interpreter's path")
    return os.path.abspath(found)


def _env_python(root: str) -> str | None:
    cand = os.path.join(root, "bin", "python")
    return cand if os.path.isfile(cand) and os.access(cand, os.X_OK) else None


def replica_python(
    role_env: Mapping[str, str] | None = None,
    option: str | None = None,
    environ: Mapping[str, str] | None = None,
    executable: str | None = None,
) -> Interpreter:
    """The interpreter a role's replicas run (the module doc's rule), decided at dry run.

    A path with a control character (a newline in ``$VIRTUAL_ENV``, a multi-line config value) is refused:
    it would reach generated scripts, where a newline starts a command of its own.
    """
    found = _replica_python(role_env, option, environ, executable)
    if any(ord(c) < 0x20 or c == "\x7f" for c in found.path):
        raise InvalidRunOptionError(f"python from {found.why}: control characters in {found.path!r}; give a plain path")
    return found


def _replica_python(
    role_env: Mapping[str, str] | None,
    option: str | None,
    environ: Mapping[str, str] | None,
    executable: str | None,
) -> Interpreter:
    env = os.environ if environ is None else environ
    exe = sys.executable if executable is None else executable
    if role_env and role_env.get(ROLE_ENV):
        return Interpreter(_resolve(role_env[ROLE_ENV], f"role env {ROLE_ENV}"), f"the role's {ROLE_ENV}")
    if option:
        return Interpreter(_resolve(option, "run option python"), "run option python")
    venv = env.get("VIRTUAL_ENV")
    if venv and (found := _env_python(venv)):
        return Interpreter(found, "the activated environment $VIRTUAL_ENV")
    conda = env.get("CONDA_PREFIX")
    if conda and env.get("CONDA_DEFAULT_ENV") != "base" and (found := _env_python(conda)):
        return Interpreter(found, "the activated environment $CONDA_PREFIX")
    return Interpreter(os.path.abspath(exe) if exe else "python", "the interpreter running tsm")


def replica_path_with(python: Interpreter, role_path: str | None, prefix: list[str] | None = None,
                      environ: Mapping[str, str] | None = None) -> str:
    """A replica's PATH: ``prefix``, then the interpreter's directory and the caller's PATH, or the role's own."""
    env = os.environ if environ is None else environ
    rest = [role_path] if role_path is not None else [python.bin_dir, env.get("PATH", os.defpath)]
    return os.pathsep.join([*(prefix or []), *rest])


def check_needs(python: Interpreter, role_name: str, metadata: Mapping[str, object]) -> None:
    """Refuse a role whose replicas would run ``python`` without a package its :data:`NEEDS_KEY` names.

    The interpreter running tsm is asked in-process (the package is found, not imported); another one with
    one short run of it. An interpreter that cannot be run at all is left to fail where it runs.
    """
    needs = metadata.get(NEEDS_KEY)
    if not isinstance(needs, str):
        return
    for package in (p.strip() for p in needs.split(",") if p.strip()):
        if not _has(python.path, package):
            from tsm.errors import InvalidAppError

            raise InvalidAppError(
                f"role '{role_name}' needs the Python package '{package}' in the python its replicas run, "
                f"{python.describe()}, which does not have it: {python.path} -m pip install {package}, or run "
                "them with a python that has it (activate its environment, or -c python=PATH)"
            )


def _has(path: str, package: str) -> bool:
    key = (path, package)
    if key not in _found:
        if path == os.path.abspath(sys.executable):
            import importlib.util

            try:
                _found[key] = importlib.util.find_spec(package) is not None
            except (ImportError, ValueError):
                _found[key] = False
        else:
            import subprocess

            code = "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec(sys.argv[1]) else 3)"
            try:
                rc = subprocess.run([path, "-c", code, package], capture_output=True, timeout=60).returncode
            except (OSError, subprocess.SubprocessError):
                rc = 0  # cannot be run here: the replica says why
            _found[key] = rc != 3
    return _found[key]
