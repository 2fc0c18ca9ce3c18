"""TorchX's ``torchx.runner``: :class:`Runner` and :func:`get_runner` with TorchX's contract
(:mod:`tsm.compat.torchx.runner.api`); ``runner.config`` and ``runner.events`` are tsm's modules."""

from tsm.compat.torchx.runner.api import Runner, get_runner

__all__ = ["Runner", "get_runner"]
