"""Build an :class:`~tsm.env.spec.EnvPlan` once per key into a cache folder, with uv, safe across processes.

Layout of a cache root (local: ``$TSM_HOME/envs``)::

    <key>/                 a relocatable virtual environment; ready when <key>/.tsm-env.json is there
    .locks/<key>.lock      held (flock) while the key is checked and built: concurrent launches build once
    .building/<key>-*      a build in progress; renamed to <key>/ in one step when it is complete
    builds.jsonl           one line per build attempt (key, seconds, ok), for ``tsm env`` and the tests

A launch takes the key's lock, and finds the environment ready (its marker is written inside the build
folder before the one rename) or builds it. Another launch of the same key blocks on the lock (no polling)
and then finds it ready. A build that dies half-way leaves only a ``.building`` folder, which the next
build of that key removes under the lock: nothing without the marker is ever used.

A build is ``uv venv --relocatable`` then ``uv pip sync`` of the lock (a ``uv.lock`` first exported, with
its hashes, by ``uv export --frozen``): the lock is installed as it is, never re-resolved.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tsm.env.spec import EnvPlan, requires_hashes
from tsm.errors import EnvBuildError, SchedulerUnavailableError

#: The file inside an environment that says it is complete (written last, before the rename).
MARKER = ".tsm-env.json"

#: What a build's subprocesses are told: never download a Python, no colours or progress bars.
_UV_ENV = {"UV_PYTHON_DOWNLOADS": "never", "NO_COLOR": "1", "UV_NO_PROGRESS": "1"}


def uv_bin() -> str:
    """The uv executable: the ``uv`` package's (``tsm[env]``), else one on PATH."""
    try:
        import uv  # type: ignore[import-not-found,unused-ignore]

        return str(uv.find_uv_bin())
    except (ImportError, FileNotFoundError):
        found = shutil.which("uv")
        if found:
            return found
    raise SchedulerUnavailableError("lockfile environments are built with uv, which is not installed: "
                                    "pip install 'tsm[env]'")


@dataclass(frozen=True)
class Built:
    """The outcome of :meth:`EnvCache.ensure`: where the environment is and whether this call built it."""

    key: str
    root: str
    built: bool
    seconds: float

    @property
    def python(self) -> str:
        return os.path.join(self.root, "bin", "python")


