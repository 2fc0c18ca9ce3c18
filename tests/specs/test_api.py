"""Tests for tsm.specs.api: AppDef/Role/Resource, states and status, dry-run info, macros."""

from __future__ import annotations

import json

import pytest

from tsm.errors import InvalidAppError
from tsm.specs.api import (
    MISSING,
    NULL_IMAGE,
    NULL_RESOURCE,
    AppDef,
    AppDryRunInfo,
    AppState,
    AppStatus,
    ReplicaStatus,
    Resource,
    RetryPolicy,
    Role,
    RoleStatus,
    check_positive,
    is_terminal,
    iter_replicas,
    json_default,
    macros,
)
from tsm.specs.mounts import BindMount, DeviceMount, VolumeMount


# -- Resource ---------------------------------------------------------------------------------------
def test_resource_defaults() -> None:
    r = Resource()
    assert (r.cpu, r.gpu, r.memMB) == (1, 0, 1024)
    assert r.capabilities == {} and r.devices == {}


def test_resource_default_dicts_are_not_shared() -> None:
    a, b = Resource(), Resource()
    a.capabilities["x"] = 1
    a.devices["efa"] = 1
    assert b.capabilities == {} and b.devices == {}


def test_resource_copy_is_deep_and_adds_capabilities() -> None:
    original = Resource(cpu=2, gpu=1, memMB=4096, capabilities={"zone": "a", "nested": {"k": [1]}}, devices={"efa": 1})
    copied = Resource.copy(original, zone="b", extra=True)
    assert copied is not original
    assert copied.capabilities == {"zone": "b", "nested": {"k": [1]}, "extra": True}
    assert (copied.cpu, copied.gpu, copied.memMB, copied.devices) == (2, 1, 4096, {"efa": 1})
    # the original is untouched, including its nested containers
    assert original.capabilities == {"zone": "a", "nested": {"k": [1]}}
    copied.capabilities["nested"]["k"].append(2)
    copied.devices["efa"] = 4
    assert original.capabilities["nested"] == {"k": [1]}
    assert original.devices == {"efa": 1}


def test_resource_copy_without_capabilities_is_equal_copy() -> None:
    original = Resource(cpu=3, capabilities={"a": 1})
    copied = Resource.copy(original)
    assert copied == original and copied is not original
    assert copied.capabilities is not original.capabilities


# -- RetryPolicy ------------------------------------------------------------------------------------
def test_retry_policy_members() -> None:
    assert [p.value for p in RetryPolicy] == ["REPLICA", "ROLE", "APPLICATION"]
    assert RetryPolicy("ROLE") is RetryPolicy.ROLE
    assert RetryPolicy.REPLICA == "REPLICA"  # a str enum, so it serialises as its name
    with pytest.raises(ValueError):
        RetryPolicy("NODE")


# -- Role -------------------------------------------------------------------------------------------
def test_role_defaults() -> None:
    r = Role("trainer")
    assert r.image == NULL_IMAGE == ""
    assert r.entrypoint == MISSING == "<MISSING>" and r.args == [] and r.env == {}  # TorchX's defaults
    assert r.num_replicas == 1 and r.min_replicas is None and r.max_retries == 0
    assert r.retry_policy is RetryPolicy.APPLICATION
    assert r.resource == NULL_RESOURCE and r.resource is not NULL_RESOURCE  # "not given", never 1 CPU
    assert r.port_map == {} and r.metadata == {} and r.mounts == []


def test_role_builders_chain_and_convert_to_str() -> None:
    role = Role("trainer")
    out = role.runs("python", "-m", 1, 2.5, FOO="bar", N=3).replicas(4)  # type: ignore[arg-type]
    assert out is role
    assert role.entrypoint == "python"
    assert role.args == ["-m", "1", "2.5"]
    assert role.env == {"FOO": "bar", "N": "3"}
    assert role.num_replicas == 4


def test_role_runs_replaces_args_and_adds_env() -> None:
    role = Role("r", env={"KEEP": "1"}).runs("a", "x", A="1")
    role.runs("b", "y")
    assert role.entrypoint == "b" and role.args == ["y"]
    assert role.env == {"KEEP": "1", "A": "1"}


def test_role_on_takes_image_resources_and_ports_from_container() -> None:
    from tsm.seed import Container

    res = Resource(cpu=4, gpu=2, memMB=100, capabilities={"c": {"n": 1}})
    container = Container(image="/img").require(res).ports(http=8080)
    role = Role("r", port_map={"ssh": 22}).on(container)
    assert role.image == "/img"
    assert role.resource == res
    assert role.resource is not container.resources  # a copy: changing the role leaves the container alone
    role.resource.capabilities["c"]["n"] = 2
    assert container.resources.capabilities["c"]["n"] == 1
    assert role.port_map == {"ssh": 22, "http": 8080}


