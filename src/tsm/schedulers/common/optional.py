"""Import a backend's client library when the backend is used, or say which extra installs it.

``import tsm`` never loads a client library; a backend calls :func:`import_client` inside the method that
needs it::

    kubernetes = import_client("kubernetes", extra="kubernetes", backend="kubernetes")

Every import of a client library goes through it (a part of one too: Ray's packaging), so a missing library
is one :class:`SchedulerUnavailableError` naming the ``pip install`` line, never a bare ``ModuleNotFoundError``.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from tsm.errors import SchedulerUnavailableError


def import_client(module: str, *, extra: str, backend: str) -> ModuleType:
    """Import ``module``; when it is missing raise :class:`SchedulerUnavailableError` naming ``pip install tsm[extra]``.

    Only a missing ``module`` (or one of its parents) is translated: an ImportError raised *inside* the
    library (a broken install) propagates unchanged, so its real cause stays visible.
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name is None or not (module == e.name or module.startswith(e.name + ".")):
            raise
        package = e.name.partition(".")[0]  # what pip installs
        raise SchedulerUnavailableError(
            f"the {backend} scheduler needs the Python package '{package}': pip install 'tsm[{extra}]'", scheduler=backend
        ) from e
