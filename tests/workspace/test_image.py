"""The pure parts of :mod:`tsm.workspace.image`: the build context and the plan kept in role metadata.

The build itself runs on the real Docker engine in the Kubernetes integration tests
(``test_workspace_image_is_built_once_and_runs``).
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

from tsm.specs.api import Role
from tsm.workspace.api import METADATA_KEY
from tsm.workspace.image import BUILD_DOCKERFILE, ImagePlan, context_tar


def _members(data: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        out = {}
        for m in tar.getmembers():
            f = tar.extractfile(m)
            out[m.name] = f.read() if f is not None else b""
        return out


def test_context_is_the_snapshot_less_dockerignore_plus_the_dockerfile(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "big.bin").write_bytes(b"\0" * 10)
    (tmp_path / ".dockerignore").write_text("data/\n")
    first = context_tar(str(tmp_path), "FROM base\nCOPY . /workspace\n")
    files = _members(first)
    assert files["train.py"] == b"print('hi')\n"
    assert files[BUILD_DOCKERFILE] == b"FROM base\nCOPY . /workspace\n"
    assert not any(n.startswith("data") for n in files)
    # the engine is told to leave the generated Dockerfile and the ignore file out of the image
    assert BUILD_DOCKERFILE in files[".dockerignore"].decode() and "data/" in files[".dockerignore"].decode()
    assert context_tar(str(tmp_path), "FROM base\nCOPY . /workspace\n") == first  # deterministic


def test_plan_is_read_back_from_the_roles_metadata_only_while_the_role_runs_its_tag() -> None:
    meta = {"snapshot": "/s", "base_image": "img:1", "base_image_id": "sha256:1", "docker_tag": "tsm-workspace:ab",
            "dockerfile": "FROM img:1\n", "build": True, "workspace": "/w", "digest": "d", "files": 1, "bytes": 2}
    role = Role("r", "tsm-workspace:ab", "sh", metadata={METADATA_KEY: dict(meta)})
    plan = ImagePlan.from_metadata(role)
    assert plan == ImagePlan("r", "/s", "img:1", "sha256:1", "tsm-workspace:ab", "FROM img:1\n", True)
    assert ImagePlan(**plan.to_dict()) == plan
    assert ImagePlan.from_metadata(Role("r", "other:1", "sh", metadata={METADATA_KEY: dict(meta)})) is None
    assert ImagePlan.from_metadata(Role("r", "img", "sh")) is None
