"""``tsm.lifecycle`` (what a replica asks about its own life) and the shared long-run option parsing."""

from __future__ import annotations

import os
import signal

import pytest

import tsm.lifecycle as lc
from tsm.errors import InvalidRunOptionError
from tsm.schedulers.common.lifecycle_opts import (
    DEFAULT_MAX_PREEMPTIONS,
    LifecycleOptions,
    format_duration,
    parse_duration,
    parse_signal,
)


@pytest.mark.parametrize(("text", "seconds"), [
    ("90", 90.0), ("120s", 120.0), ("15m", 900.0), ("2h", 7200.0), ("1d", 86400.0), ("1h30m", 5400.0),
    (" 2H ", 7200.0), ("0.5s", 0.5), ("1.5", 1.5),
])
def test_durations_parse(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "0", "-5s", "2 hours", "h", "5x", "1h-", "400d", "1e3"])
def test_bad_durations_are_refused_naming_the_option(text: str) -> None:
    with pytest.raises(InvalidRunOptionError, match="time_limit="):
        parse_duration(text, "time_limit")


@pytest.mark.parametrize(("seconds", "text"), [(900, "15m"), (5400, "1h30m"), (2.5, "2.5s"), (86461, "1d1m1s")])
def test_durations_format_back(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text
    assert parse_duration(text) == seconds


def test_signals_parse_and_uncatchable_ones_are_refused() -> None:
    assert parse_signal("usr1") == parse_signal("SIGUSR1") == parse_signal(str(int(signal.SIGUSR1))) == signal.SIGUSR1
    for bad in ("KILL", "STOP", "NOPE"):
        with pytest.raises(InvalidRunOptionError):
            parse_signal(bad)


def test_options_defaults_and_checks() -> None:
    opts = LifecycleOptions.from_cfg({})
    assert opts.max_preemptions == DEFAULT_MAX_PREEMPTIONS == 3
    assert opts.time_limit_s is None and opts.warn_signum is None and opts.warn_before_s == 120.0
    opts = LifecycleOptions.from_cfg({"time_limit": "2h", "warn_signal": "USR1", "exclude_nodes": ["n[1-2]"]})
    assert opts.time_limit_s == 7200.0 and opts.warn_signum == signal.SIGUSR1
    with pytest.raises(InvalidRunOptionError, match="not a node name"):
        LifecycleOptions.from_cfg({"exclude_nodes": ["a b"]})
    with pytest.raises(InvalidRunOptionError, match="needs a time_limit"):
        LifecycleOptions.from_cfg({"requeue_on_time_limit": True})


def test_restart_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("TSM_ATTEMPT", "TSM_RESTART_COUNT", "TSM_LAST_EXIT"):
        monkeypatch.delenv(name, raising=False)
    assert (lc.attempt(), lc.restart_count(), lc.last_exit()) == (0, 0, None)
    monkeypatch.setenv("TSM_ATTEMPT", "2")
    monkeypatch.setenv("TSM_RESTART_COUNT", "3")
    monkeypatch.setenv("TSM_LAST_EXIT", "failed:7")
    assert (lc.attempt(), lc.restart_count(), lc.last_exit()) == (2, 3, "failed:7")
    monkeypatch.setenv("TSM_LAST_EXIT", "")
    assert lc.last_exit() is None


def test_on_warning_runs_the_callback_once_on_the_named_signal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TSM_WARN_SIGNAL", "USR2")
    monkeypatch.setattr(lc, "_warned", False)
    calls: list[int] = []
    before = signal.getsignal(signal.SIGUSR2)
    try:
        assert lc.on_warning(lambda: calls.append(1)) == signal.SIGUSR2
        assert not lc.warned()
        os.kill(os.getpid(), signal.SIGUSR2)
        os.kill(os.getpid(), signal.SIGUSR2)  # a second warning: the process lives, the callback does not rerun
        assert calls == [1] and lc.warned()
    finally:
        signal.signal(signal.SIGUSR2, before)


def test_lifecycle_imports_nothing_heavy() -> None:
    import subprocess
    import sys

    code = "import sys, tsm.lifecycle; print(sorted(m for m in sys.modules if m.startswith(('torch', 'tsm.'))))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['tsm.lifecycle']"


def test_replica_status_keeps_torchx_fields_and_json_shows_preempted() -> None:
    from tsm.specs.api import AppState, AppStatus, ReplicaStatus, RoleStatus

    plain = ReplicaStatus(0, AppState.RUNNING, "trainer", "node1")  # TorchX's positional order still works
    assert plain.preempted is False
    status = AppStatus(AppState.RUNNING, roles=[RoleStatus("trainer", [
        plain, ReplicaStatus(1, AppState.FAILED, "trainer", error_msg="preempted: ...", preempted=True),
    ])])  # fmt: skip
    replicas = status.to_dict()["roles"][0]["replicas"]
    assert [r["preempted"] for r in replicas] == [False, True]
