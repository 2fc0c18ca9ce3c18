"""Tests for tsm.specs.runopts: declaring, parsing, resolving and printing run options."""

from __future__ import annotations

from typing import Any

import pytest

from tsm.errors import InvalidRunOptionError
from tsm.specs.runopts import is_type, parse_cfg_value, runopt, runopts, type_name

ALL_TYPES: list[Any] = [str, int, float, bool, list[str], dict[str, str]]


def _opts() -> runopts:
    o = runopts()
    o.add("log_dir", str, "where logs go", default="/tmp/logs")
    o.add("grace_period", float, "seconds between SIGTERM and SIGKILL", default=5.0)
    o.add("retries", int, "how many times", default=0)
    o.add("verbose", bool, "talk more", default=False)
    o.add("tags", list[str], "labels", default=["a"])
    o.add("labels", dict[str, str], "k8s labels", default={"team": "ml"})
    o.add("queue", str, "the queue to submit to", required=True)
    o.add("nodes", list[str], "optional hosts")
    return o


# -- type_name / is_type ----------------------------------------------------------------------------
def test_type_names() -> None:
    assert [type_name(t) for t in ALL_TYPES] == ["str", "int", "float", "bool", "list[str]", "dict[str, str]"]
    assert type_name(bytes) == "bytes"


@pytest.mark.parametrize(
    ("value", "type_", "expected"),
    [
        ("x", str, True),
        (1, str, False),
        (1, int, True),
        (True, int, False),  # a bool is not an int
        (1.0, int, False),
        (1.5, float, True),
        (2, float, True),  # an int is a float
        (False, float, False),
        (True, bool, True),
        (1, bool, False),
        ("true", bool, False),
        (["a", "b"], list[str], True),
        ([], list[str], True),
        (["a", 1], list[str], False),
        (("a",), list[str], False),
        ("a,b", list[str], False),
        ({"k": "v"}, dict[str, str], True),
        ({}, dict[str, str], True),
        ({"k": 1}, dict[str, str], False),
        ({1: "v"}, dict[str, str], False),
        ([("k", "v")], dict[str, str], False),
        (None, str, False),
    ],
)
def test_is_type(value: Any, type_: Any, expected: bool) -> None:
    assert is_type(value, type_) is expected


def test_is_type_rejects_unsupported_type() -> None:
    with pytest.raises(InvalidRunOptionError, match="unsupported run option type"):
        is_type(b"x", bytes)


# -- parse_cfg_value --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "type_", "expected"),
    [
        ("hello", str, "hello"),
        ("", str, ""),
        (" spaced ", str, " spaced "),
        ("a,b", str, "a,b"),
        ("42", int, 42),
        ("-7", int, -7),
        (" 3 ", int, 3),
        ("2.5", float, 2.5),
        ("3", float, 3.0),
        ("1e3", float, 1000.0),
        ("true", bool, True),
        ("True", bool, True),
        ("YES", bool, True),
        ("on", bool, True),
        ("1", bool, True),
        (" false ", bool, False),
        ("no", bool, False),
        ("off", bool, False),
        ("0", bool, False),
        ("a,b", list[str], ["a", "b"]),
        ("a", list[str], ["a"]),
        (" a , b ,,c, ", list[str], ["a", "b", "c"]),
        ("", list[str], []),
        ("k:v,k2:v2", dict[str, str], {"k": "v", "k2": "v2"}),
        (" k : v , k2:v2 ", dict[str, str], {"k": "v", "k2": "v2"}),
        ("url:http://host:80", dict[str, str], {"url": "http://host:80"}),
        ("k:", dict[str, str], {"k": ""}),
        ("k:a,k:b", dict[str, str], {"k": "b"}),
        ("", dict[str, str], {}),
    ],
)
def test_parse_cfg_value(text: str, type_: Any, expected: Any) -> None:
    got = parse_cfg_value("opt", text, type_)
    assert got == expected
    assert type(got) is type(expected)
    assert is_type(got, type_)


