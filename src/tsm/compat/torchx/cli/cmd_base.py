"""TorchX's ``torchx.cli.cmd_base``: the interface of a ``torchx`` subcommand (plugins under the
``torchx.cli.cmds`` entry-point group implement it)."""

from __future__ import annotations

import abc
import argparse

__all__ = ["SubCommand"]


class SubCommand(abc.ABC):
    """One ``torchx`` subcommand: it adds its arguments to its parser and runs with what was parsed."""

    @abc.abstractmethod
    def add_arguments(self, subparser: argparse.ArgumentParser) -> None:
        """Add this command's arguments to ``subparser``."""

    @abc.abstractmethod
    def run(self, args: argparse.Namespace) -> None:
        """Run the command; a failure exits through ``sys.exit`` with TorchX's code."""