def test_role_default_containers_are_not_shared() -> None:
    a, b = Role("a"), Role("b")
    a.args.append("x")
    a.env["X"] = "1"
    a.resource.cpu = 99
    assert b.args == [] and b.env == {} and b.resource.cpu == -1 and NULL_RESOURCE.cpu == -1


# -- AppDef -----------------------------------------------------------------------------------------
def _full_app() -> AppDef:
    trainer = Role(
        "trainer",
        image="/img",
        entrypoint="python",
        args=["train.py", "--lr", "0.1"],
        env={"A": "1"},
        num_replicas=4,
        min_replicas=2,
        max_retries=3,
        retry_policy=RetryPolicy.ROLE,
        resource=Resource(cpu=8, gpu=2, memMB=2048, capabilities={"zone": "x"}, devices={"efa": 1}),
        port_map={"http": 8080},
        metadata={"k": {"nested": ["v"]}},
        mounts=[BindMount("/a", "/b"), VolumeMount("vol", "/v", read_only=True), DeviceMount("/dev/fuse", "/dev/fuse")],
    )
    ps = Role("ps", entrypoint="ps.sh", retry_policy=RetryPolicy.REPLICA)
    return AppDef("myapp", roles=[trainer, ps], metadata={"team": "ml"})


def test_appdef_defaults_and_of() -> None:
    app = AppDef("a")
    assert app.roles == [] and app.metadata == {}
    r1, r2 = Role("x"), Role("y")
    assert app.of(r1).of(r2) is app
    assert app.roles == [r1, r2]


def test_appdef_to_dict_is_json_ready_with_enum_names() -> None:
    app = _full_app()
    d = app.to_dict()
    assert json.loads(json.dumps(d)) == d
    assert d["name"] == "myapp"
    assert d["metadata"] == {"team": "ml"}
    assert d["roles"][0]["retry_policy"] == "ROLE"
    assert d["roles"][1]["retry_policy"] == "REPLICA"
    assert type(d["roles"][0]["retry_policy"]) is str
    assert d["roles"][0]["resource"] == {
        "cpu": 8,
        "gpu": 2,
        "memMB": 2048,
        "capabilities": {"zone": "x"},
        "devices": {"efa": 1},
        "tags": {},
    }


def test_appdef_to_dict_from_dict_round_trip() -> None:
    app = _full_app()
    back = AppDef.from_dict(app.to_dict())
    assert back == app
    assert isinstance(back.roles[0].resource, Resource)
    assert back.roles[0].retry_policy is RetryPolicy.ROLE
    # through real JSON text too, as the state store keeps it
    assert AppDef.from_dict(json.loads(json.dumps(app.to_dict()))) == app


def test_json_default_writes_what_asdict_writes() -> None:
    # the submission path encodes specs data with json_default instead of a deep copy by asdict: same text
    import dataclasses

    app = _full_app()
    app.roles[0].port_map = {"tb": 6006}
    assert json.dumps(app, default=json_default) == json.dumps(dataclasses.asdict(app), default=lambda o: o.value)
    with pytest.raises(TypeError, match="not JSON serialisable"):
        json.dumps({"x": object()}, default=json_default)


def test_appdef_to_dict_does_not_alias_the_app() -> None:
    app = _full_app()
    d = app.to_dict()
    d["roles"][0]["args"].append("changed")
    d["metadata"]["team"] = "other"
    assert app.roles[0].args == ["train.py", "--lr", "0.1"]
    assert app.metadata == {"team": "ml"}


def test_appdef_from_dict_fills_defaults() -> None:
    app = AppDef.from_dict({"name": "a", "roles": [{"name": "r", "entrypoint": "echo", "resource": {}}]})
    assert app == AppDef("a", roles=[Role("r", entrypoint="echo", resource=Resource())])
    assert AppDef.from_dict({"name": "b"}) == AppDef("b")


def test_appdef_from_dict_does_not_mutate_input() -> None:
    data = _full_app().to_dict()
    snapshot = json.loads(json.dumps(data))
    AppDef.from_dict(data)
    assert data == snapshot


def test_iter_replicas_in_role_order() -> None:
    a, b = Role("a", num_replicas=2), Role("b", num_replicas=3)
    pairs = [(r.name, i) for r, i in iter_replicas(AppDef("x", roles=[a, b]))]
    assert pairs == [("a", 0), ("a", 1), ("b", 0), ("b", 1), ("b", 2)]
    assert list(iter_replicas(AppDef("empty"))) == []


