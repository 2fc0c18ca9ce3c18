"""The OpenSSH server of ``scripts/sshd-up`` as a pytest fixture: a login node for Slurm-over-SSH tests.

``sshd-up`` runs a private sshd on 127.0.0.1:2222 (key authentication only, one user, ``tsmssh``, its own
host key) on the machine of ``scripts/slurm-up``'s cluster, so ``sbatch`` and friends work in its sessions.
The fixture starts it once per session as root (about 1 s; the first time it also installs
openssh-server with apt), and otherwise uses one already running or skips saying how to enable it (under
``CI=true`` it fails instead).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from .slurm_cluster import SlurmCluster, unavailable

ROOT = Path(__file__).resolve().parents[2]
SSHD_UP = ROOT / "scripts" / "sshd-up"
SSHD_DIR = Path(os.environ.get("SSHD_DIR", "/var/lib/tsm-sshd"))
PORT = int(os.environ.get("SSHD_PORT", "2222"))
USER = os.environ.get("SSHD_USER", "tsmssh")


@dataclass(frozen=True)
class SshServer:
    """How to reach the test login node: the ``ssh`` and ``ssh_options`` run options, and its files."""

    target: str
    options: list[str]
    known_hosts: Path
    key: Path
    user: str
    startup_seconds: float

    def cfg(self, **more: object) -> dict[str, object]:
        """Run options that send an app to this login node."""
        return {"ssh": self.target, "ssh_options": list(self.options), **more}

    def kill_sessions(self) -> int:
        """Kill the server's session processes of the test user (the master connection's among them), as a
        dropped network would; returns how many were killed."""
        proc = subprocess.run(["pgrep", "-u", self.user, "-x", "sshd"], capture_output=True, text=True)
        pids = [int(p) for p in proc.stdout.split()]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return len(pids)


_started: list[SshServer] = []


@pytest.fixture(scope="session")
def ssh_server(slurm_cluster: SlurmCluster) -> SshServer:
    """A running test sshd in front of the Slurm cluster (started with ``scripts/sshd-up`` when root)."""
    start = time.monotonic()
    if os.geteuid() != 0:
        if not (SSHD_DIR / "client" / "id_ed25519").is_file():
            unavailable("no test sshd (scripts/sshd-up) and only root can start one")
    else:
        proc = subprocess.run(["bash", str(SSHD_UP)], capture_output=True, text=True, timeout=600)
        sys.stderr.write(proc.stdout + proc.stderr)
        if proc.returncode != 0:
            unavailable(f"scripts/sshd-up failed (exit {proc.returncode}): {(proc.stderr or proc.stdout)[-2000:]}")
    known, key = SSHD_DIR / "client" / "known_hosts", SSHD_DIR / "client" / "id_ed25519"
    server = SshServer(
        target=f"{USER}@127.0.0.1:{PORT}",
        options=[f"UserKnownHostsFile {known}", f"IdentityFile {key}", "IdentitiesOnly yes"],
        known_hosts=known,
        key=key,
        user=USER,
        startup_seconds=time.monotonic() - start,
    )
    _started.append(server)
    return server
