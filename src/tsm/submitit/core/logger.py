"""submitit's ``core.logger``: the ``submitit`` logger (level from ``SUBMITIT_LOG_LEVEL``, default INFO;
``NOCONFIG`` leaves logging's configuration alone). Configured on first use, not at import."""

from __future__ import annotations

import logging
import os
import sys

LOG_VARNAME = "SUBMITIT_LOG_LEVEL"
_configured = False


def get_logger() -> logging.Logger:
    """The ``submitit`` logger: INFO and up to stdout, WARNING and up to stderr (unless NOCONFIG)."""
    global _configured
    log = logging.getLogger("submitit")
    if not _configured:
        _configured = True
        level = os.environ.get(LOG_VARNAME, "INFO").upper()
        if level != "NOCONFIG":
            fmt = logging.Formatter("%(name)s %(levelname)s (%(asctime)s) - %(message)s")
            out = logging.StreamHandler(sys.stdout)
            out.setLevel(logging.DEBUG)
            err = logging.StreamHandler(sys.stderr)
            err.setLevel(logging.WARNING)
            for handler in (out, err):
                handler.setFormatter(fmt)
                log.addHandler(handler)
            log.setLevel(int(level) if level.isdigit() else level)
    return log


def exception(*args: str) -> None:
    get_logger().exception(*args)


def warning(*args: str) -> None:
    get_logger().warning(*args)
