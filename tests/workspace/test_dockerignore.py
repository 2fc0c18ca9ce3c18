"""``.dockerignore`` rules as the docker CLI applies them to a build context (pure, no engine)."""

from __future__ import annotations

import io
import tarfile

import pytest

from tsm.workspace.dockerignore import excluded, filter_tar, parse


@pytest.mark.parametrize(
    ("rules", "path", "out"),
    [
        ("secret.txt", "secret.txt", True),
        ("secret.txt", "sub/secret.txt", False),  # unlike .gitignore: relative to the root only
        ("/data", "data/a/b.bin", True),  # a directory covers what is under it
        ("*.log", "a.log", True),
        ("*.log", "d/a.log", False),  # * stays within one part
        ("**/*.log", "d/e/a.log", True),
        ("**/*.log", "a.log", True),
        ("a?c", "abc", True),
        ("*.md\n!README.md", "README.md", False),  # the last matching line wins
        ("*.md\n!README.md", "x.md", True),
        ("# a comment\n\n./build/", "build/x", True),
        ("a.b", "axb", False),  # regex characters are literal
    ],
)
def test_rules(rules: str, path: str, out: bool) -> None:
    assert excluded(path, parse(rules)) is out


def test_filter_tar_drops_excluded_members_and_keeps_the_rest() -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:") as tar:
        for name, data in (("keep.py", b"k"), ("secret.txt", b"s"), ("logs/a.log", b"l")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    out = filter_tar(buf.getvalue(), "secret.txt\nlogs\n")
    with tarfile.open(fileobj=io.BytesIO(out), mode="r:") as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar}  # type: ignore[union-attr]
    assert members == {"keep.py": b"k"}
    assert filter_tar(buf.getvalue(), "# nothing\n") == buf.getvalue()
