"""Tests for tsm.specs.handles: building and parsing ``scheduler://session/app_id``."""

from __future__ import annotations

from typing import Any

import pytest

from tsm.errors import MalformedAppHandleError, TsmError
from tsm.specs.handles import ParsedAppHandle, make_app_handle, parse_app_handle


@pytest.mark.parametrize(
    ("handle", "parts"),
    [
        ("local://default/echo-1a2b3c", ("local", "default", "echo-1a2b3c")),
        ("slurm://s1/12345", ("slurm", "s1", "12345")),
        ("kubernetes://my_session/app.v2-x", ("kubernetes", "my_session", "app.v2-x")),
        ("ray.v2://s/a", ("ray.v2", "s", "a")),
        ("local:///app", ("local", "", "app")),  # the session may be empty
        ("l://s/...", ("l", "s", "...")),  # three dots is a name, not a parent directory
        ("l://s/.hidden", ("l", "s", ".hidden")),
        ("9sched://s/a", ("9sched", "s", "a")),
    ],
)
def test_parse(handle: str, parts: tuple[str, str, str]) -> None:
    parsed = parse_app_handle(handle)
    assert parsed == ParsedAppHandle(*parts)
    assert (parsed.scheduler, parsed.session, parsed.app_id) == parts


def test_make_round_trips() -> None:
    h = make_app_handle("local", "default", "echo-1")
    assert h == "local://default/echo-1"
    assert parse_app_handle(h) == ("local", "default", "echo-1")


@pytest.mark.parametrize(
    "handle",
    [
        "",
        "echo-1",  # no scheme
        "default/echo-1",
        "://default/echo-1",  # empty scheduler
        "local:/default/echo-1",
        "local:default/echo-1",
        "local://default",  # missing app id
        "local://default/",
        "local://",
        "local:///",
        "local://x/../../etc",  # path traversal
        "local://x/..",
        "local://x/.",
        "local://../app",
        "local://./app",
        "local://x/a/b",  # extra slashes
        "local://x//a",
        "local:////a",
        "local://x/a/",
        "local:///x/a",
        "local://x/my app",  # spaces
        "local://my session/app",
        "loc al://x/app",
        " local://x/app",
        "local://x/app ",
        "local://x/app\n",  # a trailing newline is not part of a handle
        "local://x/app\x00",
        "local://x/ap\tp",
        "local://x/app?x=1",
        "local://x/app#frag",
        "local://us@er/app",
        "local://x/\u00e9t\u00e9",  # non-ASCII
        "_local://x/app",
        "-local://x/app",
        ".local://x/app",
        "local://x/app\\b",
    ],
)
def test_malformed(handle: str) -> None:
    with pytest.raises(MalformedAppHandleError) as ei:
        parse_app_handle(handle)
    msg = str(ei.value)
    assert repr(handle) in msg
    assert "expected scheduler://session/app_id" in msg
    assert "e.g. local://default/" in msg


@pytest.mark.parametrize("handle", [None, 1, b"local://x/app", ["local://x/app"]])
def test_non_string_is_malformed(handle: Any) -> None:
    with pytest.raises(MalformedAppHandleError):
        parse_app_handle(handle)


@pytest.mark.parametrize(
    ("scheduler", "session", "app_id"),
    [
        ("local", "default", ".."),
        ("local", "..", "app"),
        ("local", "default", ""),
        ("", "default", "app"),
        ("local", "a/b", "app"),
        ("local", "default", "a/b"),
        ("local", "default", "a b"),
        ("local", "default", "app\n"),
        ("lo/cal", "default", "app"),
    ],
)
def test_make_rejects_bad_parts(scheduler: str, session: str, app_id: str) -> None:
    with pytest.raises(MalformedAppHandleError):
        make_app_handle(scheduler, session, app_id)


def test_malformed_is_a_value_error_and_tsm_error() -> None:
    with pytest.raises(ValueError):
        parse_app_handle("nope")
    with pytest.raises(TsmError):
        parse_app_handle("nope")


def test_app_handle_template_checks_its_parts_and_leaves_the_app_id_macro() -> None:
    from tsm.specs.handles import app_handle_template

    assert app_handle_template("local", "s") == "local://s/${app_id}"
    with pytest.raises(MalformedAppHandleError):
        app_handle_template("lo cal", "s")
