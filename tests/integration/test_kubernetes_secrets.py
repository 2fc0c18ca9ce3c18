"""Declared secrets on the real cluster of ``scripts/k8s-up``, submitted through the runner (``-c secrets=``).

Two replicas get a canary from the submitter's environment, a nasty value from a file and a value from a
Kubernetes Secret the test makes; each prints the sha256 of each value (never the value), on both of its
tries (the first fails, so tsm makes new Jobs). The values reach the pods through the app's Secret and the
user's; they are in none of the Job and Pod objects (read with the kubernetes client), the dry run, describe,
status, list, the logs tsm keeps, any file under ``$TSM_HOME`` or any table of its store. A ``k8s:``
reference to a Secret or key that does not exist fails the app at once with the kubelet's reason.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from integration.k8s_cluster import K8sCluster
from schedulers.conformance import _wait_until
from testutil import store_text
from tsm.runner.api import get_runner
from tsm.schedulers.kubernetes.scheduler import KubernetesScheduler
from tsm.schedulers.kubernetes.secrets import PLACEHOLDER, key
from tsm.specs.api import AppDef, AppState, Resource, RetryPolicy, Role
from tsm.specs.mounts import BindMount

pytestmark = [pytest.mark.integration, pytest.mark.kubernetes]

HANG = 240.0  # seconds: a guard against a hang, never a performance claim
SESSION = "k8ssecrets"
CFG: dict[str, Any] = {"request_fraction": 0.1, "gang_timeout": 120.0, "grace_period": 2}
NASTY = "a b'c\"$HOME`;\n\\x é $(PATH) ${USER}"
#: each replica prints its try and the sha256 of each named variable (never the value); its second try waits
#: for the test's go file, so the test reads the live objects
CODE = """
import hashlib, os, sys, time
mark, attempt, n = sys.argv[2], os.environ["TSM_ATTEMPT"], int(os.environ["TSM_NUM_REPLICAS"])
sums = " ".join(v + "=" + hashlib.sha256(os.environ[v].encode()).hexdigest() for v in sys.argv[1].split(","))
print("try", attempt, sums, flush=True)
open(f"{mark}-{attempt}-{os.environ['TSM_REPLICA_ID']}", "w").close()
# the first try fails once every replica has printed; the second waits for the test's go file
done = [f"{mark}-0-{i}" for i in range(n)] if attempt == "0" else [mark + "-go"]
while not all(os.path.exists(f) for f in done):
    time.sleep(0.05)
sys.exit(3 if attempt == "0" else 0)
"""


def sha(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def forms(value: str) -> list[str]:
    """How a value could show in text: as it is, JSON-escaped, base64 (a Secret's ``data``)."""
    return [value, json.dumps(value)[1:-1], json.dumps(value, ensure_ascii=False)[1:-1],
            base64.b64encode(value.encode()).decode()]


def leaks(text: str, values: list[str]) -> list[str]:
    return [f for v in values for f in forms(v) if f in text]


@pytest.fixture
def kube(k8s_cluster: K8sCluster) -> Iterator[Any]:
    """The kubernetes client's API objects for the test cluster (core, batch, serializer)."""
    from kubernetes import client, config

    api = config.new_client_from_config(k8s_cluster.kubeconfig)
    yield client.CoreV1Api(api), client.BatchV1Api(api), api
    s = KubernetesScheduler(SESSION)
    s.cleanup(include_running=True)
    s.close()
    api.close()


@pytest.fixture
def user_secret(kube: Any) -> Iterator[tuple[str, str]]:
    """A Secret of the user's (``name``, its key ``tok``'s value), made and deleted with the client."""
    core, _, _ = kube
    name, value = f"tsm-it-{os.urandom(3).hex()}", "k8s-value-" + os.urandom(8).hex()
    core.create_namespaced_secret("default", {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name},
                                              "stringData": {"tok": value}})
    yield name, value
    core.delete_namespaced_secret(name, "default")


