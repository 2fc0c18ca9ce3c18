"""What an environment is, decided at dry run: its lock read and checked, and its content key.

:func:`plan` turns a role's :class:`~tsm.specs.environment.Environment` and the run's index settings into
an :class:`EnvPlan`, the value the dry run shows and the build consumes. A lock that cannot be read, is
not the TOML it claims, or pins hashes on some requirements but not others is refused here, with one line
naming the file, before anything is built or started. Reads the lock files; runs nothing.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from tsm.errors import InvalidAppError, InvalidRunOptionError
from tsm.specs.environment import Environment

#: The kinds of lock, by what the file is called.
KINDS = ("uv.lock", "pylock", "requirements")

#: Bump when what a key covers changes, so old caches are not taken for new ones.
KEY_VERSION = 1

#: The installer's own settings that change what a build fetches: part of the key when set.
_UV_SETTINGS = ("UV_INDEX_URL", "UV_DEFAULT_INDEX", "UV_INDEX", "UV_EXTRA_INDEX_URL", "UV_FIND_LINKS",
                "UV_NO_INDEX", "UV_PRERELEASE")

_PYTHON_RE = re.compile(r"^\d+(\.\d+){0,2}$")


@dataclass(frozen=True)
class IndexSettings:
    """Where packages come from: an index URL, wheelhouse directories; with only wheelhouses, offline."""

    index_url: str | None = None
    find_links: tuple[str, ...] = ()

    @property
    def offline(self) -> bool:
        """True when the build may use nothing but the wheelhouses (no index at all)."""
        return bool(self.find_links) and not self.index_url


@dataclass(frozen=True)
class EnvPlan:
    """One environment to build or reuse: its key, its lock, the Python it is for and its index settings."""

    key: str
    kind: str
    lock: str
    python: str
    platform: str
    project: str | None = None
    index_url: str | None = None
    find_links: tuple[str, ...] = field(default_factory=tuple)

    @property
    def settings(self) -> IndexSettings:
        return IndexSettings(self.index_url, self.find_links)

    def to_dict(self) -> dict[str, Any]:
        """Plain data for a request file (``from_dict`` reads it back)."""
        out = asdict(self)
        out["find_links"] = list(self.find_links)
        return out

    @staticmethod
    def from_dict(data: dict[str, Any]) -> EnvPlan:
        return EnvPlan(**{**data, "find_links": tuple(data.get("find_links") or ())})


def kind_of(path: str) -> str:
    """``uv.lock``, ``pylock`` or ``requirements`` from the file's name; anything else is refused."""
    name = os.path.basename(path)
    if name == "uv.lock":
        return "uv.lock"
    if name == "pylock.toml" or (name.startswith("pylock.") and name.endswith(".toml")):
        return "pylock"
    if name.endswith(".txt"):
        return "requirements"
    raise InvalidAppError(
        f"environment lock {path!r}: not a uv.lock, a pylock.toml (pylock.*.toml) or a requirements *.txt; "
        "name the lock file itself"
    )


def this_platform() -> str:
    """The platform a build here is for: OS and machine (``linux-x86_64``)."""
    return f"{sys.platform}-{os.uname().machine}"


def default_python() -> str:
    """The Python version an environment without one is built for: the running interpreter's ``X.Y``."""
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def plan(env: Environment, settings: IndexSettings | None = None, platform: str | None = None,
         where: str = "environment", built: Callable[[str], bool] | None = None) -> EnvPlan:
    """Read and check ``env``'s lock; return its plan with the content key (see :func:`content_key`).

    ``built(key)`` says whether the key's environment is ready already: then the lock, which built it, is
    not parsed again (a warm launch pays for reading and hashing it only).
    """
    settings = settings or IndexSettings()
    lock = os.path.abspath(os.path.expanduser(env.lock))
    kind = kind_of(lock)
    python = (env.python or default_python()).strip()
    if not _PYTHON_RE.match(python):
        raise InvalidAppError(f"{where}: python {python!r} is not a version such as 3.12 or 3.12.4")
    data = _read(lock, where)
    project = None
    extra = b""
    if kind == "uv.lock":
        project = os.path.join(os.path.dirname(lock), "pyproject.toml")
        extra = _read(project, f"{where} (the pyproject.toml beside {os.path.basename(lock)})")
    for d in settings.find_links:
        if not os.path.isdir(d):
            raise InvalidRunOptionError(f"run option find_links: {d!r} is not a directory; give a wheelhouse folder")
    plat = platform or this_platform()
    key = content_key(kind, data, extra, python, plat, settings)
    if built is None or not built(key):
        _check(kind, lock, data, where)
    return EnvPlan(key=key, kind=kind, lock=lock, python=python, platform=plat, project=project,
                   index_url=settings.index_url, find_links=tuple(settings.find_links))


