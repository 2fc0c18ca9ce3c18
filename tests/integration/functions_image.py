"""An image for function jobs on the real Docker engine and Kubernetes: the test Python image plus tsm and
cloudpickle (what a function job's replica imports), built locally once per content of both (no registry).

The tag is ``tsm-test/functions:<digest of tsm's sources, cloudpickle's version and the base image>``, so an
unchanged tree reuses the image and a change builds a new one (a few seconds: two folders copied on the base).
"""

from __future__ import annotations

import fcntl
import hashlib
import shutil
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _digest(base: str, *trees: Path) -> str:
    h = hashlib.sha256(base.encode())
    for tree in trees:
        for path in sorted(tree.rglob("*.py")):
            h.update(str(path.relative_to(tree)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def functions_image(base: str) -> str:
    """The tag of ``base`` with tsm and cloudpickle in its Python's path (built if it is not there)."""
    import cloudpickle

    tsm_src, cp_src = ROOT / "src" / "tsm", Path(cloudpickle.__file__).parent
    tag = f"tsm-test/functions:{_digest(base, tsm_src, cp_src)}"
    lock_path = Path(tempfile.gettempdir()) / "tsm-functions-image.lock"
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if subprocess.run(["docker", "image", "inspect", tag], capture_output=True).returncode == 0:
            return tag
        with tempfile.TemporaryDirectory(prefix="tsm-functions-image-") as ctx:
            dist = Path(ctx) / "root" / "usr" / "lib" / "python3" / "dist-packages"
            ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
            shutil.copytree(tsm_src, dist / "tsm", ignore=ignore)
            shutil.copytree(cp_src, dist / "cloudpickle", ignore=ignore)
            (Path(ctx) / "Dockerfile").write_text(
                f"FROM {base}\nCOPY root/ /\nENV PYTHONPATH=/usr/lib/python3/dist-packages\n")
            subprocess.run(["docker", "build", "-q", "-t", tag, ctx], check=True, capture_output=True, timeout=600)
    return tag
