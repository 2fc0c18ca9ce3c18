"""Gitignore-style rules of ``.tsmignore`` / ``.torchxignore``: pattern semantics, and what a snapshot keeps."""

from __future__ import annotations

from pathlib import Path

import pytest

from tsm.workspace.dir import scan
from tsm.workspace.ignore import IgnoreRules, parse_line


def rules(*lines: str) -> IgnoreRules:
    return IgnoreRules.from_lines(list(lines))


@pytest.mark.parametrize(
    ("patterns", "path", "is_dir", "ignored"),
    [
        (["*.pyc"], "a.pyc", False, True),
        (["*.pyc"], "deep/er/a.pyc", False, True),  # no slash: any depth
        (["*.pyc"], "a.py", False, False),
        (["/top"], "top", False, True),  # leading slash: root only
        (["/top"], "sub/top", False, False),
        (["src/gen"], "src/gen", True, True),  # middle slash: anchored
        (["src/gen"], "x/src/gen", True, False),
        (["build/"], "build", True, True),  # trailing slash: directories only
        (["build/"], "build", False, False),
        (["build/"], "a/build", True, True),
        (["**/cache"], "cache", True, True),
        (["**/cache"], "a/b/cache", True, True),
        (["logs/**"], "logs/a/b.txt", False, True),
        (["logs/**"], "logs", True, False),
        (["a/**/b"], "a/b", False, True),
        (["a/**/b"], "a/x/y/b", False, True),
        (["a/**/b"], "ab", False, False),
        (["file?.txt"], "file1.txt", False, True),
        (["file?.txt"], "file/.txt", False, False),  # ? never matches a slash
        (["[abc].md"], "b.md", False, True),
        (["[!abc].md"], "b.md", False, False),
        (["[!abc].md"], "d.md", False, True),
        (["*.log", "!keep.log"], "keep.log", False, False),  # negation re-includes
        (["*.log", "!keep.log"], "other.log", False, True),
        (["!keep.log", "*.log"], "keep.log", False, True),  # last match wins
        (["\\!bang"], "!bang", False, True),  # escaped ! is literal
        (["\\#hash"], "#hash", False, True),
        (["# comment", ""], "# comment", False, False),
        (["trailing   "], "trailing", False, True),  # unescaped trailing spaces dropped
        (["sp\\ "], "sp ", False, True),
        (["*"], "anything/at/all", False, True),
        (["a*b"], "a/b", False, False),  # * never crosses a slash
    ],
)
def test_pattern_semantics(patterns: list[str], path: str, is_dir: bool, ignored: bool) -> None:
    assert rules(*patterns).ignored(path, is_dir) is ignored


def test_blank_and_comment_lines_are_not_patterns() -> None:
    assert parse_line("") is None
    assert parse_line("   ") is None
    assert parse_line("# x") is None
    assert parse_line("/") is None


def write(root: Path, rel: str, text: str = "x") -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)


def kept(root: Path) -> set[str]:
    return {e.path for e in scan(root).entries if e.kind != "dir"}


def test_snapshot_honours_tsmignore_with_negation_and_directory_patterns(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    for rel in ("main.py", "a.log", "keep.log", "build/out.o", "data/big.bin", "data/keep/small.txt",
                "src/build", "notes/x.tmp"):
        write(ws, rel)
    # "build/" drops the build directory but not the *file* src/build; "data/*" + "!data/keep" re-includes a dir
    write(ws, ".tsmignore", "*.log\n!keep.log\nbuild/\ndata/*\n!data/keep\n# a comment\n*.tmp\n")
    assert kept(ws) == {".tsmignore", "main.py", "keep.log", "src/build", "data/keep/small.txt"}
    ignored = set(scan(ws).ignored)
    assert {"a.log", "build/", "data/big.bin", "notes/x.tmp"} <= ignored


def test_file_in_an_excluded_directory_cannot_be_reincluded(tmp_path: Path) -> None:
    """Git's rule: an excluded directory is never entered, so "!build/keep.txt" after "build/" keeps nothing."""
    ws = tmp_path / "ws"
    write(ws, "build/keep.txt")
    write(ws, ".tsmignore", "build/\n!build/keep.txt\n")
    assert kept(ws) == {".tsmignore"}
    write(ws, ".tsmignore", "build/*\n!build/keep.txt\n")
    assert kept(ws) == {".tsmignore", "build/keep.txt"}


def test_torchxignore_is_read_and_tsmignore_overrides_it(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    for rel in ("a.ckpt", "b.ckpt", "c.txt"):
        write(ws, rel)
    write(ws, ".torchxignore", "*.ckpt\nc.txt\n")
    write(ws, ".tsmignore", "!b.ckpt\n")
    assert kept(ws) == {".torchxignore", ".tsmignore", "b.ckpt"}


def test_ignored_files_do_not_change_the_digest(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    write(ws, "main.py", "print(1)")
    write(ws, ".tsmignore", "*.out\n")
    before = scan(ws).digest
    write(ws, "run.out", "noise")
    assert scan(ws).digest == before
    write(ws, "main.py", "print(2)")
    assert scan(ws).digest != before