@pytest.mark.parametrize(
    ("text", "type_", "fragment"),
    [
        ("abc", int, "expects int, got 'abc'"),
        ("1.5", int, "expects int, got '1.5'"),
        ("", int, "expects int, got ''"),
        ("x", float, "expects float, got 'x'"),
        ("maybe", bool, "expects bool (true or false), got 'maybe'"),
        ("", bool, "expects bool (true or false), got ''"),
        ("k=v", dict[str, str], "expects dict[str, str] (key:value,key2:value2), got 'k=v'"),
        (":v", dict[str, str], "expects dict[str, str] (key:value,key2:value2), got ':v'"),
        (" :v", dict[str, str], "expects dict[str, str] (key:value,key2:value2)"),
        ("k:v,bad", dict[str, str], "got 'k:v,bad'"),
    ],
)
def test_parse_cfg_value_errors_name_option_and_type(text: str, type_: Any, fragment: str) -> None:
    with pytest.raises(InvalidRunOptionError) as ei:
        parse_cfg_value("myopt", text, type_)
    assert str(ei.value).startswith("run option 'myopt' ")
    assert fragment in str(ei.value)


def test_parse_cfg_value_unsupported_type() -> None:
    with pytest.raises(InvalidRunOptionError, match=r"run option 'o' has unsupported type"):
        parse_cfg_value("o", "x", bytes)


# -- add / get --------------------------------------------------------------------------------------
def test_add_and_get() -> None:
    o = _opts()
    opt = o.get("grace_period")
    assert opt == runopt("grace_period", float, 5.0, False, "seconds between SIGTERM and SIGKILL")
    assert o.get("queue") == runopt("queue", str, None, True, "the queue to submit to")
    assert o.get("nope") is None
    assert "log_dir" in o and "nope" not in o
    assert len(o) == 8
    assert [name for name, _ in o] == [
        "log_dir", "grace_period", "retries", "verbose", "tags", "labels", "queue", "nodes"
    ]


def test_runopt_is_frozen() -> None:
    opt = runopt("a", str, None, False, "h")
    with pytest.raises(AttributeError):
        opt.name = "b"  # type: ignore[misc]


@pytest.mark.parametrize("type_", ALL_TYPES)
def test_add_accepts_every_supported_type(type_: Any) -> None:
    o = runopts()
    o.add("x", type_, "help")
    assert o.get("x") is not None


@pytest.mark.parametrize("type_", [bytes, list, dict, list[int], dict[str, int], tuple[str], object])
def test_add_rejects_unsupported_type(type_: Any) -> None:
    with pytest.raises(InvalidRunOptionError) as ei:
        runopts().add("x", type_, "help")
    msg = str(ei.value)
    assert "run option 'x': type must be one of" in msg
    assert "str, int, float, bool, list[str], dict[str, str]" in msg


def test_required_option_may_not_have_a_default() -> None:
    with pytest.raises(InvalidRunOptionError, match="run option 'q' is required and so cannot have a default"):
        runopts().add("q", str, "help", default="x", required=True)


@pytest.mark.parametrize(
    ("type_", "default"),
    [(int, "1"), (str, 1), (bool, "true"), (float, "1.0"), (list[str], "a"), (dict[str, str], {"k": 1})],
)
def test_default_must_match_type(type_: Any, default: Any) -> None:
    with pytest.raises(InvalidRunOptionError) as ei:
        runopts().add("d", type_, "help", default=default)
    assert f"run option 'd': default {default!r} is not of type {type_name(type_)}" == str(ei.value)


def test_int_default_of_float_option_is_a_float() -> None:
    o = runopts()
    o.add("f", float, "help", default=5)
    assert o.resolve({}) == {"f": 5.0}
    assert type(o.resolve({})["f"]) is float


def test_later_add_replaces_and_update_merges() -> None:
    a = runopts()
    a.add("x", int, "first", default=1)
    a.add("x", int, "second", default=2)
    assert a.get("x") == runopt("x", int, 2, False, "second")
    b = runopts()
    b.add("x", int, "from b", default=3)
    b.add("y", str, "only b")
    a.update(b)
    assert a.get("x") == runopt("x", int, 3, False, "from b")
    assert "y" in a


