"""The one rule every scheduler factory keeps: a keyword it does not take is an error that names it.

``create_scheduler(session_name, **kwargs)`` passes ``kwargs`` through :func:`scheduler_params` with the
keywords its backend documents; anything else raises :class:`UnknownSchedulerParamError` (an
:class:`~tsm.errors.InvalidRunOptionError`, CLI exit code 2) whose ``param`` is the keyword. The runner relies
on that field, not on the factory's signature or module name: a parameter it only *offers* (one read from a
``TSM_*`` variable) is dropped when a factory refuses it, and one the caller gave is reported.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from tsm.errors import InvalidRunOptionError, did_you_mean


class UnknownSchedulerParamError(InvalidRunOptionError):
    """A scheduler factory was given a keyword it does not take; ``param`` is that keyword."""

    param: str

    def __init__(self, *args: object, param: str, scheduler: str | None = None) -> None:
        super().__init__(*args, scheduler=scheduler)
        self.param = param


def scheduler_params(backend: str, kwargs: Mapping[str, object], accepted: Collection[str]) -> dict[str, object]:
    """``kwargs`` as a dict when every key is in ``accepted``; else :class:`UnknownSchedulerParamError` for the
    first unknown one (sorted), naming what the backend takes."""
    for name in sorted(kwargs):
        if name not in accepted:
            takes = ", ".join(sorted(accepted)) or "none"
            raise UnknownSchedulerParamError(
                f"the {backend} scheduler does not take the parameter '{name}'"
                f"{did_you_mean(name, list(accepted))}; it takes: {takes}",
                param=name, scheduler=backend,
            )
    return dict(kwargs)
