"""The docker scheduler's pure parts: AppDef -> containers (request.py) and container records -> states
(status.py). No Docker engine is needed; the real-engine tests are in tests/integration/test_docker*.py."""

from __future__ import annotations

import json
import shlex

import pytest

from tsm.errors import InvalidAppError, InvalidRunOptionError
from tsm.schedulers.docker.request import (
    LABEL_APP,
    LABEL_ROLES,
    DockerOptions,
    DockerRequest,
    build_request,
    dns_name,
    docker_run_args,
    format_request,
    validate,
)
from tsm.schedulers.docker.status import (
    AppView,
    Observed,
    app_status,
    complete,
    from_summary,
    group,
    replica_state,
)
from tsm.specs.api import NULL_RESOURCE, AppDef, AppState, Resource, RetryPolicy, Role, macros
from tsm.specs.mounts import BindMount, DeviceMount, VolumeMount


def role(name: str = "trainer", **kw: object) -> Role:
    kw.setdefault("resource", Resource(cpu=2, memMB=1000))
    return Role(name, image="img:1", entrypoint="python", args=["-c", "pass"], **kw)  # type: ignore[arg-type]


def req(app: AppDef, **opts: object) -> DockerRequest:
    return build_request(app, DockerOptions(**opts), "sess", "/store", 1000.0)  # type: ignore[arg-type]


def test_one_container_per_replica_named_by_role_and_index() -> None:
    r = req(AppDef("my app", [role("Trainer_A", num_replicas=2), role("ps")]))
    assert r.app_id.startswith("my-app-") and r.network == f"tsm-{r.app_id}"
    assert [(c.name, c.hostname) for c in r.containers] == [
        (f"{r.app_id}-trainer-a-0", "trainer-a-0"), (f"{r.app_id}-trainer-a-1", "trainer-a-1"),
        (f"{r.app_id}-ps-0", "ps-0"),
    ]
    assert {c.env["TSM_RANK0_HOST"] for c in r.containers} == {"trainer-a-0"}
    assert [c.env["TSM_REPLICA_ID"] for c in r.containers] == ["0", "1", "0"]
    labels = r.containers[1].labels
    assert labels[LABEL_APP] == r.app_id and labels["tsm.replica-id"] == "1"
    assert json.loads(labels[LABEL_ROLES]) == [["Trainer_A", 2, 0, "APPLICATION"], ["ps", 1, 0, "APPLICATION"]]


def test_macros_are_substituted_per_replica() -> None:
    r = req(AppDef("m", [Role("w", image="i", entrypoint="sh", num_replicas=2, resource=Resource(),
                               args=["-c", f"echo {macros.replica_id} {macros.app_id} ${macros.rank0_env}"])]))
    assert r.containers[1].command == ["sh", "-c", f"echo 1 {r.app_id} $TSM_RANK0_HOST"]


def test_resources_become_limits() -> None:
    c = req(AppDef("r", [role(resource=Resource(cpu=3, memMB=512))]), shm_fraction=0.5).containers[0]
    assert (c.nano_cpus, c.mem_limit, c.shm_size) == (3 * 10**9, 512 << 20, 256 << 20)
    c = req(AppDef("r", [role(resource=NULL_RESOURCE)])).containers[0]
    assert (c.nano_cpus, c.mem_limit, c.shm_size) == (None, None, None)  # no size given: no limits


def test_typed_mounts() -> None:
    mounts = [BindMount("/data", "/d", read_only=True), VolumeMount("vol", "/v"), DeviceMount("/dev/fuse", "/dev/fuse")]
    c = req(AppDef("m", [role(mounts=mounts)])).containers[0]
    assert c.mounts == [
        {"type": "bind", "source": "/data", "target": "/d", "read_only": True},
        {"type": "volume", "source": "vol", "target": "/v", "read_only": False},
    ]
    assert c.devices == ["/dev/fuse:/dev/fuse:rwm"]
    args = docker_run_args(c, "net")
    assert "type=bind,source=/data,target=/d,readonly" in args and "/dev/fuse:/dev/fuse:rwm" in args


def test_replica_retries_are_a_restart_policy_others_are_not() -> None:
    r = req(AppDef("r", [role("a", max_retries=3, retry_policy=RetryPolicy.REPLICA),
                         role("b", max_retries=3, retry_policy=RetryPolicy.ROLE)]))
    assert [c.restart_max for c in r.containers] == [3, 0]
    assert "on-failure:3" in format_request(r)


def test_dry_run_prints_the_docker_commands_and_round_trips() -> None:
    r = req(AppDef("d", [role(env={"Q": "it's $(x)"})]), pull="never")
    text = format_request(r)
    run_lines = [line for line in text.splitlines() if line.startswith("docker run")]
    assert len(run_lines) == 1 and shlex.split(run_lines[0]) == docker_run_args(r.containers[0], r.network)
    assert "use local only" in text
    assert DockerRequest.from_json(r.to_json()) == r


