"""Running Slurm's commands: one place that knows how they fail and what to install.

Every command goes through :func:`run` (an argument list, never a shell), counted for benchmarks
(:func:`command_counts`); :func:`check` turns a failure into tsm's errors, with "start slurmctld" when
the controller cannot be reached.
"""

from __future__ import annotations

import re
import subprocess
import threading

from tsm.errors import SchedulerError, SchedulerUnavailableError, SubmissionError
from tsm.schedulers.common.errors import CommandCounter, check_cli, cli_message, run_cli

INSTALL_HINT = (
    "install the Slurm client tools and run tsm on a host of the cluster "
    "(Debian/Ubuntu: apt-get install slurm-client; for a local test cluster run scripts/slurm-up as root)"
)

_counts = CommandCounter()


def command_counts() -> dict[str, int]:
    """How many times this process ran each Slurm command (``{"squeue": 12, ...}``), for benchmarks."""
    return _counts.snapshot()


def run(
    args: list[str], *, timeout: float = 60.0, cwd: str | None = None, umask: int = -1
) -> subprocess.CompletedProcess[str]:
    """Run one Slurm command and return it finished, whatever its code.

    A missing command is :class:`~tsm.errors.SchedulerUnavailableError` saying what to install; a hang is
    a :class:`~tsm.errors.SchedulerError`.
    """
    name = command_name(args)
    _counts.add(name)
    proc = run_cli(args, install_hint=INSTALL_HINT, hang_hint="is the Slurm controller (slurmctld) up?",
                   timeout=timeout, cwd=cwd, umask=umask)  # fmt: skip
    if args[:1] == ["env"] and proc.returncode == 127:  # env(1) ran, the command it names is not here
        raise SchedulerUnavailableError(f"'{name}' was not found: {INSTALL_HINT}")
    return proc


def unreachable(proc: subprocess.CompletedProcess[str]) -> bool:
    """True when a failed command says the controller cannot be reached."""
    text = proc.stderr.lower()
    return "unable to contact slurm controller" in text or "connection refused" in text


def command_name(args: list[str]) -> str:
    """The program ``args`` runs: ``squeue`` of ``env SLURM_TIME_FORMAT=%s squeue ...``."""
    words = args[1:] if args[:1] == ["env"] else args
    return next((w for w in words if "=" not in w), args[0] if args else "")


def check(proc: subprocess.CompletedProcess[str], what: str) -> str:
    """stdout of a finished command; a failure says what failed and Slurm's own words."""
    return check_cli(
        proc,
        what,
        unreachable=unreachable,
        service="the Slurm controller",
        unreachable_hint="start slurmctld (scripts/slurm-up for the local test cluster)",
    )


def job_id_of(proc: subprocess.CompletedProcess[str], where_said: str = "") -> str:
    """The job id a finished ``sbatch --parsable`` printed; Slurm's refusal as tsm's errors.

    ``where_said`` names the host in the messages (`` on alice@login``; "" for this machine).
    """
    if proc.returncode != 0:
        err = cli_message(proc)
        if unreachable(proc):
            raise SchedulerUnavailableError(f"sbatch{where_said}: the Slurm controller cannot be reached ({err})")
        raise SubmissionError(f"sbatch{where_said} refused the job: {err}")
    out = proc.stdout.strip()
    job_id = out.splitlines()[-1].split(";")[0].strip() if out else ""
    if not job_id.isdigit():
        raise SubmissionError(f"sbatch{where_said} gave no job id: {out!r} {proc.stderr.strip()!r}")
    return job_id


_version_lock = threading.Lock()
_version: tuple[int, int] | None = None


def parse_version(text: str) -> tuple[int, int]:
    """``(major, minor)`` from ``sbatch --version`` output such as ``slurm-wlm 22.05.8`` or ``slurm 23.11.1``."""
    m = re.search(r"(\d+)\.(\d+)", text)
    if not m:
        raise SchedulerError(f"cannot read a Slurm version from {text.strip()!r}")
    return int(m.group(1)), int(m.group(2))


def slurm_version() -> tuple[int, int]:
    """The Slurm version of this host's ``sbatch``, asked once per process and cached."""
    global _version
    with _version_lock:
        if _version is None:
            _version = parse_version(check(run(["sbatch", "--version"], timeout=20), "sbatch --version"))
        return _version