class EnvCache:
    """One cache root of environments (see the module doc)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def path(self, key: str) -> Path:
        return self.root / key

    def python(self, key: str) -> str:
        """The interpreter of ``key``'s environment (there once it is ready)."""
        return str(self.root / key / "bin" / "python")

    def is_ready(self, key: str) -> bool:
        return (self.root / key / MARKER).is_file()

    def info(self, key: str) -> dict[str, Any] | None:
        """The marker's record of a ready environment; None when it is not ready."""
        try:
            data = json.loads((self.root / key / MARKER).read_text())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    @contextmanager
    def locked(self, key: str) -> Iterator[None]:
        """Hold ``key``'s build lock (blocks while another process holds it)."""
        import fcntl

        locks = self.root / ".locks"
        locks.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(locks / f"{key}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def ensure(self, plan: EnvPlan) -> Built:
        """The ready environment of ``plan``, built here first unless it already is (once per key)."""
        t0 = time.monotonic()
        if self.is_ready(plan.key):
            self._touch(plan.key)
            return Built(plan.key, str(self.path(plan.key)), False, time.monotonic() - t0)
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        with self.locked(plan.key):
            if self.is_ready(plan.key):  # built by the launch we waited for
                self._touch(plan.key)
                return Built(plan.key, str(self.path(plan.key)), False, time.monotonic() - t0)
            ok = False
            try:
                self._build(plan)
                ok = True
            finally:
                self.log_build(plan, time.monotonic() - t0, ok)
        return Built(plan.key, str(self.path(plan.key)), True, time.monotonic() - t0)

    def _touch(self, key: str) -> None:
        """Mark ``key`` used now (``gc --older-than`` counts from the last use)."""
        with suppress(OSError):
            os.utime(self.root / key / MARKER)

    def _build(self, plan: EnvPlan) -> None:
        building = self.root / ".building"
        building.mkdir(parents=True, exist_ok=True, mode=0o700)
        for stale in building.glob(f"{plan.key}-*"):  # a build that died: we hold the key's lock
            shutil.rmtree(stale, ignore_errors=True)
        final = self.path(plan.key)
        if final.exists():  # not ready (no marker), so not ours to trust: set aside and rebuild
            shutil.rmtree(final, ignore_errors=True)
        tmp = building / f"{plan.key}-{os.getpid()}-{os.urandom(3).hex()}"
        t0 = time.monotonic()
        try:
            python = build_venv(plan, tmp)
            record = {"key": plan.key, **plan.to_dict(), "python_version": python, "built_at": time.time(),
                      "build_seconds": round(time.monotonic() - t0, 3)}
            fd = os.open(tmp / MARKER, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                json.dump(record, f, indent=1)
                f.flush()
                os.fsync(f.fileno())
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise

    def log_build(self, plan: EnvPlan, seconds: float, ok: bool) -> None:
        """Record one build attempt in ``builds.jsonl`` (one line, one write)."""
        line = json.dumps({"key": plan.key, "lock": plan.lock, "at": time.time(), "seconds": round(seconds, 3),
                           "ok": ok, "pid": os.getpid()}) + "\n"
        fd = os.open(self.root / "builds.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)

    def builds(self) -> list[dict[str, Any]]:
        """Every build attempt recorded in this cache, oldest first."""
        try:
            text = (self.root / "builds.jsonl").read_text()
        except OSError:
            return []
        return [json.loads(line) for line in text.splitlines() if line.strip()]


def build_venv(plan: EnvPlan, target: Path) -> str:
    """Make ``target`` a relocatable virtual environment with exactly ``plan``'s lock installed.

    Returns the environment's Python version. Raises :class:`~tsm.errors.EnvBuildError` with one line (and
    uv's whole message as ``detail``) when uv refuses: a malformed lock, no such Python, a missing wheel.
    """
    uv = uv_bin()
    target.mkdir(mode=0o700)
    reqs = export_requirements(plan, target)
    _uv(plan, f"finding Python {plan.python}",
        [uv, "venv", "--quiet", "--relocatable", "--no-python-downloads", "--python", plan.python, str(target),
         "--allow-existing"])
    cmd = [uv, "pip", "sync", "--quiet", "--python", str(target / "bin" / "python"), *_index_args(plan)]
    _uv(plan, "installing the lock", [*cmd, reqs])
    return _venv_version(target)


def export_requirements(plan: EnvPlan, folder: Path) -> str:
    """The file uv installs from: the lock itself, or for a ``uv.lock`` its export (with hashes) in ``folder``."""
    if plan.kind != "uv.lock":
        return plan.lock
    reqs = str(folder / ".tsm-requirements.txt")
    _uv(plan, "reading the lock", [uv_bin(), "export", "--frozen", "--no-emit-project", "--format", "requirements-txt",
                                   "--no-header", "--quiet", "--project", os.path.dirname(plan.lock), "-o", reqs])
    return reqs


def install_target(plan: EnvPlan, reqs: str, target: Path) -> None:
    """Install the lock's packages into ``target`` for ``plan``'s Python version on Linux (no interpreter of
    that version needed here): what an image's environment is made of."""
    import platform as _platform

    cmd = [uv_bin(), "pip", "install", "--quiet", "--no-deps", "--target", str(target), "--python-version",
           plan.python, "--python-platform", f"{_platform.machine()}-manylinux_2_28", *_index_args(plan)]
    _uv(plan, "installing the lock", [*cmd, "-r", reqs])


def _index_args(plan: EnvPlan) -> list[str]:
    """uv's options for ``plan``'s index settings, hash checking and lock format."""
    out: list[str] = []
    if plan.index_url:
        out += ["--index-url", plan.index_url]
    for d in plan.find_links:
        out += ["--find-links", d]
    if plan.settings.offline:
        out += ["--no-index", "--offline"]
    if plan.kind == "requirements" and requires_hashes(plan.lock):
        out.append("--require-hashes")
    if plan.kind == "pylock":
        out += ["--preview-features", "pylock"]
    return out


def _venv_version(target: Path) -> str:
    try:
        for line in (target / "pyvenv.cfg").read_text().splitlines():
            name, _, value = line.partition("=")
            if name.strip() in ("version_info", "version"):
                return value.strip()
    except OSError:
        pass
    return ""


def _uv(plan: EnvPlan, step: str, cmd: list[str]) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "CONDA_PREFIX")}
    env.update(_UV_ENV)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL)
    except OSError as e:
        raise EnvBuildError(f"environment {plan.key}: cannot run uv ({e.strerror or e})", detail=str(e)) from e
    if proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip()
        raise EnvBuildError(f"environment {plan.key} from {plan.lock}: {step} failed: {summary(detail)} "
                            "(--debug shows uv's message)", detail=detail)


def summary(detail: str) -> str:
    """uv's message in one line: its ``error:`` line, with the cause that follows it when there is one."""
    lines = [ln.strip() for ln in detail.splitlines() if ln.strip()]
    for i, line in enumerate(lines):
        if line.startswith("error:"):
            head = line.removeprefix("error:").strip()
            for nxt in lines[i + 1:i + 2]:
                if nxt.startswith(("cause:", "Caused by:")):
                    head += ": " + nxt.split(":", 1)[1].strip()
            return head
    return lines[-1] if lines else "uv said nothing"
