"""tsm's warnings and module loggers without importing :mod:`logging` at start-up.

``import logging`` costs a few milliseconds that every ``tsm`` command paid although almost none of them
logs anything. :func:`warn` imports it only when there is a warning to give, and :func:`module_logger`
makes the ``logger`` attribute a module has always had (``tsm.runner.events.logger``) on first access.
"""

from __future__ import annotations

TYPE_CHECKING = False  # keeps typing out of start-up; type checkers treat it as True
if TYPE_CHECKING:
    from collections.abc import Callable


def warn(msg: str, *args: object, logger: str = "tsm") -> None:
    """``logging.getLogger(logger).warning(msg, *args)``, importing logging only now."""
    import logging

    logging.getLogger(logger).warning(msg, *args)


def module_logger(module: str, name: str) -> Callable[[str], object]:
    """A module ``__getattr__`` whose ``logger`` attribute is ``logging.getLogger(name)``, made on first use."""

    def __getattr__(attr: str) -> object:
        if attr == "logger":
            import logging

            return logging.getLogger(name)
        raise AttributeError(f"module {module!r} has no attribute {attr!r}")

    return __getattr__
