"""Small helpers the builtin components share: a role's resource and a safe app name."""

from __future__ import annotations

import contextlib
import contextvars
import os
import re
from collections.abc import Iterator

from tsm.errors import ComponentArgumentError
from tsm.specs.api import NULL_IMAGE, Resource
from tsm.specs.named_resources import get_named_resource

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")

#: True while :func:`tsm.components.cmdline.materialize` calls a component (its arguments came from a command line).
_COMMAND_LINE: contextvars.ContextVar[bool] = contextvars.ContextVar("tsm_component_command_line", default=False)


@contextlib.contextmanager
def command_line() -> Iterator[None]:
    """While inside, components are being called from a command line (:func:`from_command_line` is True)."""
    token = _COMMAND_LINE.set(True)
    try:
        yield
    finally:
        _COMMAND_LINE.reset(token)


def from_command_line() -> bool:
    """True inside a component called by ``materialize`` (``tsm run``, ``Runner.run_component``), False when it is
    called as a plain function. What a command line names on this machine (a ``--script`` that must exist) is
    checked only then: called as a function, a component builds its AppDef, as TorchX's do.
    """
    return _COMMAND_LINE.get()


def resource(h: str | None, cpu: int = 1, gpu: int = 0, memMB: int = 1024) -> Resource:  # noqa: N803
    """The named resource ``h`` when given (``-h gpu.small``), else ``cpu``/``gpu``/``memMB`` as they are.

    An unknown ``h`` raises :class:`~tsm.errors.UnknownResourceError` with a did-you-mean.
    """
    return get_named_resource(h) if h else Resource(cpu=cpu, gpu=gpu, memMB=memMB)


def safe_name(text: str, fallback: str) -> str:
    """``text`` made into a valid app or role name (:data:`tsm.specs.validate.NAME_RE`), else ``fallback``.

    Runs of other characters become one ``-``, leading ``-``/``_`` are dropped and the result is cut to
    63 characters: ``"my train!.v2"`` gives ``"my-train-v2"``.
    """
    name = _UNSAFE.sub("-", text).lstrip("-_")[:63]
    return name or fallback


def app_name(script: str | None, module: str | None, fallback: str) -> str:
    """An app name from what a launcher runs: ``"path/train.py"`` gives ``"train"``, ``"pkg.mod"`` gives ``"pkg-mod"``."""
    if script:
        return safe_name(os.path.splitext(os.path.basename(script.rstrip("/")))[0], fallback)
    if module:
        return safe_name(module.replace(".", "-"), fallback)
    return fallback


def exactly_one(**options: str | None) -> tuple[str, str]:
    """The one option of ``options`` that is set, as ``(flag, value)``; zero or several is an argument error.

    Keys are parameter names; the message spells them as flags (``-m``, ``--script``).
    """
    given: list[tuple[str, str]] = [(name, value) for name, value in options.items() if value is not None]
    if len(given) != 1:
        flags = [flag(name) for name in options]
        listed = ", ".join(flags[:-1]) + f" or {flags[-1]}"
        got = ", ".join(flag(name) for name, _ in given) or "none"
        raise ComponentArgumentError(f"give exactly one of {listed} (got {got})")
    return flag(given[0][0]), given[0][1]


def flag(name: str) -> str:
    """How parameter ``name`` is typed on the command line: ``-m`` or ``--script``."""
    return f"-{name}" if len(name) == 1 else f"--{name}"


def check_script(script: str | None, image: str) -> None:
    """Refuse at dry run a ``--script`` that is not there, when it would be read from this machine.

    Only for a command line (:func:`from_command_line`): a component called as a
    function builds its AppDef, as TorchX's do. With no image (the local scheduler's default: the current
    directory), a relative script is looked up in the current directory and an absolute one as it is; a
    path holding a macro or variable (``$``) is left to run time, as is any script inside an image.
    """
    if script is None or image != NULL_IMAGE or "$" in script or not from_command_line():
        return
    if not os.path.isfile(script):
        where = os.path.abspath(script)
        raise ComponentArgumentError(
            f"--script {script!r}: no such file ({where}); give a path relative to the current directory, "
            "or -m for a module"
        )
