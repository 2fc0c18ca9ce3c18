"""The pure parts of the kubernetes backend: AppDef -> manifests, names, escaping, pods -> statuses."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from tsm.errors import InvalidAppError, InvalidRunOptionError
from tsm.schedulers.kubernetes.dryrun import (
    format_request,
)
from tsm.schedulers.kubernetes.manifests import (
    rank0_names,
    retried,
    with_own_ip_as_rank0,
    with_owner,
    with_rank0,
)
from tsm.schedulers.kubernetes.request import (
    ANN_ROLE,
    LABEL_APP,
    LABEL_ATTEMPT,
    LABEL_REPLICA,
    KubernetesOptions,
    build_request,
    deep_merge,
    escape,
    host_name,
    job_name,
    short_name,
    validate,
)
from tsm.schedulers.kubernetes.status import AppView, app_status, from_json, latest_pod, quantity
from tsm.specs.api import AppDef, AppState, Resource, RetryPolicy, Role
from tsm.specs.mounts import BindMount, DeviceMount, VolumeMount


def _req(app: AppDef, **opts: Any) -> Any:
    return build_request(app, KubernetesOptions(**opts), "sess", "/store", 1700000000.0)


def _pod_spec(job: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = job["spec"]["template"]["spec"]
    return spec


def test_one_headless_service_and_one_job_per_replica() -> None:
    app = AppDef("Train_App", [Role("trainer", "img:1", "python", ["-c", "x"], num_replicas=2),
                               Role("ps", "img:2", "sh")])
    req = _req(app)
    assert req.app_id.startswith("train-app-") and len(req.app_id) == len("train-app-") + 8
    svc = req.service
    assert svc["kind"] == "Service" and svc["metadata"]["name"] == req.app_id
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True
    assert svc["spec"]["selector"] == {LABEL_APP: req.app_id}
    assert [j["metadata"]["name"] for j in req.jobs] == [
        f"{req.app_id}-trainer-0", f"{req.app_id}-trainer-1", f"{req.app_id}-ps-0"]
    pod = _pod_spec(req.jobs[1])
    assert pod["hostname"] == "trainer-1" and pod["subdomain"] == req.app_id
    assert pod["restartPolicy"] == "Never" and pod["enableServiceLinks"] is False
    c = pod["containers"][0]
    assert c["image"] == "img:1" and c["imagePullPolicy"] == "IfNotPresent"
    assert c["command"] == ["python"] and c["args"] == ["-c", "x"]
    env = {e["name"]: e.get("value", "") for e in c["env"]}
    assert env["TSM_RANK0_HOST"] == f"trainer-0.{req.app_id}"
    assert env["TSM_REPLICA_ID"] == "1" and env["TSM_NUM_REPLICAS"] == "2" and env["TSM_ROLE_NAME"] == "trainer"
    labels = req.jobs[1]["spec"]["template"]["metadata"]["labels"]
    assert labels[LABEL_APP] == req.app_id and labels[LABEL_REPLICA] == "1" and labels[LABEL_ATTEMPT] == "0"
    assert req.jobs[2]["metadata"]["annotations"][ANN_ROLE] == "ps"
    assert req.roles == [["trainer", 2, 0, "APPLICATION"], ["ps", 1, 0, "APPLICATION"]]


def test_resources_requests_limits_gpu_shm_selector_and_mounts() -> None:
    res = Resource(cpu=2, gpu=1, memMB=1000, capabilities={"node.kubernetes.io/instance-type": "p4d"},
                   devices={"vpc.amazonaws.com/efa": 2})
    role = Role("r", "img", "python", resource=res, mounts=[
        BindMount("/data", "/in", read_only=True), VolumeMount("claim", "/out"), DeviceMount("/dev/fuse", "/dev/fuse")])
    req = _req(AppDef("a", [role]), request_fraction=0.5, shm_fraction=0.25)
    pod = _pod_spec(req.jobs[0])
    c = pod["containers"][0]
    assert c["resources"]["limits"] == {"cpu": "2", "memory": "1000Mi", "nvidia.com/gpu": "1",
                                        "vpc.amazonaws.com/efa": "2"}
    assert c["resources"]["requests"] == {"cpu": "1", "memory": "500Mi", "nvidia.com/gpu": "1",
                                          "vpc.amazonaws.com/efa": "2"}
    assert pod["nodeSelector"] == {"node.kubernetes.io/instance-type": "p4d"}
    vols = {v["name"]: v for v in pod["volumes"]}
    assert vols["m0"]["hostPath"] == {"path": "/data"}
    assert vols["m1"]["persistentVolumeClaim"] == {"claimName": "claim", "readOnly": False}
    assert vols["m2"]["hostPath"] == {"path": "/dev/fuse", "type": "CharDevice"}
    assert vols["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "250Mi"}
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    assert mounts["/in"]["readOnly"] is True and mounts["/dev/shm"]["name"] == "dshm"
    assert req.needs[0].cpu_milli == 1000 and req.needs[0].mem_bytes == 500 * 2**20 and req.needs[0].gpus == 1


def test_quantities_are_in_the_api_servers_canonical_form() -> None:
    from tsm.schedulers.kubernetes.request import cpu_quantity, mem_quantity

    assert [cpu_quantity(m) for m in (1000, 100, 1500, 2000)] == ["1", "100m", "1500m", "2"]
    assert [mem_quantity(m) for m in (200, 1024, 2048, 1536, 1048576)] == ["200Mi", "1Gi", "2Gi", "1536Mi", "1Ti"]


def test_run_options_reach_the_pod() -> None:
    req = _req(AppDef("a", [Role("r", "img", "sh")]), namespace="ml", service_account="trainer",
               priority_class="high", image_pull_policy="Never", grace_period=3)
    pod = _pod_spec(req.jobs[0])
    assert req.jobs[0]["metadata"]["namespace"] == "ml" == req.service["metadata"]["namespace"]
    assert pod["serviceAccountName"] == "trainer" and pod["priorityClassName"] == "high"
    assert pod["terminationGracePeriodSeconds"] == 3
    assert pod["containers"][0]["imagePullPolicy"] == "Never"
    assert "resources" not in pod["containers"][0]  # a role without a size asks for nothing


@pytest.mark.parametrize("opts", [{"image_pull_policy": "sometimes"}, {"dns": "maybe"}, {"gang_timeout": 0.0},
                                  {"request_fraction": 0.0}, {"namespace": "Bad_NS"}, {"shm_fraction": 2.0}])
def test_bad_run_options_are_refused(opts: dict[str, Any]) -> None:
    with pytest.raises(InvalidRunOptionError):
        KubernetesOptions(**opts).check()


def test_retry_policies_map_to_backoff_limit_or_tsm() -> None:
    app = AppDef("a", [Role("r", "img", "sh", max_retries=3, retry_policy=RetryPolicy.REPLICA),
                       Role("s", "img", "sh", max_retries=2, retry_policy=RetryPolicy.APPLICATION)])
    req = _req(app)
    assert req.jobs[0]["spec"]["backoffLimit"] == 3
    assert req.jobs[1]["spec"]["backoffLimit"] == 0  # tsm recreates the Jobs instead
    again = retried(req.jobs[1], req.app_id, 2)
    assert again["metadata"]["name"] == f"{req.app_id}-s-0-a2"
    assert again["metadata"]["labels"][LABEL_ATTEMPT] == "2"
    assert again["spec"]["template"]["metadata"]["labels"][LABEL_ATTEMPT] == "2"
    assert req.jobs[1]["metadata"]["labels"][LABEL_ATTEMPT] == "0"  # the request is not changed


def test_dollar_is_escaped_so_kubernetes_expansion_gives_the_bytes_back() -> None:
    assert escape("$(HOME) $$ $x $") == "$$(HOME) $$$$ $$x $$"
    role = Role("r", "img", "echo", ["$(TSM_APP_ID)"], env={"V": "$(PATH)"})
    req = _req(AppDef("a", [role]))
    c = _pod_spec(req.jobs[0])["containers"][0]
    assert c["args"] == ["$$(TSM_APP_ID)"]
    assert {e["name"]: e.get("value") for e in c["env"]}["TSM_APP_ID"] == req.app_id
    # the role's env is in the Secret, which Kubernetes never expands: the value is kept as given
    ref = next(e for e in c["env"] if e["name"] == "V")["valueFrom"]["secretKeyRef"]
    assert ref["name"] == req.app_id and req.secret["stringData"][ref["key"]] == "$(PATH)"


def test_names_are_shortened_with_a_stable_hash() -> None:
    long = "x" * 100
    a, b = short_name(long), short_name(long + "y")
    assert len(a) == 63 and a == short_name(long) and a != b
    assert short_name("short") == "short"
    role = "R" * 80
    assert len(host_name(role, 7)) <= 63 and host_name(role, 7) == host_name(role, 7)
    name = job_name("app-12345678", role, 3, attempt=2)
    assert len(name) <= 63 and name != job_name("app-12345678", role, 3, attempt=1)
    req = _req(AppDef("n" * 90, [Role(role, "img", "sh")]))
    assert len(req.app_id) <= 63 and all(len(j["metadata"]["name"]) <= 63 for j in req.jobs)
    for v in req.jobs[0]["metadata"]["labels"].values():
        assert len(v) <= 63


def test_validate_refuses_what_kubernetes_cannot_take() -> None:
    with pytest.raises(InvalidAppError, match="no image"):
        validate(AppDef("a", [Role("r", "", "sh")]))
    with pytest.raises(InvalidAppError, match="env name"):
        validate(AppDef("a", [Role("r", "img", "sh", env={"with space": "x"})]))
    with pytest.raises(InvalidAppError, match="not UTF-8"):
        validate(AppDef("a", [Role("r", "img", "sh", args=["\udcff"])]))
    with pytest.raises(InvalidAppError, match="same pod host names"):
        validate(AppDef("a", [Role("a_b", "img", "sh"), Role("a-b", "img", "sh")]))
    with pytest.raises(InvalidAppError, match="metadata"):
        validate(AppDef("a", [Role("r", "img", "sh", metadata={"kubernetes": "no"})]))


def test_pod_overlay_is_deep_merged() -> None:
    overlay = {"tolerations": [{"key": "gpu", "operator": "Exists"}], "nodeSelector": {"zone": "a"},
               "containers": [{"name": "main", "securityContext": {"privileged": True}}]}
    role = Role("r", "img", "sh", resource=Resource(cpu=1, memMB=10, capabilities={"pool": "x"}),
                metadata={"kubernetes": overlay})
    pod = _pod_spec(_req(AppDef("a", [role])).jobs[0])
    assert pod["tolerations"] == [{"key": "gpu", "operator": "Exists"}]
    assert pod["nodeSelector"] == {"pool": "x", "zone": "a"}
    assert pod["containers"][0]["securityContext"] == {"privileged": True}
    assert pod["containers"][0]["image"] == "img"
    assert deep_merge({"a": [1]}, {"a": [2]}) == {"a": [2]}


def test_torchx_v1pod_overlay_patches_the_pod_spec_with_put_join_del() -> None:
    """TorchX's ``set_overlay(role, "kubernetes", "V1Pod", ...)`` form: JOIN by default, PUT replaces, DEL drops."""
    from tsm.specs.overlays import DEL, PUT, set_overlay

    role = Role("r", "img", "sh", resource=Resource(cpu=1, memMB=10, capabilities={"pool": "x"}))
    set_overlay(role, "kubernetes", "V1Pod", {"spec": {"nodeSelector": {"zone": "a"}}})
    set_overlay(role, "kubernetes", "V1Pod", {"spec": {PUT("tolerations"): [{"key": "gpu", "operator": "Exists"}]}})
    set_overlay(role, "kubernetes", "V1Pod", {"spec": {DEL("restartPolicy"): None}})
    pod = _pod_spec(_req(AppDef("a", [role])).jobs[0])
    assert pod["nodeSelector"] == {"pool": "x", "zone": "a"}
    assert pod["tolerations"] == [{"key": "gpu", "operator": "Exists"}]
    assert "restartPolicy" not in pod
    assert pod["containers"][0]["image"] == "img"