def test_validation_refuses_what_docker_cannot_do() -> None:
    with pytest.raises(InvalidAppError, match="GPU"):
        validate(AppDef("g", [role(resource=Resource(gpu=1))]), has_gpus=False)
    validate(AppDef("g", [role(resource=Resource(gpu=1))]), has_gpus=True)
    with pytest.raises(InvalidAppError, match="no image"):
        validate(AppDef("g", [Role("r", entrypoint="x")]), has_gpus=False)
    with pytest.raises(InvalidAppError, match="argument 0 holds bytes that are not UTF-8"):
        validate(AppDef("g", [Role("r", image="i", entrypoint="x", args=["\udcff"])]), has_gpus=False)
    with pytest.raises(InvalidAppError, match="same host names"):
        validate(AppDef("g", [role("a_b"), role("a-b")]), has_gpus=False)


@pytest.mark.parametrize("bad", [{"pull": "sometimes"}, {"grace_period": -1.0}, {"shm_fraction": 2.0}])
def test_options_are_checked(bad: dict[str, object]) -> None:
    with pytest.raises(InvalidRunOptionError):
        DockerOptions(**bad).check()  # type: ignore[arg-type]


def test_dns_names() -> None:
    assert dns_name("Trainer_A", 3) == "trainer-a-3"
    assert dns_name("___", 0) == "role-0"


# -- status ------------------------------------------------------------------------------------------------


def obs(role: str, k: int, state: str, code: int | None = None, **kw: object) -> Observed:
    labels = {LABEL_APP: "app-1", "tsm.role": role, "tsm.replica-id": str(k), "tsm.attempt": "0",
              LABEL_ROLES: json.dumps([["a", 2, 0, "APPLICATION"], ["b", 1, 0, "APPLICATION"]]), "tsm.created": "5"}
    o = Observed(id=f"{role}{k}", name=f"app-1-{role}-{k}", state=state, labels=labels, exit_code=code)
    for key, value in kw.items():
        setattr(o, key, value)
    return o


def test_summary_and_inspect_are_read() -> None:
    o = from_summary({"Id": "x", "Names": ["/n"], "State": "exited", "Status": "Exited (137) 3 seconds ago",
                      "Labels": {LABEL_APP: "a"}})
    assert (o.name, o.state, o.exit_code, o.app_id) == ("n", "exited", 137, "a")
    complete(o, {"State": {"Status": "exited", "ExitCode": 137, "OOMKilled": True, "FinishedAt": "t"},
                 "RestartCount": 2, "HostConfig": {"RestartPolicy": {"Name": "on-failure", "MaximumRetryCount": 2}}})
    assert o.final and o.oom_killed and o.restarts == 2
    pending = from_summary({"Id": "y", "Names": ["/m"], "State": "restarting", "Status": "Restarting (1)"})
    complete(pending, {"State": {"Status": "restarting", "Restarting": True, "ExitCode": 1}, "RestartCount": 0})
    assert not pending.final and replica_state(pending) == AppState.RUNNING  # Docker will start it again


def test_app_states() -> None:
    view = group([obs("a", 0, "running"), obs("a", 1, "exited", 0, final=True), obs("b", 0, "created")])["app-1"]
    st = app_status(view)
    assert st.state == AppState.RUNNING and view.created == 5.0
    assert [[r.id for r in rs.replicas] for rs in st.roles] == [[0, 1], [0]]
    done = [obs("a", 0, "exited", 0, final=True), obs("a", 1, "exited", 0, final=True),
            obs("b", 0, "exited", 0, final=True)]
    assert app_status(group(done)["app-1"]).state == AppState.SUCCEEDED


def test_the_first_failure_is_named_and_the_others_cancelled() -> None:
    view = group([
        obs("a", 0, "exited", 143, final=True, finished_at="2"),
        obs("a", 1, "exited", 3, final=True, finished_at="1"),
        obs("b", 0, "exited", 137, final=True, finished_at="3", oom_killed=True),
    ])["app-1"]
    st = app_status(view)
    assert st.state == AppState.FAILED and st.msg == "role 'a' replica 1 exited with code 3"
    assert st.first_failure == ("a", 1)
    states = [(r.id, r.state) for rs in st.roles for r in rs.replicas]
    assert states == [(0, AppState.CANCELLED), (1, AppState.FAILED), (0, AppState.CANCELLED)]


def test_oom_is_the_reason() -> None:
    st = app_status(AppView("x", [["a", 1, 0, "APPLICATION"]], None,
                            [obs("a", 0, "exited", 137, final=True, oom_killed=True)]))
    assert st.state == AppState.FAILED and "out of memory" in st.msg
    assert "out of memory" in st.roles[0].replicas[0].error_msg


def test_a_missing_container_is_pending() -> None:
    st = app_status(AppView("x", [["a", 2, 0, "APPLICATION"]], None, [obs("a", 0, "running")]))
    assert [r.state for r in st.roles[0].replicas] == [AppState.RUNNING, AppState.PENDING]