# -- resolve ----------------------------------------------------------------------------------------
def test_resolve_fills_defaults() -> None:
    assert _opts().resolve({"queue": "q"}) == {
        "log_dir": "/tmp/logs",
        "grace_period": 5.0,
        "retries": 0,
        "verbose": False,
        "tags": ["a"],
        "labels": {"team": "ml"},
        "queue": "q",
        "nodes": None,
    }


def test_resolve_typed_values() -> None:
    cfg = {
        "queue": "q",
        "log_dir": "/x",
        "grace_period": 2,
        "retries": 3,
        "verbose": True,
        "tags": ["x", "y"],
        "labels": {"a": "b"},
        "nodes": [],
    }
    out = _opts().resolve(cfg)
    assert out == {**cfg, "grace_period": 2.0}
    assert type(out["grace_period"]) is float


def test_resolve_parses_string_forms() -> None:
    out = _opts().resolve(
        {"queue": "q", "grace_period": "1.5", "retries": "4", "verbose": "yes", "tags": "a,b", "labels": "k:v,k2:v2"}
    )
    assert out["grace_period"] == 1.5
    assert out["retries"] == 4
    assert out["verbose"] is True
    assert out["tags"] == ["a", "b"]
    assert out["labels"] == {"k": "v", "k2": "v2"}


def test_resolve_keeps_strings_for_str_options() -> None:
    assert _opts().resolve({"queue": "a,b", "log_dir": "true"})["queue"] == "a,b"


def test_resolve_none_means_not_given() -> None:
    o = _opts()
    assert o.resolve({"queue": "q", "retries": None})["retries"] == 0
    with pytest.raises(InvalidRunOptionError, match="run option 'queue' is required"):
        o.resolve({"queue": None})


def test_resolve_does_not_mutate_cfg() -> None:
    cfg = {"queue": "q", "tags": "a,b"}
    _opts().resolve(cfg)
    assert cfg == {"queue": "q", "tags": "a,b"}


def test_resolve_none_or_empty_cfg() -> None:
    o = runopts()
    o.add("x", int, "help", default=1)
    assert o.resolve(None) == {"x": 1}
    assert o.resolve({}) == {"x": 1}
    assert runopts().resolve(None) == {}


def test_resolve_passes_an_unknown_key_on_with_a_warning_that_names_it(caplog: pytest.LogCaptureFixture) -> None:
    # a cfg may be shared by several schedulers (TorchX's rule): an undeclared key is not an error ...
    with caplog.at_level("WARNING", logger="tsm"):
        out = _opts().resolve({"queue": "q", "grace_perod": 1.0})
    assert out["grace_perod"] == 1.0 and out["queue"] == "q"  # passed on unchecked, for another scheduler
    # ... but a typo stays visible
    msg = caplog.text
    assert "unknown run option 'grace_perod'" in msg
    assert "(did you mean 'grace_period'?)" in msg
    assert "known options: grace_period, labels, log_dir, nodes, queue, retries, tags, verbose" in msg


def test_check_known_is_the_strict_form() -> None:
    with pytest.raises(InvalidRunOptionError) as ei:
        _opts().check_known({"queue": "q", "grace_perod": 1.0})
    assert "unknown run option 'grace_perod'" in str(ei.value)
    assert "(did you mean 'grace_period'?)" in str(ei.value)
    _opts().check_known({"queue": "q"})  # declared keys pass
    with pytest.raises(InvalidRunOptionError, match="unknown run option 'x'; known options: none"):
        runopts().check_known({"x": 1})


def test_resolve_unknown_key_without_close_match(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="tsm"):
        _opts().resolve({"zzzzzz": 1, "queue": "q"})
    assert "did you mean" not in caplog.text
    assert "unknown run option 'zzzzzz'" in caplog.text


def test_resolve_unknown_key_when_none_declared(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="tsm"):
        assert runopts().resolve({"x": 1}) == {"x": 1}
    assert "unknown run option 'x'; known options: none" in caplog.text


