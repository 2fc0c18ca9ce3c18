"""The log kit: replica checks, stream names, filters, line splitting and following files."""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from tsm.errors import UnknownAppError
from tsm.schedulers.api import DescribeAppResponse, Stream, split_lines_iterator as from_api
from tsm.schedulers.common.logs import (
    check_log_target,
    check_replica,
    file_reader,
    filter_regex,
    follow,
    in_window,
    read_files,
    replica_counts,
    split_lines,
    split_lines_iterator,
    stream_names,
    utf8_chunks,
)
from tsm.specs.api import AppState, ReplicaStatus, RoleStatus


def test_check_replica_names_the_valid_ones() -> None:
    check_replica("a1", {"trainer": 2, "ps": 1}, "trainer", 1)
    with pytest.raises(UnknownAppError, match=r"no role 'x' \(roles: trainer, ps\)"):
        check_replica("a1", {"trainer": 2, "ps": 1}, "x", 0)
    with pytest.raises(UnknownAppError, match=r"replicas 0\.\.1, not 2"):
        check_replica("a1", {"trainer": 2}, "trainer", 2)
    with pytest.raises(UnknownAppError, match="not -1"):
        check_replica("a1", {"trainer": 2}, "trainer", -1)


def test_check_log_target_names_an_unknown_app_then_checks_the_replica() -> None:
    with pytest.raises(UnknownAppError, match="^no docker app 'a1'$"):
        check_log_target("docker", "a1", None, "trainer", 0)
    check_log_target("ray", "a1", {"trainer": 2}, "trainer", 1)
    with pytest.raises(UnknownAppError, match=r"no role 'x' \(roles: trainer\)"):
        check_log_target("ray", "a1", {"trainer": 2}, "x", 0)


def test_replica_counts_prefer_the_submitted_shape_then_describe() -> None:
    asked: list[str] = []

    def describe() -> DescribeAppResponse | None:
        asked.append("describe")
        reps = [ReplicaStatus(id=k, state=AppState.RUNNING, role="w") for k in range(3)]
        return DescribeAppResponse(app_id="a1", roles_statuses=[RoleStatus("w", reps), RoleStatus("ps")])

    assert replica_counts([["trainer", "2", 0, "APPLICATION"], ["ps", 1, 0, "ROLE"]], describe) == {"trainer": 2, "ps": 1}
    assert asked == []  # the shape is enough: no status query
    assert replica_counts(None, describe) == {"w": 3, "ps": 0}
    assert replica_counts(None, lambda: None) is None


def test_utf8_chunks_never_cut_a_character() -> None:
    text = "añ€😀z" * 3
    raw = text.encode()
    for size in range(1, 6):
        chunks = [raw[i : i + size] for i in range(0, len(raw), size)]
        out = list(utf8_chunks(chunks))
        assert b"".join(out) == raw
        assert "".join(c.decode() for c in out) == text  # each chunk decodes on its own
    assert b"".join(utf8_chunks([b"ok\xff", b"!"])) == b"ok\xff!"  # not UTF-8: every byte is passed on
    assert list(utf8_chunks([b"\xe2\x82"])) == [b"\xe2\x82"]  # a cut sequence at the end is still given


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