def test_check_positive() -> None:
    check_positive(1, "nnodes")
    for bad in (0, -3):
        with pytest.raises(InvalidAppError, match=rf"nnodes must be > 0, got {bad}"):
            check_positive(bad, "nnodes")


# -- AppState ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("state", list(AppState))
def test_is_terminal(state: AppState) -> None:
    expected = state in (AppState.SUCCEEDED, AppState.FAILED, AppState.CANCELLED)
    assert state.is_terminal is expected
    assert is_terminal(state) is expected
    assert AppStatus(state).is_terminal() is expected  # a method, as in TorchX


def test_app_state_prints_as_name() -> None:
    s = AppState.RUNNING
    assert str(s) == "RUNNING"
    assert f"{s}" == "RUNNING"
    assert f"{s:<9}|" == "RUNNING  |"  # a format spec still gives the name, not the number
    assert f"{s:>8}" == " RUNNING"
    assert AppState(3) is AppState.RUNNING  # the numbers stay stable (stored in the state store)
    assert [int(s) for s in AppState] == list(range(8))


# -- AppStatus --------------------------------------------------------------------------------------
def _status() -> AppStatus:
    return AppStatus(
        AppState.FAILED,
        num_restarts=2,
        msg="trainer/1 exited with 3",
        structured_error_msg='{"message": "boom"}',
        ui_url="http://ui/app",
        roles=[
            RoleStatus(
                "trainer",
                [
                    ReplicaStatus(0, AppState.SUCCEEDED, "trainer", hostname="node0", exit_code=0, pid=123),
                    ReplicaStatus(1, AppState.FAILED, "trainer", hostname="node1", exit_code=3, error_msg="boom", restarts=2),
                ],
            ),
            RoleStatus("ps", [ReplicaStatus(0, AppState.CANCELLED, "ps")]),
        ],
    )


def test_app_status_defaults() -> None:
    s = AppStatus(AppState.PENDING)
    assert (s.num_restarts, s.msg, s.structured_error_msg, s.ui_url, s.roles) == (0, "", "", None, [])


def test_app_status_format_content() -> None:
    text = _status().summary()
    lines = text.splitlines()
    assert lines[0] == "State: FAILED"
    assert "Num Restarts: 2" in lines
    assert "Msg: trainer/1 exited with 3" in lines
    assert "UI: http://ui/app" in lines
    assert "Roles:" in lines
    assert "  trainer/0: SUCCEEDED host=node0 exit=0" in lines
    assert "  trainer/1: FAILED host=node1 exit=3 restarts=2  (boom)" in lines
    assert "  ps/0: CANCELLED" in lines
    # replicas are listed in order, after the app-level lines
    assert lines.index("Roles:") < lines.index("  trainer/0: SUCCEEDED host=node0 exit=0") < lines.index("  ps/0: CANCELLED")
    assert str(_status()) == text


def test_app_status_format_minimal() -> None:
    assert AppStatus(AppState.RUNNING).summary() == "State: RUNNING\nNum Restarts: 0"


def test_app_status_to_dict_is_json_with_state_names() -> None:
    d = _status().to_dict()
    assert json.loads(json.dumps(d)) == d
    assert d["state"] == "FAILED"
    assert d["num_restarts"] == 2
    assert d["msg"] == "trainer/1 exited with 3"
    assert d["structured_error_msg"] == '{"message": "boom"}'
    assert d["ui_url"] == "http://ui/app"
    trainer = d["roles"][0]
    assert trainer["role"] == "trainer"
    assert [r["state"] for r in trainer["replicas"]] == ["SUCCEEDED", "FAILED"]
    assert trainer["replicas"][1] == {
        "id": 1,
        "role": "trainer",
        "state": "FAILED",
        "hostname": "node1",
        "structured_error_msg": "<NONE>",
        "exit_code": 3,
        "error_msg": "boom",
        "restarts": 2,
        "pid": None,
        "preempted": False,
    }
    assert d["roles"][1]["replicas"][0]["state"] == "CANCELLED"


# -- AppDryRunInfo ----------------------------------------------------------------------------------
def test_dryrun_info_prints_with_fmt_and_carries_context() -> None:
    app = AppDef("a", roles=[Role("r", entrypoint="echo")])
    info = AppDryRunInfo(["echo", "hi"], fmt=lambda req: "CMD: " + " ".join(req), app=app, cfg={"x": 1}, scheduler="local")
    assert str(info) == "CMD: echo hi"
    assert f"{info}" == "CMD: echo hi"
    assert info.request == ["echo", "hi"]
    assert info.app is app and info.cfg == {"x": 1} and info.scheduler == "local"


