"""poll_until_terminal: the back-off its docstring draws, the timeout kept, unknown apps."""

from __future__ import annotations

import pytest

from tsm.schedulers.api import DescribeAppResponse
from tsm.schedulers.common import polling
from tsm.specs.api import AppState


def test_backs_off_as_documented(monkeypatch: pytest.MonkeyPatch) -> None:
    sleeps: list[float] = []
    monkeypatch.setattr(polling.time, "sleep", sleeps.append)
    states = iter([AppState.PENDING] * 12 + [AppState.SUCCEEDED])
    pauses: list[float] = []

    def describe(pause: float) -> DescribeAppResponse:
        pauses.append(pause)
        return DescribeAppResponse("a", state=next(states))

    desc = polling.poll_until_terminal(describe)
    assert desc is not None and desc.state == AppState.SUCCEEDED
    assert sleeps[:3] == [0.1, pytest.approx(0.15), pytest.approx(0.225)]
    assert max(sleeps) == 5.0 and sleeps == sorted(sleeps)
    assert pauses[: len(sleeps)] == sleeps  # each poll is told the pause that follows it


def test_timeout_returns_the_last_description() -> None:
    desc = polling.poll_until_terminal(
        lambda _p: DescribeAppResponse("a", state=AppState.RUNNING), timeout=0.3
    )
    assert desc is not None and desc.state == AppState.RUNNING


def test_unknown_app_returns_none_at_once() -> None:
    assert polling.poll_until_terminal(lambda _p: None, timeout=100) is None
