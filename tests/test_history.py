"""Tests for tsm.history: the typed owner of the app-history table, on a real store under $TSM_HOME."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tsm.history import AppRecord, History
from tsm.specs import AppDef, AppState, Resource, Role


@pytest.fixture
def history(tsm_home: Path) -> Iterator[History]:
    h = History()
    yield h
    h.close()


def app(name: str = "a") -> AppDef:
    return AppDef(name, [Role("r", entrypoint="echo", args=["hi"], resource=Resource())])


def test_add_then_read_back(history: History) -> None:
    history.add("local://s/a-1", "local", "s", "a-1", app(), {"grace_period": 1.0})
    assert history.contains("local://s/a-1")
    assert history.spec("local://s/a-1") == app()
    (rec,) = history.recent(10)
    assert isinstance(rec, AppRecord)
    assert (rec.handle, rec.scheduler, rec.session, rec.app_id, rec.name, rec.state) == (
        "local://s/a-1", "local", "s", "a-1", "a", AppState.SUBMITTED,
    )
    assert history.spec("local://s/none") is None and not history.contains("local://s/none")


def test_states_and_mark_failed(history: History) -> None:
    history.add("local://s/a-1", "local", "s", "a-1", app(), {})
    history.add("local://s/b-1", "local", "s", "b-1", None, {})
    history.set_states([("local://s/a-1", AppState.RUNNING), ("local://s/b-1", AppState.SUCCEEDED)])
    history.mark_failed("local://s/a-1")
    states = {r.handle: r.state for r in history.recent(None)}
    assert states == {"local://s/a-1": AppState.FAILED, "local://s/b-1": AppState.SUCCEEDED}
    assert [r.name for r in history.recent(None) if r.app_id == "b-1"] == ["b-1"]  # no app: named by its id
    history.set_state("local://s/unknown", AppState.FAILED)  # not in the history: nothing happens
    history.set_states([])


def test_recent_is_newest_first_and_limited(history: History) -> None:
    for i in range(3):
        history.add(f"local://s/a-{i}", "local", "s", f"a-{i}", app(), {})
        time.sleep(0.01)
    assert [r.app_id for r in history.recent(2)] == ["a-2", "a-1"]
    assert len(history.recent(None)) == 3


def test_created_before_and_forget(history: History) -> None:
    history.add("local://s/old", "local", "s", "old", app(), {})
    cutoff = time.time() + 1
    assert history.created_before(cutoff) == ["local://s/old"]
    assert history.created_before(0) == []
    assert history.forget("local://s/old") is True
    assert history.forget("local://s/old") is False
    assert history.recent(None) == []


def test_close_reopens_on_next_use(history: History) -> None:
    history.add("local://s/a", "local", "s", "a", app(), {})
    history.close()
    history.close()
    assert history.contains("local://s/a")