def test_dryrun_info_defaults_to_repr() -> None:
    info = AppDryRunInfo({"k": "v"})
    assert str(info) == repr({"k": "v"})
    assert info.app is None and info.cfg == {} and info.scheduler == ""


# -- macros -----------------------------------------------------------------------------------------
VALUES = macros.Values(img_root="/img", app_id="app-1", replica_id="3")


def test_macro_names() -> None:
    assert macros.img_root == "${img_root}"
    assert macros.app_id == "${app_id}"
    assert macros.replica_id == "${replica_id}"
    assert macros.rank0_env == "${rank0_env}"
    assert VALUES.rank0_env == "TSM_RANK0_HOST"


@pytest.mark.parametrize(
    ("arg", "expected"),
    [
        ("${img_root}/train.py", "/img/train.py"),
        ("--id=${app_id}-${replica_id}", "--id=app-1-3"),
        ("${rank0_env}", "TSM_RANK0_HOST"),
        ("$${rank0_env}", "$TSM_RANK0_HOST"),
        ("${app_id}${app_id}", "app-1app-1"),
        ("plain", "plain"),
        ("", ""),
        ("$HOME", "$HOME"),
        ("${HOME}", "${HOME}"),
        ("${other} ${app_id}", "${other} app-1"),
        ("$app_id", "$app_id"),
        ("${ app_id }", "${ app_id }"),
        ("${APP_ID}", "${APP_ID}"),
        ("${app_id", "${app_id"),
        ("$$", "$$"),
        ("${}", "${}"),
    ],
)
def test_substitute(arg: str, expected: str) -> None:
    assert VALUES.substitute(arg) == expected


def test_substitute_is_single_pass() -> None:
    v = macros.Values(img_root="${app_id}", app_id="X", replica_id="0")
    assert v.substitute("${img_root}") == "${app_id}"


def test_substitute_custom_rank0_env() -> None:
    v = macros.Values(img_root="/", app_id="a", replica_id="0", rank0_env="MASTER_ADDR")
    assert v.substitute("$${rank0_env}:29500") == "$MASTER_ADDR:29500"


def test_apply_returns_substituted_copy() -> None:
    role = Role(
        "r",
        entrypoint="${img_root}/bin/run",
        args=["--app", "${app_id}", "--rank", "${replica_id}", "$${rank0_env}", "$OTHER"],
        env={"ID": "${app_id}", "HOST_VAR": "${rank0_env}", "KEEP": "${other}"},
        metadata={"a": "${app_id}", "nested": {"l": ["${replica_id}", 5, {"deep": "${img_root}"}]}, "n": 1},
        resource=Resource(capabilities={"c": "${app_id}"}),
    )
    out = VALUES.apply(role)
    assert out is not role
    assert out.entrypoint == "/img/bin/run"
    assert out.args == ["--app", "app-1", "--rank", "3", "$TSM_RANK0_HOST", "$OTHER"]
    assert out.env == {"ID": "app-1", "HOST_VAR": "TSM_RANK0_HOST", "KEEP": "${other}"}
    assert out.metadata == {"a": "app-1", "nested": {"l": ["3", 5, {"deep": "/img"}]}, "n": 1}
    # the original role is untouched
    assert role.entrypoint == "${img_root}/bin/run"
    assert role.args[1] == "${app_id}"
    assert role.env["ID"] == "${app_id}"
    assert role.metadata["nested"]["l"][0] == "${replica_id}"
    # the copy is deep: changing it leaves the original alone
    out.resource.capabilities["c"] = "changed"
    assert role.resource.capabilities["c"] == "${app_id}"
    # other fields carry over
    assert out.name == "r" and out.resource.capabilities == {"c": "changed"}


def test_command_substitutes_what_apply_does_in_the_command_and_env_and_copies_nothing_else() -> None:
    role = Role(
        "r",
        entrypoint="${img_root}/bin/run",
        args=["--app", "${app_id}", "--rank", "${replica_id}", "$${rank0_env}", "$OTHER"],
        env={"ID": "${app_id}", "KEEP": "${other}"},
    )
    applied = VALUES.apply(role)
    entrypoint, args, env = VALUES.command(role)
    assert (entrypoint, args, env) == (applied.entrypoint, applied.args, applied.env)
    assert args is not role.args and env is not role.env  # new containers: the role is left as it was
    assert role.args[1] == "${app_id}" and role.env["ID"] == "${app_id}"
