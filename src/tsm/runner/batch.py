"""One request over many apps, as the runner makes it: the history's list with live states, and removal.

Both go on past a scheduler that fails: ``list`` keeps an unreachable scheduler's apps at their last
recorded state, and :func:`remove_each` removes every other app before it reports what it could not do.
The functions take what they call as values (the runner passes its own methods), so they hold no state.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from tsm.errors import (
    AppStillRunningError,
    IncompleteRemovalError,
    SchedulerUnavailableError,
    TsmError,
    UnknownAppError,
    UnknownSchedulerError,
)
from tsm.schedulers.api import ListAppResponse
from tsm.specs.api import AppState
from tsm.specs.handles import parse_app_handle


def live_list(rows: Sequence[Any], live_states: Callable[[str], Mapping[str, AppState]]
              ) -> tuple[list[ListAppResponse], list[tuple[str, AppState]]]:
    """History ``rows`` (newest first) as list entries with each unended app's live state, and the changes seen.

    ``live_states(scheduler)`` is one ``list()`` of that scheduler (app id -> state), asked once per scheduler
    that has an unended app; one that raises leaves its apps at their recorded state.
    """
    live: dict[str, Mapping[str, AppState]] = {}
    for name in {r.scheduler for r in rows if not r.state.is_terminal}:
        try:
            live[name] = live_states(name)
        except Exception:  # noqa: BLE001 - an unreachable backend must not hide the others
            live[name] = {}
    out = []
    changed: list[tuple[str, AppState]] = []
    for r in rows:
        state = r.state
        if not state.is_terminal:
            new = live.get(r.scheduler, {}).get(r.app_id)
            if new is not None and new != state:
                state = new
                changed.append((r.handle, new))
        out.append(ListAppResponse(r.app_id, state, r.handle, r.name, r.created))
    return out, changed


def remove_each(targets: Iterable[str], named: Sequence[str], remove_one: Callable[[str, bool], bool]) -> list[str]:
    """``remove_one(handle, named)`` for every target; the handles it removed.

    A named handle that is unknown (or names an unknown scheduler) or still running raises at once: the
    command line was wrong. Any other
    failure is kept and the rest goes on; the apps of a scheduler found unavailable are not asked again.
    Then :class:`~tsm.errors.IncompleteRemovalError` names what was removed and why each other app was not.
    """
    removed: list[str] = []
    failed: dict[str, str] = {}
    down: dict[str, str] = {}  # scheduler -> why it is unavailable
    for handle in targets:
        scheduler = parse_app_handle(handle).scheduler
        if scheduler in down:
            failed[handle] = down[scheduler]
            continue
        try:
            if remove_one(handle, handle in named):
                removed.append(handle)
        except (AppStillRunningError, UnknownAppError, UnknownSchedulerError):
            if handle in named:
                raise
        except Exception as e:  # noqa: BLE001 - reported with the others once the rest is done
            failed[handle] = str(e) if isinstance(e, TsmError) else f"{type(e).__name__}: {e}"
            if isinstance(e, SchedulerUnavailableError):
                down[scheduler] = failed[handle]
    if failed:
        first, why = next(iter(failed.items()))
        more = f" (and {len(failed) - 1} other app(s))" if len(failed) > 1 else ""
        raise IncompleteRemovalError(f"could not remove {first}{more}: {why}", removed=removed, failed=failed,
                                     handle=first)
    return removed
