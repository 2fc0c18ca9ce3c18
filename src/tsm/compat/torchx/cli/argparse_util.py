"""TorchX's ``torchx.cli.argparse_util``: flags that may be given once, and defaults from ``.torchxconfig``.

``torchxconfig_run`` takes its default from the ``[cli:run]`` section of the ``.torchxconfig`` files
(``scheduler = slurm``), so a project's file sets ``torchx run``'s defaults. A flag given twice is one error
line and exit 1, as TorchX has it. The flags seen are kept per parse (TorchX keeps them for the process).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["ArgOnceAction", "torchxconfig", "torchxconfig_run"]

logger = logging.getLogger(__name__)

_SEEN = "_torchx_flags_seen"


def _once(namespace: argparse.Namespace, option_string: str | None) -> None:
    """Exit 1 (TorchX's word) when ``option_string`` was already given in this parse."""
    if option_string is None:
        return
    seen: set[str] = namespace.__dict__.setdefault(_SEEN, set())
    if option_string in seen:
        logger.error("%s is specified more than once", option_string)
        sys.exit(1)
    seen.add(option_string)


class ArgOnceAction(argparse.Action):
    """Stores the value; the flag may be given once."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        _once(namespace, option_string)
        setattr(namespace, self.dest, values)


class torchxconfig(ArgOnceAction):  # noqa: N801 (TorchX's name)
    """:class:`ArgOnceAction` whose default is ``[cli:<subcmd>] <dest>`` of the ``.torchxconfig`` files."""

    def __init__(self, subcmd: str, dest: str, option_strings: Sequence[str], required: bool = False,
                 default: Any = None, **kwargs: Any) -> None:
        from tsm.runner.config import get_configs

        default = get_configs(prefix="cli", name=subcmd).get(dest, default)
        super().__init__(dest=dest, default=default, option_strings=option_strings,
                         required=required and not default, **kwargs)


class torchxconfig_run(torchxconfig):  # noqa: N801 (TorchX's name)
    """:class:`torchxconfig` of ``torchx run`` (``[cli:run]``)."""

    def __init__(self, dest: str, option_strings: Sequence[str], required: bool = False, default: Any = None,
                 **kwargs: Any) -> None:
        super().__init__("run", dest=dest, option_strings=option_strings, required=required, default=default,
                         **kwargs)
