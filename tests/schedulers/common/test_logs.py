"""The log kit: replica checks, stream names, filters, line splitting and following files."""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from tsm.errors import UnknownAppError
from tsm.schedulers.api import Stream, split_lines_iterator as from_api
from tsm.schedulers.common.logs import (
    check_replica,
    file_reader,
    filter_regex,
    follow,
    in_window,
    read_files,
    split_lines,
    split_lines_iterator,
    stream_names,
)


def test_check_replica_names_the_valid_ones() -> None:
    check_replica("a1", {"trainer": 2, "ps": 1}, "trainer", 1)
    with pytest.raises(UnknownAppError, match=r"no role 'x' \(roles: trainer, ps\)"):
        check_replica("a1", {"trainer": 2, "ps": 1}, "x", 0)
    with pytest.raises(UnknownAppError, match=r"replicas 0\.\.1, not 2"):
        check_replica("a1", {"trainer": 2}, "trainer", 2)
    with pytest.raises(UnknownAppError, match="not -1"):
        check_replica("a1", {"trainer": 2}, "trainer", -1)


def test_stream_names() -> None:
    assert stream_names(None) == ["stdout", "stderr"]
    assert stream_names(Stream.STDERR) == ["stderr"]
    assert stream_names("stdout") == ["stdout"]


def test_filters_and_splitting() -> None:
    assert list(filter_regex("b+", ["a\n", "bb\n", "cb"])) == ["bb\n", "cb"]
    assert list(filter_regex(None, ["a"])) == ["a"]
    now = datetime.now()
    assert in_window(now.timestamp(), now - timedelta(seconds=1), now + timedelta(seconds=1))
    assert not in_window(now.timestamp(), now + timedelta(seconds=1), None)
    assert not in_window(now.timestamp(), None, now - timedelta(seconds=1))
    assert in_window(None, now, now)
    assert split_lines("a\nb\r\nc") == ["a\n", "b\r\n", "c"]
    text = "one\ntwo\n\nthree"
    for size in (1, 2, 5, 100):
        chunks = [text[i : i + size] for i in range(0, len(text), size)]
        assert list(split_lines_iterator(chunks)) == split_lines(text)
    assert from_api is split_lines_iterator


def test_read_files_keeps_bytes_that_are_not_utf8(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"x\xff\n")
    lines = list(read_files([tmp_path / "a", tmp_path / "missing"]))
    assert lines == ["x\udcff\n"] and lines[0].encode("utf-8", "surrogateescape") == b"x\xff\n"


def test_follow_yields_lines_as_written_and_drains_at_the_end(tmp_path: Path) -> None:
    out, err = tmp_path / "out", tmp_path / "err"
    done = threading.Event()

    def writer() -> None:
        with open(out, "ab", buffering=0) as o, open(err, "ab", buffering=0) as e:
            o.write(b"first\nhal")
            time.sleep(0.3)
            e.write(b"oops\n")
            o.write(b"f\nlast without newline")
        done.set()

    got: list[str] = []
    t = threading.Thread(target=writer)
    t.start()
    for line in follow([file_reader(out), file_reader(err)], done.is_set, busy=0.01, idle=0.05):
        got.append(line)
    t.join()
    assert got[0] == "first\n"
    assert sorted(got) == sorted(["first\n", "half\n", "oops\n", "last without newline"])
    assert got[-1] == "last without newline"