def test_resolve_required_missing_says_how_to_pass_it() -> None:
    with pytest.raises(InvalidRunOptionError) as ei:
        _opts().resolve({})
    msg = str(ei.value)
    assert "run option 'queue' is required" in msg
    assert "-c queue=<str>" in msg
    assert "the queue to submit to" in msg


@pytest.mark.parametrize(
    ("key", "value", "fragment"),
    [
        ("retries", 1.5, "run option 'retries' expects int, got float 1.5"),
        ("retries", True, "run option 'retries' expects int, got bool True"),
        ("verbose", 1, "run option 'verbose' expects bool, got int 1"),
        ("log_dir", 5, "run option 'log_dir' expects str, got int 5"),
        ("tags", ["a", 1], "run option 'tags' expects list[str], got list ['a', 1]"),
        ("tags", ("a",), "run option 'tags' expects list[str], got tuple ('a',)"),
        ("labels", {"k": 1}, "run option 'labels' expects dict[str, str], got dict {'k': 1}"),
        ("grace_period", [1.0], "run option 'grace_period' expects float, got list [1.0]"),
    ],
)
def test_resolve_wrong_type_names_expected_type(key: str, value: Any, fragment: str) -> None:
    with pytest.raises(InvalidRunOptionError) as ei:
        _opts().resolve({"queue": "q", key: value})
    assert fragment in str(ei.value)


@pytest.mark.parametrize(
    ("key", "value", "fragment"),
    [
        ("retries", "many", "run option 'retries' expects int, got 'many'"),
        ("verbose", "perhaps", "run option 'verbose' expects bool (true or false), got 'perhaps'"),
        ("labels", "novalue", "run option 'labels' expects dict[str, str] (key:value,key2:value2), got 'novalue'"),
        ("grace_period", "soon", "run option 'grace_period' expects float, got 'soon'"),
    ],
)
def test_resolve_bad_string_forms(key: str, value: str, fragment: str) -> None:
    with pytest.raises(InvalidRunOptionError) as ei:
        _opts().resolve({"queue": "q", key: value})
    assert fragment in str(ei.value)


def test_resolve_float_too_large() -> None:
    o = runopts()
    o.add("f", float, "help")
    with pytest.raises(InvalidRunOptionError, match="run option 'f' expects float, got an integer too large"):
        o.resolve({"f": 10**400})


def test_resolve_wrong_type_message_is_short_for_huge_values() -> None:
    o = runopts()
    o.add("s", str, "help")
    with pytest.raises(InvalidRunOptionError) as ei:
        o.resolve({"s": list(range(1000))})
    assert len(str(ei.value)) < 200
    assert "run option 's' expects str, got list [0, 1, 2" in str(ei.value)
    with pytest.raises(InvalidRunOptionError, match="expects str, got int <int>"):
        o.resolve({"s": 10**5000})


# -- printing ---------------------------------------------------------------------------------------
def test_str_is_a_help_table() -> None:
    text = str(_opts())
    lines = text.splitlines()
    assert len(lines) == 9
    header = lines[0].split()
    assert header == ["name", "type", "default", "help"]
    row = {line.split()[0]: line for line in lines[1:]}
    assert set(row) == {"log_dir", "grace_period", "retries", "verbose", "tags", "labels", "queue", "nodes"}
    assert "float" in row["grace_period"] and "5.0" in row["grace_period"]
    assert row["grace_period"].rstrip().endswith("seconds between SIGTERM and SIGKILL")
    assert "(required)" in row["queue"] and "the queue to submit to" in row["queue"]
    assert "list[str]" in row["tags"] and "['a']" in row["tags"]
    assert "dict[str, str]" in row["labels"] and "{'team': 'ml'}" in row["labels"]
    assert "None" in row["nodes"]
    # columns line up: every help text starts at the same column
    col = lines[0].index("help")
    assert row["log_dir"][col:] == "where logs go"
    assert all(line.startswith("    ") for line in lines)


def test_str_empty() -> None:
    assert str(runopts()) == "    (no run options)"


def test_repr_lists_names() -> None:
    o = runopts()
    o.add("a", str, "h")
    o.add("b", int, "h")
    assert repr(o) == "runopts(['a', 'b'])"