def tsm_cli(*args: str) -> str:
    """What ``tsm ARGS`` prints (it must succeed)."""
    proc = subprocess.run([str(Path(sys.executable).parent / "tsm"), *args], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout + proc.stderr




def files_leaking(home: Path, values: list[str]) -> list[str]:
    out = []
    for p in home.rglob("*"):
        if p.is_file():
            data = p.read_bytes()
            out += [f"{p}: {f[:8]}..." for v in values for f in forms(v) if f.encode() in data]
    return out


def test_secrets_reach_every_replica_and_try_and_nothing_tsm_keeps(kube: Any, user_secret: tuple[str, str],
                                                                   k8s_cluster: K8sCluster, tsm_home: Path,
                                                                   tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    core, batch, api = kube
    k8s_name, kval = user_secret
    canary = "canary-" + os.urandom(8).hex()
    monkeypatch.setenv("TSM_IT_CANARY", canary)
    nasty_file = tmp_path / "nasty"
    nasty_file.write_text(NASTY)
    values = [canary, NASTY, kval]
    mark = str(tmp_path / "ready")
    role = Role("r", image=k8s_cluster.python_image, entrypoint="python3",
                args=["-c", CODE, "TSM_IT_CANARY,NASTY,KTOK", mark], num_replicas=2, max_retries=1,
                retry_policy=RetryPolicy.ROLE, resource=Resource(cpu=1, memMB=200),
                mounts=[BindMount(str(tmp_path), str(tmp_path))])
    cfg = {**CFG, "secrets": ["TSM_IT_CANARY", f"NASTY:file:{nasty_file}", f"KTOK:k8s:{k8s_name}/tok"]}
    with get_runner(SESSION) as runner:
        info = runner.dryrun(AppDef("secrets", [role]), "kubernetes", cfg=cfg)
        assert leaks(str(info), values) == [] and leaks(info.request.to_json(), values) == []
        assert f'{key("TSM_IT_CANARY")}: "{PLACEHOLDER}"' in str(info) and f"KTOK:k8s:{k8s_name}/tok" in str(info)
        handle = runner.schedule(info)
        app_id = handle.rsplit("/", 1)[-1]

        def second_try_runs() -> bool:
            st = runner.status(handle)  # a look: it makes the second try's Jobs
            assert st is not None and not st.state.is_terminal, st
            return all(Path(f"{mark}-1-{i}").exists() for i in range(2))

        _wait_until(second_try_runs, "both replicas' second try to run", HANG)
        sel = f"tsm/app-id={app_id}"
        jobs = api.sanitize_for_serialization(batch.list_namespaced_job("default", label_selector=sel))["items"]
        pods = api.sanitize_for_serialization(core.list_namespaced_pod("default", label_selector=sel))["items"]
        assert len([j for j in jobs if j["metadata"]["labels"]["tsm/attempt"] == "1"]) == 2
        assert leaks(json.dumps(jobs + pods), values) == []
        want_refs = {"TSM_IT_CANARY": {"name": app_id, "key": key("TSM_IT_CANARY")},
                     "NASTY": {"name": app_id, "key": key("NASTY")}, "KTOK": {"name": k8s_name, "key": "tok"}}
        for spec in [j["spec"]["template"]["spec"] for j in jobs] + [p["spec"] for p in pods]:
            env = {e["name"]: e for e in spec["containers"][0]["env"]}
            for name, ref in want_refs.items():
                assert env[name] == {"name": name, "valueFrom": {"secretKeyRef": ref}}, env[name]
        ours = core.read_namespaced_secret(app_id, "default")  # the channel: the values are here, owned
        assert base64.b64decode(ours.data[key("NASTY")]).decode() == NASTY and key("KTOK") not in ours.data
        assert ours.metadata.owner_references[0].kind == "Service"
        shown = [repr(runner.describe(handle)), repr(runner.scheduler("kubernetes").describe(app_id)),
                 str(runner.status(handle)), repr(runner.list("kubernetes")), repr(runner.list()),
                 tsm_cli("describe", handle), tsm_cli("status", handle), tsm_cli("list", "-s", "kubernetes")]
        assert app_id in shown[-1] and leaks("\n".join(shown), values) == []
        Path(f"{mark}-go").touch()
        st = runner.wait(handle, wait_interval=0.5, timeout=HANG)
        assert st is not None and st.state == AppState.SUCCEEDED, st
        want = f"TSM_IT_CANARY={sha(canary)} NASTY={sha(NASTY)} KTOK={sha(kval)}"
        for i in range(2):
            assert list(runner.log_lines(handle, "r", i)) == [f"try 0 {want}\n", f"try 1 {want}\n"]
        assert files_leaking(tsm_home, values) == [] and leaks(store_text(tsm_home), values) == []
        assert runner.remove([handle]) == [handle]

    def nothing_left() -> bool:
        return not [*core.list_namespaced_secret("default", label_selector=sel).items,
                    *batch.list_namespaced_job("default", label_selector=sel).items,
                    *core.list_namespaced_pod("default", label_selector=sel).items,
                    *core.list_namespaced_service("default", label_selector=sel).items]

    _wait_until(nothing_left, f"every object of {app_id} to be deleted", HANG)  # the app's Secret went with it
    assert core.read_namespaced_secret(k8s_name, "default").metadata.name == k8s_name
    assert not (tsm_home / "kubernetes" / app_id).exists()
    assert files_leaking(tsm_home, values) == [] and leaks(store_text(tsm_home), values) == []


def test_a_missing_kubernetes_secret_or_key_fails_the_app_with_the_kubelets_reason(
        kube: Any, user_secret: tuple[str, str], k8s_cluster: K8sCluster) -> None:
    k8s_name, _ = user_secret
    role = Role("r", image=k8s_cluster.python_image, entrypoint="python3", args=["-c", "pass"],
                resource=Resource(cpu=1, memMB=200))
    with get_runner(SESSION) as runner:
        for entry, words in ((f"DB:k8s:{k8s_name}-nope/tok", f'"{k8s_name}-nope" not found'),
                             (f"DB:k8s:{k8s_name}/nokey", f"couldn't find key nokey in Secret default/{k8s_name}")):
            handle = runner.schedule(runner.dryrun(AppDef("missing", [role]), "kubernetes",
                                                   cfg={**CFG, "secrets": [entry]}))
            st = runner.wait(handle, wait_interval=0.5, timeout=HANG)
            assert st is not None and st.state == AppState.FAILED, st
            desc = runner.scheduler("kubernetes").describe(handle.rsplit("/", 1)[-1])
            assert desc is not None and "a replica cannot start" in desc.msg, desc.msg
            assert "CreateContainerConfigError" in desc.msg and words in desc.msg, desc.msg