def test_owner_and_rank0_ip_are_applied_to_a_copy() -> None:
    req = _req(AppDef("a", [Role("r", "img", "sh", num_replicas=2)]))
    owned = with_owner(req.jobs[1], "uid-1", req.app_id)
    assert owned["metadata"]["ownerReferences"][0] == {"apiVersion": "v1", "kind": "Service", "name": req.app_id,
                                                       "uid": "uid-1", "blockOwnerDeletion": False}
    assert "ownerReferences" not in req.jobs[1]["metadata"]
    ip = with_rank0(req.jobs[1], "172.17.0.5")
    env = {e["name"]: e.get("value", "") for e in _pod_spec(ip)["containers"][0]["env"]}
    assert env["TSM_RANK0_HOST"] == "172.17.0.5"
    assert "hostAliases" not in _pod_spec(req.jobs[1])


def test_dns_mode_manifests_name_rank0_by_the_services_dns() -> None:
    """dns=yes: every replica (rank 0 too) is told ``<role0>-0.<app_id>``, resolved by the cluster's DNS
    through the headless Service (``publishNotReadyAddresses``: before the pods are Ready); no host aliases."""
    app = AppDef("a", [Role("trainer", "img", "sh", num_replicas=2), Role("ps", "img", "sh")])
    req = _req(app, dns="yes", namespace="ml")
    assert req.dns == "yes"
    for job in req.jobs:
        pod = _pod_spec(job)
        env = {e["name"]: e.get("value", "") for e in pod["containers"][0]["env"]}
        assert env["TSM_RANK0_HOST"] == f"trainer-0.{req.app_id}"
        assert pod["subdomain"] == req.app_id == req.service["metadata"]["name"]
        assert "hostAliases" not in pod
    assert req.service["spec"]["publishNotReadyAddresses"] is True and req.service["spec"]["clusterIP"] == "None"
    assert "dns=yes" in format_request(req)


