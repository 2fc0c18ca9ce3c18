"""TorchX's public names at TorchX's module paths (issue 23, issue 30 item 7): each importable where TorchX has it.

Written as TorchX code is, with only ``torchx`` changed to ``tsm`` in the import lines.
"""

from __future__ import annotations

import argparse
import json
import logging

import pytest

from tsm import specs


def test_specs_api_has_torchxs_exceptions_mounts_runopts_and_helpers() -> None:
    from tsm.errors import InvalidRunOptionError, MalformedAppHandleError, UnknownAppError
    from tsm.specs.api import (
        BindMount,
        CfgVal,
        DeviceMount,
        InvalidRunConfigException,
        MalformedAppHandleException,
        MountType,
        UnknownAppException,
        VolumeMount,
        make_app_handle,
        parse_app_handle,
        runopts,
        to_dict,
    )

    assert UnknownAppException is UnknownAppError and MalformedAppHandleException is MalformedAppHandleError
    assert InvalidRunConfigException is InvalidRunOptionError
    assert BindMount is specs.BindMount and VolumeMount is specs.VolumeMount and DeviceMount is specs.DeviceMount
    assert MountType.BIND == "bind"
    assert runopts is specs.runopts and CfgVal is specs.CfgVal
    assert parse_app_handle(make_app_handle("local", "s", "a1")).app_id == "a1"
    assert to_dict("FOO=v1,v2,BAR=v3") == {"FOO": "v1,v2", "BAR": "v3"}
    with pytest.raises(ImportError):
        from tsm.specs.api import NotATorchxName  # noqa: F401


@pytest.mark.parametrize("state", list(specs.AppState))
def test_is_started_is_running_or_terminal(state: specs.AppState) -> None:
    from tsm.specs.api import is_started

    assert is_started(state) == (state == specs.AppState.RUNNING or state.is_terminal)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", {}),
        ("FOO=v1", {"FOO": "v1"}),
        ("FOO=''", {"FOO": ""}),
        ('FOO=""', {"FOO": ""}),
        ("FOO=v1;v2", {"FOO": "v1;v2"}),
        ("FOO=v1;v2;BAR=v3", {"FOO": "v1;v2", "BAR": "v3"}),
        ('FOO="a = b, c; d",X=1', {"FOO": "a = b, c; d", "X": "1"}),
    ],
)
def test_to_dict_reads_torchxs_env_literals(text: str, expected: dict[str, str]) -> None:
    from tsm.util.types import to_dict

    assert to_dict(text) == expected


@pytest.mark.parametrize("bad", ["novalue", "FOO=v1,", "=v"])
def test_to_dict_refuses_malformed_text_with_value_error(bad: str) -> None:
    from tsm.util.types import to_dict

    with pytest.raises(ValueError):
        to_dict(bad)


def test_util_types_none_throws_and_to_list() -> None:
    from tsm.util.types import none_throws, to_list

    assert none_throws(0) == 0
    with pytest.raises(AssertionError, match="gone"):
        none_throws(None, "gone")
    assert to_list(" a, b ,c") == ["a", "b", "c"] and to_list("  ") == []


def test_named_resources_aws_and_generic_modules() -> None:
    from tsm.specs import named_resources_aws as aws, named_resources_generic as generic

    r = aws.aws_p3_2xlarge()
    assert r == specs.get_named_resource("aws_p3.2xlarge")
    assert aws.NAMED_RESOURCES["aws_p3.2xlarge"]() == r
    assert aws.instance_type_from_resource(r) == "p3.2xlarge"
    assert all(name.startswith("aws_") for name in aws.NAMED_RESOURCES)
    assert generic.NAMED_RESOURCES["gpu.small"]() == specs.Resource(cpu=8, gpu=1, memMB=32 * 1024)
    assert "aws_p3.2xlarge" not in generic.NAMED_RESOURCES
    with pytest.raises(AttributeError):
        aws.aws_not_a_type  # noqa: B018


def test_resource_takes_every_argument_optionally() -> None:
    assert specs.resource() == specs.Resource(cpu=2, gpu=0, memMB=1024)
    assert specs.resource(gpu=1) == specs.Resource(cpu=2, gpu=1, memMB=1024)
    assert specs.resource(h="gpu.small").gpu == 1


