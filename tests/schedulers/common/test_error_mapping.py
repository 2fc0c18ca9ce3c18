"""run_cli/check_cli/mapped: every way a backend call fails becomes a named tsm error."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tsm.errors import InvalidAppError, SchedulerError, SchedulerUnavailableError
from tsm.schedulers.common.errors import CommandCounter, check_cli, mapped, run_cli


def test_runs_a_real_command_and_counts_it() -> None:
    counter = CommandCounter()
    proc = run_cli(
        [sys.executable, "-c", "import sys; print('out'); sys.exit(3)"], install_hint="-", counter=counter
    )
    assert (proc.returncode, proc.stdout) == (3, "out\n")
    assert counter.snapshot() == {sys.executable.rsplit("/", 1)[1]: 1}


def test_missing_binary_says_what_to_install() -> None:
    with pytest.raises(SchedulerUnavailableError, match="'no-such-tool-x' was not found: apt-get install x"):
        run_cli(["no-such-tool-x"], install_hint="apt-get install x")


def test_a_hang_is_a_scheduler_error_with_the_hint() -> None:
    with pytest.raises(SchedulerError, match=r"did not answer within 0.2s: is the daemon up\?"):
        run_cli(
            [sys.executable, "-c", "import time; time.sleep(30)"],
            install_hint="-",
            hang_hint="is the daemon up?",
            timeout=0.2,
        )


def test_check_cli_maps_failures() -> None:
    ok = subprocess.CompletedProcess(["t"], 0, "fine", "")
    assert check_cli(ok, "t") == "fine"
    bad = subprocess.CompletedProcess(["t"], 1, "", "boom\n")
    with pytest.raises(SchedulerError, match="^t list failed: boom$"):
        check_cli(bad, "t list")
    down = subprocess.CompletedProcess(["t"], 1, "", "connection refused")
    with pytest.raises(
        SchedulerUnavailableError, match="the daemon cannot be reached .connection refused.; start it"
    ):
        check_cli(
            down,
            "t list",
            unreachable=lambda p: "refused" in p.stderr,
            service="the daemon",
            unreachable_hint="start it",
        )
    silent = subprocess.CompletedProcess(["t"], 7, "", "")
    with pytest.raises(SchedulerError, match="exit code 7"):
        check_cli(silent, "t")


def test_mapped_translates_listed_exceptions_only() -> None:
    table = {ConnectionError: SchedulerUnavailableError, KeyError: SchedulerError}
    with pytest.raises(SchedulerUnavailableError, match="create failed: nope") as e, mapped("create", table):
        raise ConnectionRefusedError("nope")
    assert isinstance(e.value.__cause__, ConnectionRefusedError)
    with pytest.raises(InvalidAppError), mapped("create", table):
        raise InvalidAppError("tsm's own error passes through")
    with pytest.raises(ValueError), mapped("create", table):
        raise ValueError("not in the table")
