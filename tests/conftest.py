"""Shared test setup: every test gets its own ``$TSM_HOME`` so state never leaks between tests."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(autouse=True)
def tsm_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh, private ``$TSM_HOME`` for the test (also seen by processes the test starts)."""
    home = tmp_path_factory.mktemp("tsm_home")
    monkeypatch.setenv("TSM_HOME", str(home))
    monkeypatch.setenv("TSM_LAUNCHER_IDLE", "5")  # one launcher per test home: don't let them linger
    monkeypatch.setenv("TSM_CLI_SERVER_IDLE", "5")  # nor a command server (a home's second read within a minute)
    monkeypatch.setenv("TSM_KEEPER_IDLE", "5")  # nor the keepers of the Docker and Kubernetes tests' homes,
    monkeypatch.setenv("TSM_KEEPER_GIVE_UP", "60")  # even one whose engine the test removed (a private dockerd)
    return home


@pytest.fixture
def in_ci() -> bool:
    """True under CI (``CI=true``), where integration tests must run rather than skip."""
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Under CI, tests that need torch must run: a missing torch is a failed setup, not a skip."""
    if item.get_closest_marker("torch") is None:
        return
    try:
        import torch  # noqa: F401
    except ImportError:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail("torch is not installed but CI must run the torch tests: make test installs torch==2.13.0")
        pytest.skip("needs torch==2.13.0 (make test installs it)")


# -- the reliability report ------------------------------------------------------------------------------
# A test marked ``@pytest.mark.reliability("case", expect="what must hold")`` is one row of the README's
# "Reliability" table. It may record measured figures with the ``figure`` fixture; figures are never asserted
# against a clock (that is the report's job: it compares them with their limit and says "met" or "missed").
# ``pytest --reliability-report=PATH`` writes every marked test's outcome and figures to PATH as JSON;
# ``benchmarks/harden.py`` (``make harden``) runs the marked tests that way and renders the table.

_rows: list[dict[str, Any]] = []


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--reliability-report",
        metavar="PATH",
        default=None,
        help="write the outcome and figures of tests marked reliability(...) to PATH as JSON",
    )
    parser.addoption(
        "--timings",
        metavar="PATH",
        default=None,
        help="write each test's setup, call and teardown durations to PATH as JSON (tests/suites.py reads them)",
    )


# -- timings: what tests/suites.py ranks the slowest tests by -------------------------------------------
# Recorded where the reports arrive: in the one process of a plain run, in the controller of a pytest-xdist run
# (its workers send their reports there; a worker itself writes nothing).
_timings: list[dict[str, Any]] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _timings.append({"nodeid": report.nodeid, "when": report.when, "duration": round(report.duration, 3),
                     "outcome": report.outcome})


@dataclass
class Figure:
    """One measured figure of a reliability case, with the limit it is held to (if any)."""

    name: str
    value: float
    unit: str
    limit: float | None = None

    def as_dict(self) -> dict[str, Any]:
        met = None if self.limit is None else self.value <= self.limit
        return {"name": self.name, "value": self.value, "unit": self.unit, "limit": self.limit, "met": met}


class FigureRecorder:
    """Records the figures of the running test: ``figure("replicas ended after", 0.12, "s", limit=1.0)``."""

    def __init__(self) -> None:
        self.figures: list[Figure] = []

    def __call__(self, name: str, value: float, unit: str, limit: float | None = None) -> float:
        self.figures.append(Figure(name, round(float(value), 4), unit, limit))
        return value


RECORDER_KEY = pytest.StashKey[FigureRecorder]()


@pytest.fixture
def figure(request: pytest.FixtureRequest) -> FigureRecorder:
    """Record a measured figure for this test's row of the reliability report (needs the marker)."""
    if request.node.get_closest_marker("reliability") is None:
        raise pytest.UsageError("the figure fixture belongs to tests marked @pytest.mark.reliability(...)")
    recorder = FigureRecorder()
    request.node.stash[RECORDER_KEY] = recorder
    return recorder



@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    marker = item.get_closest_marker("reliability")
    if marker is None:
        return report
    if report.when == "setup" and report.outcome != "passed" or report.when == "call":
        recorder = item.stash.get(RECORDER_KEY, None)
        crash = getattr(report.longrepr, "reprcrash", None)
        message = str(crash.message) if report.failed and crash is not None else ""
        callspec = getattr(item, "callspec", None)
        _rows.append(
            {
                "case": marker.args[0] + (f" ({callspec.id})" if callspec else ""),
                "expect": marker.kwargs.get("expect", ""),
                "group": marker.kwargs.get("group", ""),
                "test": item.nodeid,
                "outcome": report.outcome,
                "message": message.splitlines()[0] if message else "",
                "seconds": round(report.duration, 3),
                "figures": [f.as_dict() for f in recorder.figures] if recorder else [],
            }
        )
    return report


def pytest_sessionfinish(session: pytest.Session) -> None:
    path = session.config.getoption("--reliability-report")
    if path:
        Path(path).write_text(json.dumps(_rows, indent=1) + "\n")
    timings = session.config.getoption("--timings")
    if timings and not hasattr(session.config, "workerinput"):  # an xdist worker: its controller writes them
        Path(timings).parent.mkdir(parents=True, exist_ok=True)
        Path(timings).write_text(json.dumps(_timings) + "\n")
