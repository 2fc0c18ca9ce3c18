"""The local scheduler (``local``, alias ``local_cwd``): the embedded default. See ``scheduler.py``.

Kept import-free so the supervisor process, which lives in this package, starts fast.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from tsm.schedulers.local.scheduler import LocalScheduler


def create_scheduler(session_name: str, **kwargs: Any) -> LocalScheduler:
    """Factory registered as ``local``; imports the scheduler on first use. Takes ``backend`` only."""
    from tsm.schedulers.common.factory import scheduler_params
    from tsm.schedulers.local.scheduler import LocalScheduler

    params = scheduler_params("local", kwargs, ("backend",))  # any other keyword: an error naming it
    return LocalScheduler(session_name, str(params.get("backend") or "local"))
