"""The Runner and its config; see :mod:`tsm.runner.api`."""

from tsm.runner.api import Runner, get_runner

__all__ = ["Runner", "get_runner"]