def test_no_dns_mode_gives_the_others_rank0_ip_and_host_aliases() -> None:
    """dns=no: the others get rank 0's pod IP, and host aliases mapping every name rank 0's pod knows itself
    by (torch's c10d advertises its FQDN) to that IP; a retry with a new IP replaces the old alias."""
    app = AppDef("a", [Role("trainer", "img", "sh", num_replicas=2), Role("ps", "img", "sh")])
    req = _req(app, dns="no", namespace="ml")
    host = f"trainer-0.{req.app_id}"
    names = ["trainer-0", host, f"{host}.ml.svc", f"{host}.ml.svc.cluster.local"]
    assert rank0_names(req.jobs[2]) == names
    job = with_rank0(req.jobs[2], "10.1.0.7")
    pod = _pod_spec(job)
    assert pod["hostAliases"] == [{"ip": "10.1.0.7", "hostnames": names}]
    assert {e["name"]: e.get("value", "") for e in pod["containers"][0]["env"]}["TSM_RANK0_HOST"] == "10.1.0.7"
    again = _pod_spec(with_rank0(job, "10.1.0.9"))
    assert again["hostAliases"] == [{"ip": "10.1.0.9", "hostnames": names}]
    own = _pod_spec(with_own_ip_as_rank0(req.jobs[0]))["containers"][0]["env"]
    assert next(e for e in own if e["name"] == "TSM_RANK0_HOST") == {
        "name": "TSM_RANK0_HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
    overlaid = _req(AppDef("a", [Role("r", "img", "sh", num_replicas=2, metadata={
        "kubernetes": {"hostAliases": [{"ip": "10.9.9.9", "hostnames": ["data"]}]}})]), dns="no")
    kept = _pod_spec(with_rank0(overlaid.jobs[1], "10.1.0.7"))["hostAliases"]
    assert kept[0] == {"ip": "10.9.9.9", "hostnames": ["data"]} and kept[1]["ip"] == "10.1.0.7"


def test_dry_run_prints_every_manifest_as_yaml() -> None:
    req = _req(AppDef("a", [Role("r", "img", "python", ["-c", "print('a: b')"], num_replicas=2)]))
    text = format_request(req)
    assert text.count("\n---\n") + text.count("---\n") >= 3
    assert 'kind: "Service"' in text and text.count('kind: "Job"') == 2 and 'kind: "Secret"' in text
    assert json.dumps("print('a: b')") in text
    assert f'name: "{req.app_id}-r-1"' in text


def _pod(role: str, k: int, phase: str, attempt: int = 0, created: str = "2026-01-01T00:00:00Z",
         **status: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": f"p-{role}-{k}-{attempt}-{created[-3:-1]}", "creationTimestamp": created,
                     "labels": {LABEL_APP: "app-1", LABEL_REPLICA: str(k), LABEL_ATTEMPT: str(attempt)},
                     "annotations": {ANN_ROLE: role, "tsm/roles": json.dumps([[role, 2, 1, "REPLICA"]]),
                                     "tsm/created": "1.0"}},
        "status": {"phase": phase, **status},
    }


