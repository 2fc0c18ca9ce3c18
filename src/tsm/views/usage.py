"""Resource usage of replicas, measured in one pass per tick: ``/proc`` through psutil, GPUs through nvidia-smi.

A local replica is the leader of its own process group (the supervisor starts it with ``setsid``), so
its usage is the sum over every process of that group: children a training script forks count too.
One :meth:`UsageProbe.sample` call walks the process table once, whatever the number of replicas asked
for, and keeps each process's CPU time so the next call turns the difference into cores used. On Linux
the walk reads one ``/proc/<pid>/stat`` per process (process group, CPU times, resident pages: all in
that one file; about 5x cheaper than asking psutil for the same); elsewhere it uses psutil when installed.
A process seen in a group nobody asked for is not read again on later walks (a process does not move to
another group; a new one has a new pid), except on every :data:`FULL_WALK_EVERY`-th walk, which reads
them all again in case a pid was reused: with 100 replicas on a host of 500 processes a walk reads about
100 files instead of 500.

GPU memory comes from one ``nvidia-smi --query-compute-apps`` call per tick when that program exists;
without it (or psutil) the figures are None, which the views show as ``n/a``. Nothing here raises
for a missing tool or a process that ended between two reads.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

_PROC = os.path.isfile("/proc/self/stat")
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _boot_time() -> float:
    """When the machine booted (Unix time), from ``/proc/stat``; ``/proc/<pid>/stat`` counts from it."""
    try:
        with open("/proc/stat", "rb") as f:
            for line in f:
                if line.startswith(b"btime "):
                    return float(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0.0


_BOOT = _boot_time() if _PROC else 0.0
#: Every this many walks, every process is read again, not only those in wanted or unseen groups.
FULL_WALK_EVERY = 30


@dataclass(frozen=True)
class Usage:
    """What one replica (its whole process group) uses now; None where it cannot be measured."""

    cpu: float | None = None  #: cores in use (1.0 = one core busy) since the previous sample
    mem_mb: float | None = None  #: resident memory in MiB
    gpu_mem_mb: float | None = None  #: GPU memory in MiB, None without NVIDIA GPUs


class UsageProbe:
    """Measures process groups; keep one instance across ticks (it remembers CPU times)."""

    def __init__(self) -> None:
        self._psutil: Any = None
        if not _PROC:
            try:
                import psutil
            except ImportError:  # no /proc and no psutil (the views extra): usage is n/a
                pass
            else:
                self._psutil = psutil
        self._smi = shutil.which("nvidia-smi")
        self._prev: dict[int, tuple[float, float]] = {}  # pid -> (create_time, cpu seconds)
        self._prev_t: float | None = None
        #: How many process-table walks and nvidia-smi runs this probe made (for the refresh-cost figures).
        self.scans = 0
        self._foreign: dict[str, int] = {}  # pid (as named in /proc) -> its process group, for groups not asked for

    @property
    def available(self) -> bool:
        """True when CPU and memory can be measured (Linux ``/proc``, else psutil)."""
        return _PROC or self._psutil is not None

    def _processes(self, wanted: set[int]) -> Iterator[tuple[int, int, float, float, float]]:
        """(pid, pgid, start time, CPU seconds, RSS MiB) of every process whose group is in ``wanted``."""
        if _PROC:
            full = self.scans % FULL_WALK_EVERY == 1  # now and then, read every process again (pid reuse)
            known, foreign = self._foreign, {}
            for name in os.listdir("/proc"):
                if not name.isdigit():
                    continue
                group = known.get(name)
                if group is not None and group not in wanted and not full:
                    foreign[name] = group  # seen before, in a group nobody asks for: not read again
                    continue
                try:  # os.open/os.read: a third of what a Python file object costs, for a thousand files a tick
                    fd = os.open(f"/proc/{name}/stat", os.O_RDONLY)
                    try:
                        data = os.read(fd, 4096)
                    finally:
                        os.close(fd)
                except OSError:
                    continue  # ended since the listing
                fields = data[data.rfind(b")") + 2:].split()
                try:
                    pgid = int(fields[2])
                    if pgid not in wanted:
                        foreign[name] = pgid
                        continue
                    yield (int(name), pgid, _BOOT + int(fields[19]) / _TICKS, (int(fields[11]) + int(fields[12])) / _TICKS,
                           int(fields[21]) * _PAGE / 2**20)
                except (IndexError, ValueError):
                    continue
            self._foreign = foreign  # only pids still listed: the map never outgrows the process table
            return
        assert self._psutil is not None
        for proc in self._psutil.process_iter(["pid", "create_time", "cpu_times", "memory_info"]):
            info = proc.info
            try:
                pgid = os.getpgid(info["pid"])
            except OSError:
                continue
            if pgid in wanted and info["cpu_times"] is not None and info["memory_info"] is not None:
                yield (info["pid"], pgid, float(info["create_time"] or 0.0),
                       float(info["cpu_times"].user + info["cpu_times"].system), info["memory_info"].rss / 2**20)

    def sample(self, pgids: Iterable[int]) -> dict[int, Usage]:
        """Usage of each process group in ``pgids``, from one walk of the process table."""
        wanted = {p for p in pgids if p}
        if not wanted or not self.available:
            return {}
        self.scans += 1
        now = time.monotonic()
        elapsed = None if self._prev_t is None else max(now - self._prev_t, 1e-6)
        cpu_s: dict[int, float] = {}
        mem: dict[int, float] = {}
        seen: dict[int, tuple[float, float]] = {}
        members: dict[int, list[int]] = {}
        for pid, pgid, created, total, rss_mb in self._processes(wanted):
            seen[pid] = (created, total)
            members.setdefault(pgid, []).append(pid)
            prev = self._prev.get(pid)
            if prev is not None and prev[0] == created:
                delta = total - prev[1]
            elif self._prev_t is not None and created >= time.time() - (now - self._prev_t) - 1.0:
                delta = total  # started since the last sample: all its CPU time is new
            else:
                delta = 0.0
            cpu_s[pgid] = cpu_s.get(pgid, 0.0) + max(delta, 0.0)
            mem[pgid] = mem.get(pgid, 0.0) + rss_mb
        self._prev, self._prev_t = seen, now
        gpu = self._gpu(members)
        return {
            g: Usage(
                cpu=None if elapsed is None else round(cpu_s.get(g, 0.0) / elapsed, 3),
                mem_mb=round(mem[g], 1), gpu_mem_mb=gpu.get(g) if self._smi else None,
            )
            for g in members
        }

    def _gpu(self, members: dict[int, list[int]]) -> dict[int, float]:
        """GPU MiB per process group from one nvidia-smi call; {} when it is absent or fails."""
        if not self._smi or not members:
            return {}
        try:
            out = subprocess.run(
                [self._smi, "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                capture_output=True, text=True, timeout=5, check=False,
            ).stdout
        except (OSError, subprocess.SubprocessError):
            return {}
        group_of = {pid: g for g, pids in members.items() for pid in pids}
        used: dict[int, float] = {g: 0.0 for g in members}
        for line in out.splitlines():
            parts = [p.strip() for p in line.split(",")]
            if len(parts) == 2 and parts[0].isdigit() and int(parts[0]) in group_of:
                try:
                    used[group_of[int(parts[0])]] += float(parts[1])
                except ValueError:
                    continue
        return used
