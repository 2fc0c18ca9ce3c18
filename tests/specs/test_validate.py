"""Tests for tsm.specs.validate: every rule an AppDef must pass, and what each failure says."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tsm.errors import InvalidAppError, TsmError
from tsm.specs.api import AppDef, Resource, RetryPolicy, Role
from tsm.specs.validate import NAME_RE, check_name, validate_app, validate_role


def _role(name: str = "trainer", **kw: Any) -> Role:
    kw.setdefault("entrypoint", "python")
    return Role(name, **kw)


def _app(*roles: Role, name: str = "myapp") -> AppDef:
    return AppDef(name, roles=list(roles) or [_role()])


def _fails(app: AppDef, *fragments: str) -> str:
    with pytest.raises(InvalidAppError) as ei:
        validate_app(app)
    msg = str(ei.value)
    for f in fragments:
        assert f in msg, f"{f!r} not in {msg!r}"
    assert "\n" not in msg  # one line (a newline in a name shows as its repr)
    return msg


# -- valid apps -------------------------------------------------------------------------------------
def test_valid_app_passes() -> None:
    app = AppDef(
        "my-app_1",
        roles=[
            Role(
                "trainer",
                entrypoint="python",
                args=["-m", "train", ""],
                env={"LR": "0.1", "EMPTY": "", "lower.dots-ok": "x"},
                num_replicas=4,
                min_replicas=2,
                max_retries=3,
                retry_policy=RetryPolicy.ROLE,
                resource=Resource(cpu=0, gpu=0, memMB=0, devices={"efa": 0}),
                port_map={"http": 0, "_x9": 65535},
            ),
            Role("ps", entrypoint="ps", min_replicas=1, resource=Resource(cpu=0.5, memMB=10.5)),  # type: ignore[arg-type]
        ],
    )
    validate_app(app)


@pytest.mark.parametrize("name", ["a", "A", "0", "a-b", "a_b", "Trainer-01", "x" * 63, "9lives"])
def test_good_names(name: str) -> None:
    check_name(name, "role name")
    validate_app(_app(_role(name), name=name))


# -- names ------------------------------------------------------------------------------------------
BAD_NAMES = [
    "",
    "a/b",
    "/abs",
    "..",
    ".",
    "../x",
    "a b",
    " a",
    "a\n",  # a trailing newline must not slip through
    "a\nb",
    "a\tb",
    "a\x00",
    "a\x1b[31m",
    "a\x7f",
    "x" * 64,  # too long for a host label
    "-a",
    "_a",
    ".a",
    "a.b",
    "a:b",
    "a$b",
    "a\\b",
    "\u00e9t\u00e9",
    "a\u200bb",
]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_bad_role_names(name: str) -> None:
    msg = _fails(_app(_role(name)), f"role name {name!r} is not allowed", "1-63 letters, digits, '-' or '_'")
    assert "starting with a letter or digit" in msg


@pytest.mark.parametrize("name", BAD_NAMES)
def test_bad_app_names(name: str) -> None:
    _fails(_app(name=name), f"app name {name!r} is not allowed", "1-63 letters")


@pytest.mark.parametrize("name", [None, 1, b"abc", ["a"]])
def test_non_string_names(name: Any) -> None:
    with pytest.raises(InvalidAppError, match="session name .* is not allowed"):
        check_name(name, "session name")


def test_name_re_is_anchored_at_the_very_end() -> None:
    assert NAME_RE.match("abc")
    assert not NAME_RE.match("abc\n")


# -- app-level rules --------------------------------------------------------------------------------
def test_no_roles() -> None:
    _fails(AppDef("empty"), "app 'empty' has no roles", "add at least one Role")


def test_not_an_appdef() -> None:
    with pytest.raises(InvalidAppError, match="expected a tsm.AppDef, got Role"):
        validate_app(_role())  # type: ignore[arg-type]


def test_role_not_a_role() -> None:
    _fails(AppDef("a", roles=[{"name": "x"}]), "app 'a': roles must be tsm.Role, got dict")  # type: ignore[list-item]


def test_duplicate_role_names() -> None:
    _fails(
        _app(_role("worker"), _role("ps"), _role("worker")),
        "app 'myapp'",
        "role name 'worker' is used twice",
        "role names must be unique",
    )


# -- role-level rules -------------------------------------------------------------------------------
@pytest.mark.parametrize("entrypoint", ["", "   ", "\t\n"])
def test_empty_entrypoint(entrypoint: str) -> None:
    _fails(_app(_role(entrypoint=entrypoint)), "role 'trainer': entrypoint is empty", "set the command to run")


def test_entrypoint_not_a_string() -> None:
    _fails(_app(_role(entrypoint=None)), "role 'trainer': entrypoint is empty")


def test_entrypoint_nul() -> None:
    _fails(_app(_role(entrypoint="py\x00thon")), "role 'trainer': entrypoint contains a NUL byte")


def test_args_nul() -> None:
    _fails(
        _app(_role(args=["ok", "b\x00d"])),
        "role 'trainer': args[1] contains a NUL byte",
        "no process can receive",
        repr("b\x00d"),
    )


@pytest.mark.parametrize("args", [["a", 1], "a b", ("a",), None, [None]])
def test_args_not_list_of_str(args: Any) -> None:
    _fails(_app(_role(args=args)), "role 'trainer': args must be a list of strings", repr(args))


def test_env_value_nul() -> None:
    msg = _fails(
        _app(_role(env={"GOOD": "x", "BAD": "v\x00"})),
        "role 'trainer': env['BAD'] contains a NUL byte",
        "no process can receive",
    )
    assert "env name" not in msg  # the name is fine; the message is about the value


@pytest.mark.parametrize("key", ["", "A=B", "=", "A\x00"])
def test_bad_env_names(key: str) -> None:
    _fails(
        _app(_role(env={key: "v"})),
        f"role 'trainer': env name {key!r} is not allowed",
        "must be non-empty, without '=' or NUL",
    )


@pytest.mark.parametrize(("key", "value"), [(1, "v"), ("K", 1), ("K", None), (None, "v")])
def test_env_not_str_to_str(key: Any, value: Any) -> None:
    _fails(_app(_role(env={key: value})), "role 'trainer': env entry", "must map str to str")


def test_env_not_a_dict() -> None:
    _fails(_app(_role(env=[("A", "1")])), "role 'trainer': env must be a dict of str to str")


@pytest.mark.parametrize("n", [0, -1, True, 1.0, "2", None])
def test_bad_num_replicas(n: Any) -> None:
    _fails(_app(_role(num_replicas=n)), "role 'trainer': num_replicas must be an integer > 0", f"got {n!r}")


@pytest.mark.parametrize("n", [0, -1, True, 1.5, "1"])
def test_bad_min_replicas(n: Any) -> None:
    _fails(_app(_role(num_replicas=2, min_replicas=n)), "role 'trainer': min_replicas must be an integer > 0", f"got {n!r}")


def test_absurd_num_replicas_is_refused_before_anything_is_built() -> None:
    from tsm.specs.validate import MAX_REPLICAS

    _fails(_app(_role(num_replicas=MAX_REPLICAS + 1)), "role 'trainer': num_replicas", "more than tsm's limit")
    validate_app(_app(_role(num_replicas=MAX_REPLICAS)))


def test_min_replicas_greater_than_num_replicas() -> None:
    _fails(
        _app(_role(num_replicas=2, min_replicas=3)),
        "role 'trainer': min_replicas (3) is greater than num_replicas (2)",
    )


def test_min_replicas_equal_to_num_replicas_is_fine() -> None:
    validate_app(_app(_role(num_replicas=2, min_replicas=2)))


@pytest.mark.parametrize("n", [-1, True, 1.0, None])
def test_bad_max_retries(n: Any) -> None:
    _fails(_app(_role(max_retries=n)), "role 'trainer': max_retries must be an integer >= 0", f"got {n!r}")


def test_bad_retry_policy() -> None:
    _fails(_app(_role(retry_policy="ROLE")), "role 'trainer': retry_policy must be a tsm.RetryPolicy", "'ROLE'")


@pytest.mark.parametrize("field_name", ["cpu", "gpu", "memMB"])
@pytest.mark.parametrize("value", [-1, -0.5, True, "1", None, float("nan"), float("inf"), float("-inf")])
def test_bad_resource_numbers(field_name: str, value: Any) -> None:
    res = Resource()
    setattr(res, field_name, value)
    _fails(
        _app(_role(resource=res)),
        f"role 'trainer': resource.{field_name} must be a number >= 0",
        f"got {value!r}",
    )


def test_huge_int_resource_is_a_number() -> None:
    validate_app(_app(_role(resource=Resource(memMB=10**400))))


def test_resource_not_a_resource() -> None:
    _fails(_app(_role(resource={"cpu": 1})), "role 'trainer': resource must be a tsm.Resource, got dict")


@pytest.mark.parametrize("count", [-1, True, 1.5, "1", None])
def test_bad_device_counts(count: Any) -> None:
    _fails(
        _app(_role(resource=Resource(devices={"efa": count}))),
        "role 'trainer': resource.devices['efa'] must be an integer >= 0",
        f"got {count!r}",
    )


def test_devices_not_a_dict() -> None:
    _fails(_app(_role(resource=Resource(devices=["efa"]))), "role 'trainer': resource.devices must be a dict")  # type: ignore[arg-type]


@pytest.mark.parametrize("pname", ["", "1abc", "a-b", "a b", "a\n", 5])
def test_bad_port_names(pname: Any) -> None:
    _fails(_app(_role(port_map={pname: 80})), f"role 'trainer': port_map name {pname!r} must be a valid identifier")


@pytest.mark.parametrize("port", [-1, 65536, True, "80", None, 80.0])
def test_bad_port_numbers(port: Any) -> None:
    _fails(
        _app(_role(port_map={"http": port})),
        "role 'trainer': port_map['http'] must be a port number 0-65535",
        f"got {port!r}",
    )


def test_port_map_not_a_dict() -> None:
    _fails(_app(_role(port_map=[80])), "role 'trainer': port_map must be a dict")


def test_error_names_the_failing_role_among_several() -> None:
    _fails(_app(_role("ok"), _role("broken", num_replicas=0)), "role 'broken': num_replicas")


def test_validate_role_directly() -> None:
    validate_role(_role())
    with pytest.raises(InvalidAppError, match=re.escape("role 'trainer': num_replicas")):
        validate_role(_role(num_replicas=0))


def test_invalid_app_error_is_value_error() -> None:
    with pytest.raises(ValueError):
        validate_app(AppDef("x"))
    with pytest.raises(TsmError):
        validate_app(AppDef("x"))


def test_validate_does_not_change_the_app() -> None:
    app = _app(_role(args=["a"], env={"A": "1"}))
    before = app.to_dict()
    validate_app(app)
    assert app.to_dict() == before


# -- what a process can receive ------------------------------------------------------------------------------
def test_max_arg_bytes_is_what_linux_passes() -> None:
    """The limit is the kernel's: a string of MAX_ARG_BYTES bytes starts a program, one byte more does not."""
    import errno
    import subprocess
    import sys

    from tsm.specs.validate import MAX_ARG_BYTES

    if not sys.platform.startswith("linux"):
        pytest.skip("MAX_ARG_STRLEN is Linux's")
    subprocess.run(["true", "x" * MAX_ARG_BYTES], check=True, env={"E": "y" * (MAX_ARG_BYTES - 2)})
    with pytest.raises(OSError) as ei:
        subprocess.run(["true", "x" * (MAX_ARG_BYTES + 1)])
    assert ei.value.errno == errno.E2BIG


