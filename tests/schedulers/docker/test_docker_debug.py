"""The Docker exec relay on a real socket: Docker's multiplexed frames (8-byte headers) back onto stdout and
stderr, whatever the chunks they arrive in."""

from __future__ import annotations

import socket
import struct
import threading

import pytest

from tsm.schedulers.docker.debug import _relay


def frame(stream: int, data: bytes) -> bytes:
    return bytes([stream, 0, 0, 0]) + struct.pack(">I", len(data)) + data


@pytest.mark.parametrize("chunk", [1, 3, 9, 4096])
def test_frames_are_demultiplexed_in_order_whatever_the_chunking(capfd: pytest.CaptureFixture[str], chunk: int) -> None:
    wire = frame(1, b"hello ") + frame(2, b"oops\n") + frame(1, b"world\n") + frame(1, b"") + frame(2, b"\xc3\xa9\n")
    ours, theirs = socket.socketpair()

    def send() -> None:
        for i in range(0, len(wire), chunk):
            theirs.sendall(wire[i : i + chunk])
        theirs.close()

    t = threading.Thread(target=send)
    t.start()
    _relay(ours, multiplexed=True, stdin=False)
    t.join()
    ours.close()
    out, err = capfd.readouterr()
    assert out == "hello world\n" and err == "oops\n\u00e9\n"


def test_a_terminal_stream_is_copied_raw(capfd: pytest.CaptureFixture[str]) -> None:
    ours, theirs = socket.socketpair()
    theirs.sendall(b"\x01\x00raw bytes\r\n")
    theirs.close()
    _relay(ours, multiplexed=False, stdin=False)
    ours.close()
    assert capfd.readouterr().out == "\x01\x00raw bytes\r\n"
