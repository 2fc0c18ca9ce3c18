"""The GPU health reading of :mod:`tsm.schedulers.common.gpu_health` (Ray's replicas), on a fake ``nvidia-smi``
(this machine has no GPU); a machine with real GPUs also reads the real one."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from testutil import GPU_LOST, GPUS_HEALTHY, fake_nvidia_smi
from tsm.schedulers.common.gpu_health import gpu_fault, gpu_health


def path_with(fake: Path) -> str:
    return f"{fake}{os.pathsep}{os.environ['PATH']}"


@pytest.mark.parametrize(("after", "code", "why"), [
    (GPU_LOST + "\n", 15, "nvidia-smi: " + GPU_LOST),  # fallen off the bus
    ("Unable to determine the device handle for GPU 0000:3B:00.0: Unknown Error\n", 255,
     "nvidia-smi: Unable to determine the device handle for GPU 0000:3B:00.0: Unknown Error"),
    ("00000000:3B:00.0, 2\n00000000:86:00.0, [N/A]\n", 0, "uncorrectable ECC errors rose from 0 to 2"),
    (GPUS_HEALTHY, 0, ""),  # healthy: the failure is the program's
    ("Failed to initialize NVML: Driver/library version mismatch\n", 18, ""),  # no verdict
])  # fmt: skip
def test_a_gpu_fault_is_told_from_the_two_readings(tmp_path: Path, after: str, code: int, why: str) -> None:
    path = path_with(fake_nvidia_smi(tmp_path / "bin", after, code))
    before = gpu_health(path)
    assert before == 0
    assert gpu_fault(before, gpu_health(path)) == why


def test_no_nvidia_smi_is_no_verdict(tmp_path: Path) -> None:
    assert gpu_health(str(tmp_path)) is None
    assert gpu_fault(None, "lost: x") == "" and gpu_fault(0, None) == ""


@pytest.mark.skipif(shutil.which("nvidia-smi") is None, reason="needs a GPU node: this machine has no nvidia-smi")
def test_real_healthy_gpus_read_as_a_count() -> None:
    got = gpu_health()
    assert isinstance(got, int), got
    assert gpu_fault(got, gpu_health()) == ""