def test_size_limits_count_bytes_not_characters() -> None:
    import os

    from tsm.specs.validate import MAX_ARG_BYTES

    validate_app(_app(_role(args=["x" * MAX_ARG_BYTES])))
    validate_app(_app(_role(args=[os.fsdecode(b"\xff" * MAX_ARG_BYTES)])))
    _fails(_app(_role(args=["\u00e9" * (MAX_ARG_BYTES // 2 + 1)])), "role 'trainer': args[0] is 131072 bytes long")
    _fails(_app(_role(env={"E": "x" * (MAX_ARG_BYTES - 1)})), "role 'trainer': env entry 'E'=... is 131072 bytes")


def test_check_exec_size_counts_the_inherited_environment_as_the_merged_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """``inherit=True`` gives what ``{**os.environ, **env}`` gives: the same bytes, the overridden entries once,
    a caller entry with non-UTF-8 bytes counted as bytes, and a caller entry no program can take refused by name."""
    import os

    from tsm.specs.validate import MAX_ARG_BYTES, check_exec_size

    monkeypatch.setenv("TSM_T_SHARED", "caller's longer value")
    monkeypatch.setenv("TSM_T_ONLY", "x")
    monkeypatch.setitem(os.environb, b"TSM_T_BYTES", b"\xff\xfe")  # not UTF-8: one byte each, as exec passes them
    overrides = {"TSM_T_SHARED": "mine", "TSM_T_NEW": "\u00e9", "\udcff": "a name only bytes can spell"}
    argv = ["true", "--x"]
    assert check_exec_size("r", argv, overrides, inherit=True) == check_exec_size("r", argv, {**os.environ, **overrides})
    assert check_exec_size("r", argv, {}, inherit=True) == check_exec_size("r", argv, dict(os.environ))
    monkeypatch.setenv("TSM_T_HUGE", "y" * MAX_ARG_BYTES)
    with pytest.raises(InvalidAppError, match=r"role 'r': env\['TSM_T_HUGE'\] is 131082 bytes long"):
        check_exec_size("role 'r'", argv, {}, inherit=True)
    assert check_exec_size("r", argv, {"TSM_T_HUGE": "small"}, inherit=True) > 0  # overridden: never passed


def test_check_exec_size_counts_the_environment() -> None:
    from tsm.specs.validate import check_exec_size, exec_limit

    half = ["x" * 100_000] * (exec_limit() // 200_000)
    assert check_exec_size("role 'r'", ["true", *half], {}) < exec_limit()
    with pytest.raises(InvalidAppError, match=r"role 'r': the command line and environment take \d+ bytes.*ARG_MAX"):
        check_exec_size("role 'r'", ["true", *half], {f"E{i}": "y" * 100_000 for i in range(len(half) + 1)})
    with pytest.raises(InvalidAppError, match=r"role 'r': env\['E'\] holds '\\ud800'"):
        check_exec_size("role 'r'", ["true"], {"E": "\ud800"})
