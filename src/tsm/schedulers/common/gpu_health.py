"""Whether a node's GPUs failed under a replica: ``nvidia-smi``'s view before and after it ran.

A replica that fails while a GPU of its node has fallen off the bus (``nvidia-smi`` can no longer reach it:
``Unable to determine the device handle for GPU ...: GPU is lost``, ``Unknown Error``) or returns new
uncorrectable ECC errors failed because of the node, and its retry should run elsewhere. The same reading
as the Slurm replicas' wrapper (:data:`tsm.schedulers.slurm.script.REPLICA_WRAPPER`, in bash, since Slurm's
nodes need not have tsm): one ``nvidia-smi`` query when the replica starts and one when it failed.
"""

from __future__ import annotations

import shutil
import subprocess

#: The query: each GPU's PCI bus id and its uncorrectable ECC errors since the driver loaded.
QUERY = ["--query-gpu=pci.bus_id,ecc.errors.uncorrected.volatile.total", "--format=csv,noheader,nounits"]

#: What ``nvidia-smi`` prints for a GPU it cannot reach.
_LOST = ("GPU is lost", "Unable to determine the device handle", "fallen off the bus")


def gpu_health(path: str | None = None, timeout: float = 60.0) -> int | str | None:
    """The node's GPUs now: their uncorrectable ECC errors in total (an int), ``"lost: <what nvidia-smi
    said>"`` when it cannot reach one, or None for no verdict (no ``nvidia-smi`` on ``path``, or it failed
    otherwise: a driver mismatch, a timeout)."""
    exe = shutil.which("nvidia-smi", path=path)
    if exe is None:
        return None
    try:
        proc = subprocess.run([exe, *QUERY], capture_output=True, text=True, errors="replace", timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    total = 0
    for line in (proc.stdout + proc.stderr).splitlines():
        if any(s in line for s in _LOST):
            return "lost: " + line.strip()[:200]
        _, sep, value = line.rpartition(",")
        if sep and value.strip().isdigit():  # "[N/A]": a GPU without ECC
            total += int(value.strip())
    return total if proc.returncode == 0 else None


def gpu_fault(before: int | str | None, after: int | str | None) -> str:
    """Why a failure points at the node's GPUs, from :func:`gpu_health` at the start and after the end;
    "" when it does not (or either reading gave no verdict)."""
    if before is None or after is None:
        return ""
    if isinstance(after, str):
        return "nvidia-smi: " + after.removeprefix("lost: ")
    if isinstance(before, int) and after > before:
        return f"uncorrectable ECC errors rose from {before} to {after}"
    return ""