def test_builders_parse_mounts_and_make_args_parser() -> None:
    from tsm.components.utils import echo
    from tsm.specs.builders import _create_args_parser, make_args_parser, parse_mounts

    assert parse_mounts(["type=bind", "src=/a", "dst=/b"]) == [specs.BindMount(src_path="/a", dst_path="/b")]
    parser = make_args_parser(echo, {"msg": "from defaults"})
    assert isinstance(parser, argparse.ArgumentParser) and _create_args_parser is make_args_parser
    assert parser.parse_args(["--msg", "hi"]).msg == "hi"
    assert "--num_replicas" in parser.format_help()


def test_file_linter_module_and_help_formatter() -> None:
    from tsm.specs import file_linter

    assert callable(file_linter.validate) and callable(file_linter.get_fn_docstring)
    p = argparse.ArgumentParser(formatter_class=file_linter.TorchXArgumentHelpFormatter)
    p.add_argument("--need", required=True, help="needed")
    p.add_argument("--size", default=3, help="how big")
    text = p.format_help()
    assert "needed (required)" in text and "how big (default: 3)" in text


def test_top_level_image_and_dist_noquote() -> None:
    import tsm
    from tsm.components.dist import _args_join, _noquote

    assert tsm.IMAGE == specs.NULL_IMAGE
    arg = _noquote("$${HOST:=localhost}:29500")
    assert isinstance(arg, str) and _args_join(["torchrun", "--rdzv", arg, "a b"]) == (
        "torchrun --rdzv $${HOST:=localhost}:29500 'a b'"
    )


def test_schedulers_ids_make_unique() -> None:
    from tsm.schedulers.ids import make_unique, random_id

    a, b = make_unique("trainer"), make_unique("trainer")
    assert a != b and a.startswith("trainer-") and a[len("trainer-")].isalpha()
    assert len(make_unique("x", string_length=6)) == len("x-") + 6
    rid = random_id()
    assert rid.isalnum() and rid == rid.lower() and rid[0].isalpha()


def test_cmd_log_helpers_and_colors(capsys: pytest.CaptureFixture[str]) -> None:
    from tsm.cli import colors
    from tsm.cli.cmd_log import _prefix_line, find_role_replicas, validate

    app = specs.AppDef("a", [specs.Role("t", num_replicas=2), specs.Role("ps")])
    assert find_role_replicas(app, None) == [("t", 0), ("t", 1), ("ps", 0)]
    assert find_role_replicas(app, "ps") == [("ps", 0)]
    assert _prefix_line("t/0 ", "a\nb\n") == "t/0 a\nt/0 b\n"
    assert _prefix_line("p ", "10%\r20%\n") == "p 10%\rp 20%\n"
    validate("local://s/app/role/0,1")
    with pytest.raises(SystemExit) as e:
        validate("not a handle")
    assert e.value.code == 1
    assert colors.ENDC == "" and colors.GREEN == ""  # pytest's stdout is not a terminal


def test_app_status_format_is_torchxs_layout() -> None:
    status = specs.AppStatus(
        specs.AppState.FAILED,
        msg="boom",
        roles=[specs.RoleStatus("t", [specs.ReplicaStatus(1, specs.AppState.SUCCEEDED, "t", "h"),
                                      specs.ReplicaStatus(0, specs.AppState.FAILED, "t", "h")])],
    )
    text = status.format()
    assert text.startswith("AppStatus:\n    State: FAILED\n    Num Restarts: 0\n    Roles: \n *t[0]:FAILED (no reply file)\n  t[1]:SUCCEEDED\n")
    assert "    Msg: boom\n    Structured Error Msg: <NONE>\n    UI URL: None\n" in text
    assert str(status) == status.summary()  # tsm's own commands print the summary
    report = json.dumps({"message": {"message": "oom", "errorCode": 137, "extraInfo": {"timestamp": "0"}}})
    status.roles[0].replicas[1].structured_error_msg = report
    assert "FAILED (exitcode: 137)" in status.format() and "error_msg: oom" in status.format()


def test_int_run_option_with_a_float_default_is_accepted_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    opts = specs.runopts()
    with caplog.at_level(logging.WARNING, logger="tsm"):
        opts.add("timeout", int, "seconds", default=60.0)
    assert "timeout" in caplog.text and "accepted" in caplog.text
    assert opts.resolve({})["timeout"] == 60.0
    assert opts.resolve({"timeout": "5"})["timeout"] == 5
