"""The specs rows of docs/torchx-compat.md marked "same": TorchX 0.7 code runs after changing its imports.

Each test is written as a TorchX user would write the code (``from tsm import specs`` where they had
``from torchx import specs``), with values TorchX documents.
"""

from __future__ import annotations

import importlib
import inspect
import json
import sys
import textwrap
import typing
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from tsm import specs
from tsm.errors import (
    AppStatusError,
    ComponentError,
    ComponentNotFoundError,
    InvalidAppError,
    InvalidRunOptionError,
    MalformedAppHandleError,
    UnknownAppError,
    UnknownSchedulerError,
)
from tsm.schedulers.api import DescribeAppResponse
from tsm.specs.runopts import type_name

nr: ModuleType = importlib.import_module("tsm.specs.named_resources")


@pytest.fixture(autouse=True)
def fresh_named_resources(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(nr, "_cache", None)
    yield
    nr._cache = None


# -- sentinels and aliases ------------------------------------------------------------------------
def test_sentinels_have_torchxs_values() -> None:
    assert specs.MISSING == "<MISSING>"
    assert specs.NONE == "<NONE>"
    assert specs.ALL == "all"
    assert (specs.NULL_RESOURCE.cpu, specs.NULL_RESOURCE.gpu, specs.NULL_RESOURCE.memMB) == (-1, -1, -1)
    assert specs.AppHandle is str
    assert specs.ReplicaState is specs.AppState
    assert specs.is_null_resource(specs.Role("r").resource)


def test_torchx_exception_names_catch_tsms_errors() -> None:
    pairs = [
        (specs.UnknownAppException, UnknownAppError),
        (specs.UnknownSchedulerException, UnknownSchedulerError),
        (specs.InvalidRunConfigException, InvalidRunOptionError),
        (specs.MalformedAppHandleException, MalformedAppHandleError),
        (specs.ComponentValidationException, ComponentError),
        (specs.ComponentNotFoundException, ComponentNotFoundError),
    ]
    for torchx_name, ours in pairs:
        assert torchx_name is ours
    with pytest.raises(specs.MalformedAppHandleException):
        specs.parse_app_handle("nope")


# -- Role, AppDef ---------------------------------------------------------------------------------
def test_role_defaults_are_torchxs() -> None:
    role = specs.Role(name="trainer", image="pytorch/pytorch")
    assert role.entrypoint == specs.MISSING
    assert role.resource == specs.NULL_RESOURCE
    assert (role.num_replicas, role.max_retries, role.retry_policy) == (1, 0, specs.RetryPolicy.APPLICATION)
    assert role.args == [] and role.env == {} and role.port_map == {} and role.metadata == {} and role.mounts == []
    assert role.min_replicas is None
    info = specs.AppDryRunInfo("req", str)
    assert role.pre_proc("local", info) is info


def test_role_keyword_construction_as_torchx_users_write_it() -> None:
    role = specs.Role(
        name="trainer", image="img", entrypoint="python", args=["-m", "train"], env={"A": "1"}, num_replicas=2,
        max_retries=3, retry_policy=specs.RetryPolicy.REPLICA, resource=specs.resource(cpu=4, gpu=1, memMB=1000),
        port_map={"tb": 6006}, metadata={"local.x": 1}, min_replicas=1,
        mounts=[specs.BindMount(src_path="/data", dst_path="/data", read_only=True)],
    )
    specs.validate_role(role)
    app = specs.AppDef(name="app", roles=[role], metadata={"team": "ml"})
    assert specs.AppDef.from_dict(app.to_dict()) == app


# -- states and status ----------------------------------------------------------------------------
def test_is_terminal_function_and_method() -> None:
    for state in specs.AppState:
        expected = state in (specs.AppState.SUCCEEDED, specs.AppState.FAILED, specs.AppState.CANCELLED)
        assert specs.is_terminal(state) is expected
        assert specs.AppStatus(state).is_terminal() is expected


def test_raise_for_status() -> None:
    specs.AppStatus(specs.AppState.SUCCEEDED).raise_for_status()
    for state in (specs.AppState.FAILED, specs.AppState.CANCELLED, specs.AppState.RUNNING):
        status = specs.AppStatus(state, msg="trainer/0 exited with 1")
        with pytest.raises(specs.AppStatusError) as ei:
            status.raise_for_status()
        assert ei.value.status is status
        assert state.name in str(ei.value) and "trainer/0 exited with 1" in str(ei.value)
    assert specs.AppStatusError is AppStatusError


def test_app_status_repr_is_the_readable_yaml_dump() -> None:
    status = specs.AppStatus(
        specs.AppState.FAILED, num_restarts=1, msg="boom", structured_error_msg='{"message": "oom"}',
        roles=[specs.RoleStatus("trainer", [specs.ReplicaStatus(id=0, state=specs.AppState.FAILED, role="trainer",
                                                               hostname="node0")])],
    )
    text = repr(status)
    lines = text.splitlines()
    assert lines[0] == "AppStatus:"
    assert "  state: FAILED (5)" in lines
    assert "  num_restarts: 1" in lines and "  msg: boom" in lines and "  ui_url: null" in lines
    assert "  structured_error_msg:" in lines and "    message: oom" in lines  # JSON shown as data
    assert "      - hostname: node0" in lines or any("hostname: node0" in ln for ln in lines)
    assert any(ln.strip() == "state: FAILED (5)" for ln in lines if ln.startswith("        "))
    keys = [ln.split(":")[0].strip() for ln in lines[1:] if ln.startswith("  ") and not ln.startswith("   ")]
    assert keys == sorted(keys)  # sorted keys, as yaml.dump writes them
    assert "structured_error_msg: <NONE>" in repr(specs.AppStatus(specs.AppState.RUNNING))


def test_replica_status_positional_order_and_structured_error_msg() -> None:
    rs = specs.ReplicaStatus(3, specs.AppState.RUNNING, "trainer", "host3")
    assert (rs.id, rs.state, rs.role, rs.hostname) == (3, specs.AppState.RUNNING, "trainer", "host3")
    assert rs.structured_error_msg == specs.NONE


def test_describe_app_response_constructible_with_defaults() -> None:
    d = DescribeAppResponse()
    assert d.app_id == "<NOT_SET>" and d.roles_statuses == [] and d.roles == [] and d.metadata == {}
    d = DescribeAppResponse(app_id="x", roles=[specs.Role("r", entrypoint="true")])
    assert d.roles[0].name == "r"


# -- dry run ----------------------------------------------------------------------------------------
def test_dryrun_info_is_generic_and_repr_renders_the_request() -> None:
    info: specs.AppDryRunInfo[list[str]] = specs.AppDryRunInfo(["echo", "hi"], lambda req: " ".join(req))
    assert repr(info) == "echo hi" == str(info)
    assert specs.AppDryRunInfo[dict] is not None  # subscriptable: a Generic
    info._app = specs.AppDef("a")
    info._scheduler = "local"
    info._cfg = {"k": 1}
    assert (info.app, info.scheduler, info.cfg) == (specs.AppDef("a"), "local", {"k": 1})


# -- macros -----------------------------------------------------------------------------------------
def test_macros_include_base_img_root() -> None:
    assert specs.macros.base_img_root == "${base_img_root}"
    values = specs.macros.Values(img_root="/img", app_id="a1", replica_id="0")
    assert values.base_img_root == "DEPRECATED"
    role = values.apply(specs.Role("r", entrypoint="${img_root}/run", args=["${base_img_root}", "${app_id}"]))
    assert role.entrypoint == "/img/run" and role.args == ["DEPRECATED", "a1"]


# -- handles ----------------------------------------------------------------------------------------
def test_handles_with_torchxs_keyword_names() -> None:
    handle = specs.make_app_handle(scheduler_backend="local", session_name="s", app_id="app-1")
    assert handle == "local://s/app-1"
    parsed = specs.parse_app_handle(app_handle=handle)
    scheduler_backend, session_name, app_id = parsed
    assert (scheduler_backend, session_name, app_id) == ("local", "s", "app-1")
    assert (parsed.scheduler_backend, parsed.session_name, parsed.app_id) == ("local", "s", "app-1")
    with pytest.raises(MalformedAppHandleError) as ei:
        specs.parse_app_handle("local:/s")
    assert ei.value.handle == "local:/s"


# -- resources ----------------------------------------------------------------------------------------
TORCHX_GENERIC = {
    "gpu.small": (8, 1, 32 * 1024), "gpu.medium": (16, 2, 64 * 1024), "gpu.large": (32, 4, 128 * 1024),
    "gpu.xlarge": (64, 8, 256 * 1024), "cpu.nano": (1, 0, 512), "cpu.micro": (1, 0, 1024),
    "cpu.small": (1, 0, 2048), "cpu.medium": (2, 0, 4096), "cpu.large": (2, 0, 8192), "cpu.xlarge": (8, 0, 32768),
}


@pytest.mark.parametrize(("name", "size"), sorted(TORCHX_GENERIC.items()))
def test_named_resources_are_dict_like_with_torchxs_sizes(name: str, size: tuple[int, int, int]) -> None:
    assert name in specs.named_resources
    res = specs.named_resources[name]
    assert (res.cpu, res.gpu, res.memMB) == size
    assert specs.get_named_resources(name) == res


def test_aws_instance_types() -> None:
    p3 = specs.named_resources["aws_p3.2xlarge"]
    assert (p3.cpu, p3.gpu, p3.memMB) == (8, 1, 61 * int(1024 * 0.96))
    assert p3.capabilities == {"node.kubernetes.io/instance-type": "p3.2xlarge"}
    p4d = specs.named_resources["aws_p4d.24xlarge"]
    assert (p4d.cpu, p4d.gpu, p4d.devices) == (96, 8, {"vpc.amazonaws.com/efa": 4})
    for name in ("aws_t3.medium", "aws_m5.2xlarge", "aws_g5.48xlarge", "aws_trn1.32xlarge", "aws_g4dn.metal"):
        assert name in specs.named_resources
    assert specs.named_resources["NULL"] == specs.named_resources["MISSING"] == specs.NULL_RESOURCE


def test_unknown_named_resource_is_a_key_error() -> None:
    with pytest.raises(KeyError) as ei:
        specs.named_resources["gpu.smal"]
    assert "did you mean 'gpu.small'" in str(ei.value)
    assert "nope" not in specs.named_resources


def test_resource_helper() -> None:
    assert specs.resource() == specs.Resource(cpu=2, gpu=0, memMB=1024)  # TorchX's defaults
    assert specs.resource(cpu=4) == specs.Resource(cpu=4, gpu=0, memMB=1024)
    assert specs.resource(cpu=1, h="gpu.small") == specs.named_resources["gpu.small"]  # h wins


def test_torchx_named_resources_entry_point_group(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module = f"tx_res_{uuid.uuid4().hex[:8]}"
    site = tmp_path / "site"
    site.mkdir()
    (site / f"{module}.py").write_text(textwrap.dedent("""
        from tsm.specs import Resource
        def gpu_x_2():
            return Resource(cpu=16, gpu=2, memMB=1000)
        def shared():
            return Resource(cpu=1, gpu=0, memMB=1)
        def shared_tsm():
            return Resource(cpu=2, gpu=0, memMB=2)
    """))
    for dist, group, entries in (
        ("txplug", "torchx.named_resources", [("gpu_x_2", "gpu_x_2"), ("shared", "shared")]),
        ("tsmplug", "tsm.named_resources", [("shared", "shared_tsm")]),
    ):
        info = site / f"{dist}_{module}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}_{module}\nVersion: 1.0\n")
        lines = [f"[{group}]"] + [f"{n} = {module}:{a}" for n, a in entries]
        (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delitem(sys.modules, module, raising=False)
    assert specs.named_resources["gpu_x_2"] == specs.Resource(cpu=16, gpu=2, memMB=1000)
    assert specs.named_resources["shared"] == specs.Resource(cpu=2, gpu=0, memMB=2)  # tsm's group wins


# -- mounts ---------------------------------------------------------------------------------------------
def test_parse_mounts_torchx_form() -> None:
    mounts = specs.parse_mounts([
        "type=bind", "src=/host", "dst=/container", "readonly",
        "type=volume", "src=cache", "dst=/cache",
        "type=device", "src=/dev/fuse",
    ])
    assert mounts == [
        specs.BindMount(src_path="/host", dst_path="/container", read_only=True),
        specs.VolumeMount(src="cache", dst_path="/cache", read_only=False),
        specs.DeviceMount(src_path="/dev/fuse", dst_path="/dev/fuse", permissions="rwm"),
    ]
    assert specs.parse_mounts(["type=device,src=/dev/x,dst=/dev/y,perm=rw"]) == [specs.DeviceMount("/dev/x", "/dev/y", "rw")]


@pytest.mark.parametrize(
    ("opts", "message"),
    [
        (["src=/a", "dst=/b"], "before any type="),
        (["type=bind", "src=/a"], "dst= is required"),
        (["type=nfs", "src=a", "dst=/b"], "mount type 'nfs' is unknown"),
        (["type=device", "src=/dev/x", "perm=rwx"], "letters of 'rwm'"),
        (["type=bind", "src=/a", "dst=relative"], "absolute path"),
        (["type=bind", "bogus=1"], "unknown"),
    ],
)
def test_parse_mounts_errors(opts: list[str], message: str) -> None:
    with pytest.raises(InvalidAppError, match=message):
        specs.parse_mounts(opts)


def test_role_mounts_are_validated() -> None:
    role = specs.Role("r", entrypoint="true", mounts=[{"src": "/a", "dst": "/b"}])  # type: ignore[list-item]
    with pytest.raises(InvalidAppError, match=r"mounts\[0\].*is not a mount"):
        specs.validate_role(role)
    role = specs.Role("r", entrypoint="true", mounts=[specs.DeviceMount("/dev/x", "/dev/x", "q")])
    with pytest.raises(InvalidAppError, match="permissions"):
        specs.validate_role(role)


# -- run options ------------------------------------------------------------------------------------------
def test_runopts_take_typing_container_types() -> None:
    opts = specs.runopts()
    opts.add("tags", type_=typing.List[str], help="tags", default=["a"])  # noqa: UP006 - TorchX's spelling
    opts.add("labels", type_=typing.Dict[str, str], help="labels", default={})  # noqa: UP006
    opts.add("BAR", type_=str, help="a required str option", required=True)
    assert type_name(typing.List[str]) == "list[str]"  # noqa: UP006 - tsm's help tables
    assert specs.get_type_name(typing.List[str]) == "typing.List[str]"  # noqa: UP006 - TorchX's spelling
    assert opts.resolve({"BAR": "x"}) == {"tags": ["a"], "labels": {}, "BAR": "x"}
    opt = opts.get("BAR")
    assert opt is not None and opt.is_required and opt.opt_type is str
    assert specs.runopts.is_type(["a"], typing.List[str]) and not specs.runopts.is_type([1], typing.List[str])  # noqa: UP006
    assert "cfg_key" in inspect.signature(specs.runopts.add).parameters


def test_cfg_from_str_as_torchx_documents_it(caplog: pytest.LogCaptureFixture) -> None:
    opts = specs.runopts()
    opts.add("FOO", type_=typing.List[str], default=["a"], help="an optional list option")  # noqa: UP006
    opts.add("BAR", type_=str, required=True, help="a required str option")
    opts.add("N", type_=int, help="a number")
    opts.add("D", type_=typing.Dict[str, str], help="a map")  # noqa: UP006
    assert opts.cfg_from_str("") == {}
    assert opts.cfg_from_str("BAR=barbaz") == {"BAR": "barbaz"}
    assert opts.cfg_from_str("FOO=foobar") == {"FOO": ["foobar"]}
    assert opts.cfg_from_str("FOO=foo,bar;BAR=baz") == {"FOO": ["foo", "bar"], "BAR": "baz"}
    assert opts.cfg_from_str("FOO=foo;bar,BAR=baz;N=3") == {"FOO": ["foo", "bar"], "BAR": "baz", "N": 3}
    assert opts.cfg_from_str("D=a:1,b:2") == {"D": {"a": "1", "b": "2"}}
    with caplog.at_level("WARNING", logger="tsm"):
        assert opts.cfg_from_str("BAZ=1,BAR=x") == {"BAR": "x"}  # an unknown key is left out, with a warning
    assert "unknown run option 'BAZ'" in caplog.text
    with pytest.raises(InvalidRunOptionError, match="expects int"):
        opts.cfg_from_str("N=three")


def test_resolve_keeps_going_past_keys_another_scheduler_declares(caplog: pytest.LogCaptureFixture) -> None:
    opts = specs.runopts()
    opts.add("log_dir", str, "where logs go", default="/tmp")
    with caplog.at_level("WARNING", logger="tsm"):
        # another scheduler's key is passed on unchecked (TorchX's rule: a cfg is the union of their options)
        assert opts.resolve({"log_dir": "/x", "partition": "gpu"}) == {"log_dir": "/x", "partition": "gpu"}
    assert "'partition'" in caplog.text


def test_structured_error_msg_json_survives_to_dict() -> None:
    msg = json.dumps({"message": "x"})
    assert specs.AppStatus(specs.AppState.FAILED, structured_error_msg=msg).to_dict()["structured_error_msg"] == msg


def test_app_state_repr_and_status_format_filter() -> None:
    assert repr(specs.AppState.RUNNING) == "RUNNING (3)"
    status = specs.AppStatus(specs.AppState.RUNNING, roles=[
        specs.RoleStatus("a", [specs.ReplicaStatus(0, specs.AppState.RUNNING, "a")]),
        specs.RoleStatus("b", [specs.ReplicaStatus(0, specs.AppState.PENDING, "b")]),
    ])
    text = status.format(filter_roles=["b"])
    assert "*b[0]:PENDING" in text and "a[0]" not in text
    assert "*a[0]:RUNNING" in status.format()
    assert status.format().startswith("AppStatus:\n    State: RUNNING\n")
    assert specs.GiB == 1024


# -- the compatibility table itself ---------------------------------------------------------------------
DOC = Path(__file__).resolve().parents[2] / "docs" / "torchx-compat.md"
SHORT = {"specs": "tests/specs/test_specs_torchx_compat.py", "runner": "tests/runner/test_runner_torchx_compat.py",
         "config": "tests/runner/test_config_torchx.py"}


def _table_rows() -> dict[str, list[tuple[str, str, str]]]:
    """``{section title: [(name, status, notes)]}`` of every table but the counts."""
    import re

    out: dict[str, list[tuple[str, str, str]]] = {}
    for section in re.split(r"^## ", DOC.read_text(), flags=re.M)[1:]:
        title = section.splitlines()[0]
        if title.startswith("Counts"):
            continue
        rows = []
        for line in section.splitlines():
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) >= 3 and cells[1] in ("same", "extended", "different"):
                rows.append((cells[0], cells[1], " ".join(cells[2:])))
        out[title] = rows
    return out


def test_compat_table_counts_match_its_rows() -> None:
    import re

    rows = _table_rows()
    text = DOC.read_text()
    total = {"same": 0, "extended": 0, "different": 0}
    for title, table in rows.items():
        module = re.match(r"`torchx\.([a-z.]+)`", title)
        assert module, title
        n = {s: sum(1 for _, st, _ in table if st == s) for s in total}
        for s in total:
            total[s] += n[s]
        line = f"| {module.group(1)} | {n['same']} | {n['extended']} | {n['different']} | {len(table)} |"
        assert line in text, f"counts row for {module.group(1)} should read: {line}"
    all_line = (f"| **all** | **{total['same']}** | **{total['extended']}** | **{total['different']}** | "
                f"**{sum(total.values())}** |")
    assert all_line in text, all_line


def test_every_same_row_names_a_test_that_exists() -> None:
    import re

    root = DOC.parents[1]
    for title, table in _table_rows().items():
        for name, status, notes in table:
            if status != "same":
                continue
            refs = re.findall(r"`(specs|runner|config)::(\w+)`", notes)
            files = re.findall(r"`(tests/[\w/.]+?)(?:::(\w+)\*?)?`", notes)
            assert refs or files or "see specs" in notes, f"{title}: same row {name} names no test"
            for short, test in refs:
                source = (root / SHORT[short]).read_text()
                assert f"def {test}(" in source, f"{name}: {SHORT[short]} has no {test}"
            for path, test in files:
                target = root / path
                assert target.exists(), f"{name}: {path} does not exist"
                if test and target.is_file():
                    assert f"def {test}" in target.read_text(), f"{name}: {path} has no {test}"
