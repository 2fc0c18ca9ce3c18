"""The local scheduler (``local``, alias ``local_cwd``): the embedded default. See ``scheduler.py``.

Kept import-free so the supervisor process, which lives in this package, starts fast.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def create_scheduler(session_name: str, **kwargs: Any) -> Any:
    """Factory registered as ``local``; imports the scheduler on first use."""
    from tsm.schedulers.local.scheduler import create_scheduler as create

    return create(session_name, **kwargs)