def _check(kind: str, lock: str, data: bytes, where: str) -> None:
    """Refuse a lock that is not what its name says (what :func:`plan` checks before a build)."""
    if kind == "uv.lock":
        _check_toml(lock, data, where, ("version",), "package")
    elif kind == "pylock":
        _check_toml(lock, data, where, ("lock-version",), "packages")
    else:
        _check_requirements(lock, data, where)


def content_key(kind: str, lock: bytes, project: bytes, python: str, platform: str,
                settings: IndexSettings, environ: dict[str, str] | None = None) -> str:
    """16 hex digits of SHA-256 over the lock's bytes, its project file, Python, platform and index settings.

    Paths of the lock itself are not part of it: the same lock in two checkouts is one environment.
    """
    import hashlib  # not at module level: a launch without an environment never hashes (7 ms of imports)

    env = os.environ if environ is None else environ
    head = {
        "v": KEY_VERSION, "kind": kind, "python": python, "platform": platform,
        "index_url": settings.index_url, "find_links": [os.path.abspath(d) for d in settings.find_links],
        "uv": {k: env[k] for k in _UV_SETTINGS if env.get(k)},
    }
    h = hashlib.sha256(json.dumps(head, sort_keys=True).encode())
    for part in (lock, project):
        h.update(len(part).to_bytes(8, "big"))
        h.update(part)
    return h.hexdigest()[:16]


def _read(path: str, where: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise InvalidAppError(f"{where}: cannot read {path}: {e.strerror or e}; give an existing lock file") from e


def _check_toml(path: str, data: bytes, where: str, keys: tuple[str, ...], table: str) -> None:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib

    try:
        doc = tomllib.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise InvalidAppError(f"{where}: {path} is not valid TOML ({e}); regenerate the lock") from e
    missing = [k for k in keys if k not in doc]
    if missing or not isinstance(doc.get(table, []), list):
        raise InvalidAppError(
            f"{where}: {path} is not a {os.path.basename(path)} lock (no {', '.join(missing) or table}); "
            "regenerate it (uv lock, uv export --format pylock.toml)"
        )


def _check_requirements(path: str, data: bytes, where: str) -> None:
    """Refuse a requirements file whose hashes are partial: pip and uv would reject it mid-build."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidAppError(f"{where}: {path} is not UTF-8 text") from e
    reqs = _logical_lines(text)
    hashed = [r for r in reqs if "--hash=" in r]
    if hashed and len(hashed) != len(reqs):
        bare = next(r for r in reqs if "--hash=" not in r)
        raise InvalidAppError(
            f"{where}: {path} pins hashes on some requirements but not on {bare.split()[0]!r}; hash every one "
            "(uv pip compile --generate-hashes) or none"
        )


def _logical_lines(text: str) -> list[str]:
    """The requirement lines of a requirements file: continuations joined, comments and options dropped."""
    out: list[str] = []
    cur = ""
    for raw in text.splitlines():
        line = raw.split(" #", 1)[0].rstrip() if not raw.lstrip().startswith("#") else ""
        if line.endswith("\\"):
            cur += line[:-1] + " "
            continue
        cur += line
        if cur.strip() and not cur.strip().startswith("-"):
            out.append(cur.strip())
        cur = ""
    return out


def requires_hashes(lock: str) -> bool:
    """Whether a requirements file pins hashes (then every download is checked against them)."""
    with open(lock, encoding="utf-8") as f:
        return any("--hash=" in r for r in _logical_lines(f.read()))
