"""Offline lockfile environments for tests: a wheelhouse of tiny wheels written here, and locks made from it.

:func:`make_wheel` writes a real pure-Python wheel (METADATA, WHEEL, a RECORD with hashes) with the standard
library alone; :func:`uv_lock` runs ``uv lock --offline --no-index --find-links`` on a tiny project, so
every test builds from files it made itself, with no index reachable.
"""

from __future__ import annotations

import base64
import hashlib
import subprocess
import zipfile
from pathlib import Path

#: the package the test wheelhouse holds (a name no index serves, so nothing can come from elsewhere)
PACKAGE = "tsmenvdemo"


def make_wheel(wheelhouse: Path, version: str, name: str = PACKAGE) -> Path:
    """A wheel of ``name`` whose ``__version__`` is ``version``, in ``wheelhouse``."""
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": f"__version__ = {version!r}\n",
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: tsm-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    record.append(f"{dist}/RECORD,,")
    wheelhouse.mkdir(parents=True, exist_ok=True)
    out = wheelhouse / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(out, "w") as z:
        for path, text in files.items():
            z.writestr(path, text)
        z.writestr(f"{dist}/RECORD", "\n".join(record) + "\n")
    return out


def uv_bin() -> str:
    from tsm.env.build import uv_bin as find

    return find()


def uv_lock(project: Path, wheelhouse: Path, requirement: str) -> Path:
    """``project``/uv.lock (with its pyproject.toml) pinning ``requirement``, resolved offline from ``wheelhouse``."""
    project.mkdir(parents=True, exist_ok=True)
    (project / "pyproject.toml").write_text(
        f'[project]\nname = "envtest"\nversion = "0"\nrequires-python = ">=3.10"\ndependencies = ["{requirement}"]\n'
    )
    subprocess.run([uv_bin(), "lock", "--quiet", "--offline", "--no-index", "--find-links", str(wheelhouse),
                    "--project", str(project)], check=True, capture_output=True, text=True)
    return project / "uv.lock"