def _view(*pods: dict[str, Any]) -> AppView:
    ps = [from_json(p) for p in pods]
    return AppView("app-1", ps[0].roles, 1.0, ps)


def test_status_from_pods_with_reasons() -> None:
    pull = {"containerStatuses": [{"restartCount": 0, "state": {"waiting": {"reason": "ErrImagePull",
                                                                            "message": "no such image"}}}]}
    st = app_status(_view(_pod("w", 0, "Running"), _pod("w", 1, "Pending", **pull)))
    assert st.state == AppState.RUNNING and not st.all_started
    assert "ErrImagePull: no such image" in st.pending_reason
    unsched = {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                               "message": "0/1 nodes are available"}]}
    st = app_status(_view(_pod("w", 0, "Pending", **unsched), _pod("w", 1, "Pending")))
    assert st.state == AppState.PENDING and "Unschedulable" in st.pending_reason


def test_replica_retries_count_failed_pods_and_the_last_decides() -> None:
    failed = {"containerStatuses": [{"state": {"terminated": {"exitCode": 3, "reason": "Error",
                                                              "finishedAt": "2026-01-01T00:00:05Z"}}}]}
    oom = {"containerStatuses": [{"state": {"terminated": {"exitCode": 137, "reason": "OOMKilled",
                                                           "finishedAt": "2026-01-01T00:00:09Z"}}}]}
    ok = {"containerStatuses": [{"state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}]}
    # one failure, max_retries=1 under REPLICA: still running (the Job makes the next pod)
    st = app_status(_view(_pod("w", 0, "Failed", **failed), _pod("w", 1, "Succeeded", **ok)))
    assert st.state == AppState.RUNNING
    # the second pod succeeded: one restart, the app succeeded
    st = app_status(_view(_pod("w", 0, "Failed", **failed),
                          _pod("w", 0, "Succeeded", created="2026-01-01T00:00:07Z", **ok),
                          _pod("w", 1, "Succeeded", **ok)))
    assert st.state == AppState.SUCCEEDED and st.roles[0].replicas[0].restarts == 1
    # two failures: out of retries; the OOM reason is named
    st = app_status(_view(_pod("w", 0, "Failed", **failed),
                          _pod("w", 0, "Failed", created="2026-01-01T00:00:07Z", **oom),
                          _pod("w", 1, "Running")))
    assert st.state == AppState.FAILED and st.first_failure == ("w", 0)
    assert "OOMKilled" in st.msg and st.roles[0].replicas[0].exit_code == 137
    # pods of an older tsm attempt are ignored
    st = app_status(_view(_pod("w", 0, "Failed", **failed), _pod("w", 0, "Succeeded", attempt=1, **ok),
                          _pod("w", 1, "Succeeded", attempt=1, **ok)))
    assert st.state == AppState.SUCCEEDED and st.num_restarts == 1


def test_dry_run_yaml_parses_back_to_the_manifests_for_the_hostile_corpus() -> None:
    """The printed YAML is exactly what is created: a YAML parser gives back every manifest, byte for byte."""
    import re

    import hostile

    yaml = pytest.importorskip("yaml")  # PyYAML comes with the kubernetes client (the test extra)

    args = [a for a in hostile.args("/tmp/pwned") if hostile.is_utf8(a)] + ["\x85", "\u2028", "a: b", "- x", "yes", "1.5", ""]
    env = {k: v for k, v in hostile.env("/tmp/pwned").items()
           if hostile.is_utf8(k) and hostile.is_utf8(v) and re.match(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$", k)}
    req = _req(AppDef("y", [Role("r", "img", "python", args, env=env, num_replicas=2)]))
    docs = [d for d in yaml.safe_load_all(format_request(req)) if d]
    assert docs == [req.service, req.secret, *req.jobs]


def test_quantities_requests_start_and_the_replicas_pod_for_the_views() -> None:
    assert [quantity(q) for q in ("2", "1500m", "250000000n", "16Gi", "64M", "3k")] == [
        2.0, 1.5, 0.25, 16 * 2**30, 64e6, 3000.0]
    req = _req(AppDef("a", [Role("r", "img", "sh", resource=Resource(cpu=2, memMB=1000, gpu=1))]),
               request_fraction=0.5)
    raw = _pod("r", 0, "Running", containerStatuses=[
        {"restartCount": 0, "state": {"running": {"startedAt": "2026-01-01T00:00:05Z"}}}])
    raw["spec"] = copy.deepcopy(_pod_spec(req.jobs[0]))
    p = from_json(raw)
    assert (p.cpu_req, p.mem_req_mb, p.gpu_req) == (1.0, 500.0, 1)
    assert p.started == from_json(_pod("r", 0, "Running", created="2026-01-01T00:00:05Z")).created
    assert from_json(_pod("r", 0, "Pending")).cpu_req is None  # a pod without a spec: no requests known
    tries = [from_json(_pod("r", 0, "Failed", attempt=1, created="2026-01-01T00:00:01Z")),
             from_json(_pod("r", 0, "Running", attempt=1, created="2026-01-01T00:00:09Z")),
             from_json(_pod("r", 0, "Failed", attempt=0, created="2026-01-01T00:00:20Z"))]
    latest = latest_pod(tries)
    assert latest is not None and (latest.attempt, latest.phase) == (1, "Running")
    assert latest_pod([]) is None


def test_env_values_shared_by_replicas_are_stored_once_and_an_oversized_secret_is_refused_at_dry_run() -> None:
    """512 replicas with a 2 KB env: one value in the Secret (Kubernetes refuses a Secret over 1 MiB)."""
    big = "x" * 2048
    req = _req(AppDef("a", [Role("r", "img", "sh", num_replicas=512, env={"CONFIG": big},
                                 resource=Resource(cpu=1, memMB=10))]))
    assert list(req.secret["stringData"].values()) == [big]
    too_big = {f"V{i}": str(i) * 100_000 for i in range(11)}  # 1.1 MB of distinct values
    with pytest.raises(InvalidAppError, match="over the 1,048,576 bytes"):
        _req(AppDef("a", [Role("r", "img", "sh", env=too_big, resource=Resource(cpu=1, memMB=10))]))
