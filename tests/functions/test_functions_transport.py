"""The transport of function jobs, pure: headers, argument words, result lines in a log, the worker's
command line (read back from an app definition)."""

from __future__ import annotations

import pickle

import pytest

from tsm.functions import payload
from tsm.functions.errors import FunctionPickleError, FunctionVersionError, TransportError
from tsm.functions.spec import WorkerArgs, is_worker, parse


def test_a_payload_round_trips_and_names_what_will_not_pickle() -> None:
    data = payload.dumps({"x": [1, 2]}, "the call")
    assert payload.loads(data) == {"x": [1, 2]}
    assert payload.from_words(payload.to_words(data)) == data
    import threading

    with pytest.raises(FunctionPickleError, match="cannot pickle the call: TypeError"):
        payload.dumps(threading.Lock(), "the call")


def test_another_python_is_refused_by_its_header() -> None:
    data = payload.dumps(1, "x").replace(payload.python_version().encode(), b"3.2", 1)
    with pytest.raises(FunctionVersionError, match=r"pickled by Python 3\.2"):
        payload.loads(data)


def test_words_fit_one_argument_each() -> None:
    words = payload.to_words(b"\xff" * 300_000)
    assert len(words) > 1 and all(len(w) <= payload.WORD for w in words)


def test_result_lines_survive_other_output_and_a_retry() -> None:
    first = list(payload.frames("n1", 0, b"first attempt"))
    data = bytes(range(256)) * 40
    reader = payload.FrameReader("n1")
    noise = ["epoch 1\n", f"{payload.FRAME} other-job 0 0/1 abc\n", "progress 50%\r"]
    for line in [*noise, *first, "retrying\n", *payload.frames("n1", 0, data)]:
        reader.feed(line)
    assert reader.seen(0) and reader.data(0) == data  # the last attempt's frames win
    assert not reader.seen(1)


def test_a_result_cut_short_or_altered_is_a_transport_error() -> None:
    lines = list(payload.frames("n", 0, b"x" * 10_000))
    reader = payload.FrameReader("n")
    for line in lines[:-1]:
        reader.feed(line)
    with pytest.raises(TransportError, match="came back in part"):
        reader.data(0)
    reader = payload.FrameReader("n")
    for line in [*lines[:2], lines[2].replace(lines[2][-5:-1], "AAAA"), *lines[3:]]:
        reader.feed(line)
    with pytest.raises(TransportError, match="checksum"):
        reader.data(0)


def test_an_exception_travels_alone_and_a_bad_value_becomes_an_error() -> None:
    outcome = payload.loads(payload.dump_outcome(payload.error_outcome(ValueError("v"), "tb")))
    assert outcome[0] == payload.ERROR and outcome[2] == "builtins.ValueError" and outcome[4] == "tb"
    assert isinstance(pickle.loads(outcome[1]), ValueError)
    import threading

    data = payload.dump_outcome((payload.OK, threading.Lock()))
    kind, _, type_name, message, _ = payload.loads(data)
    assert kind == payload.ERROR and "FunctionPickleError" in type_name and "_thread.lock" in message


def test_the_worker_command_line_reads_back_with_or_without_setup() -> None:
    args = WorkerArgs(nonce="ab", dir="/d/0", item="3:xyz", index=3, tasks_per_node=2, words=["w1", "-w2"])
    argv = args.argv()
    assert is_worker(argv) and parse(argv) == args
    wrapped = ["-c", "set -e\nsetup\n\"$@\"", "tsm-function", "python", *argv]
    assert parse(wrapped) == args
    assert not is_worker(["-c", "print(1)"]) and not is_worker(["-m", "other"])
    with pytest.raises(ValueError, match="unknown worker option"):
        parse([*argv[:2], "--nonce", "x", "--bogus", "1", "--"])
