"""Declared secrets on the kubernetes backend: the request and its dry run hold names and references only,
``schedule`` puts the values in the app's Secret, and the fake cluster's replicas (real processes) see them.

The same flow runs on the real cluster in ``tests/integration/test_kubernetes_secrets.py`` (the final proof).
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from schedulers.conformance import _wait_until
from schedulers.kubernetes.fake_kube import FakeCluster
from tsm.errors import InvalidAppError, SecretError
from tsm.runner.api import Runner
from tsm.schedulers.api import Secrets
from tsm.schedulers.kubernetes.dryrun import format_request
from tsm.schedulers.kubernetes.request import KubernetesOptions, build_request
from tsm.schedulers.kubernetes.scheduler import KubernetesScheduler
from tsm.schedulers.kubernetes.secrets import PLACEHOLDER, app_secret, key, missing, with_secrets
from tsm.specs.api import AppDef, AppState, RetryPolicy, Role

PY = sys.executable
HANG = 60.0
CFG: dict[str, Any] = {"dns": "yes"}
NASTY = "a b'c\"$HOME`;\n\\x é $(PATH) ${USER}"
#: each replica prints its try and the sha256 of each named variable (never the value)
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


def build(app: AppDef) -> Any:
    return with_secrets(build_request(app, KubernetesOptions(), "s", "/tmp", 1.0, "me"), app)


def runner_on(cluster: FakeCluster) -> tuple[Runner, KubernetesScheduler]:
    sched = KubernetesScheduler("t", client=cluster.client())
    return Runner("t", scheduler_factories={"kubernetes": lambda session, **kw: sched}), sched


def role(name: str, *args: str, **kw: Any) -> Role:
    return Role(name, image="fake/python", entrypoint=PY, args=["-c", CODE, *args], **kw)


def env_of(job: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}


def test_the_scheduler_takes_secrets_from_env_files_and_kubernetes_secrets() -> None:
    assert isinstance(KubernetesScheduler("t", client=FakeCluster().client()), Secrets)
    assert KubernetesScheduler.secret_kinds == ("env", "file", "k8s")


def test_the_dry_run_holds_names_and_references_never_a_value(cluster: FakeCluster, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    canary = "canary-" + "7f3a" * 4
    monkeypatch.setenv("MY_TOKEN", canary)
    (tmp_path / "nasty").write_text(NASTY)
    app = AppDef("sec", [role("a", num_replicas=2), role("b", secrets=[f"ONLY_B:file:{tmp_path / 'nasty'}"])])
    runner, _ = runner_on(cluster)
    cfg = {**CFG, "secrets": ["TOKEN:env:MY_TOKEN", "DB:k8s:db-creds/pass"]}
    info = runner.dryrun(app, "kubernetes", cfg=cfg)
    req = info.request
    shown, held = str(info), req.to_json()
    for text in (shown, held, repr(req)):
        assert canary not in text and NASTY not in text and json.dumps(NASTY)[1:-1] not in text
    assert req.secrets == ["TOKEN:env:MY_TOKEN", "DB:k8s:db-creds/pass", f"ONLY_B:file:{tmp_path / 'nasty'}"]
    assert f'{key("TOKEN")}: "{PLACEHOLDER}"' in shown and f'{key("ONLY_B")}: "{PLACEHOLDER}"' in shown
    assert key("TOKEN") not in req.secret["stringData"] and key("DB") not in shown  # k8s: the pod reads it
    assert "# secrets (read at submit" in shown and "TOKEN:env:MY_TOKEN" in shown
    own = {"name": req.app_id, "key": key("TOKEN")}
    for job in req.jobs:
        env = env_of(job)
        assert env["TOKEN"] == {"name": "TOKEN", "valueFrom": {"secretKeyRef": own}}
        assert env["DB"] == {"name": "DB", "valueFrom": {"secretKeyRef": {"name": "db-creds", "key": "pass"}}}
        is_b = job["metadata"]["annotations"]["tsm/role-name"] == "b"
        assert ("ONLY_B" in env) == is_b  # each role gets the secrets it declares
    assert len(req.jobs) == 3 and not cluster.services and not cluster.secrets  # a dry run makes nothing


def test_the_dry_run_yaml_reads_back_as_the_manifests_with_a_placeholder() -> None:
    yaml = pytest.importorskip("yaml")
    app = AppDef("y", [Role("r", "img", "python", secrets=["TOKEN", "DB:k8s:db/pass"], env={"A": "yes"})])
    req = build(app)
    docs = [d for d in yaml.safe_load_all(format_request(req)) if d]
    secret = {**req.secret, "stringData": {**req.secret["stringData"], key("TOKEN"): PLACEHOLDER}}
    assert docs == [req.service, secret, *req.jobs]


def test_values_reach_every_replica_and_every_try_and_no_file_of_tsm(cluster: FakeCluster, tmp_path: Path,
                                                                      tsm_home: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    canary, kval = "canary-" + "91c2" * 4, "k8s-value-" + "d00d" * 4
    monkeypatch.setenv("TSM_UT_CANARY", canary)
    (tmp_path / "nasty").write_text(NASTY)
    cluster.secrets["db-creds"] = {"metadata": {"name": "db-creds", "labels": {}}, "stringData": {"pass": kval}}  # the user's
    mark = str(tmp_path / "ready")
    app = AppDef("sec", [role("r", "TSM_UT_CANARY,NASTY,DB", mark, num_replicas=2, max_retries=1,
                              retry_policy=RetryPolicy.ROLE)])
    runner, sched = runner_on(cluster)
    cfg = {**CFG, "secrets": ["TSM_UT_CANARY", f"NASTY:file:{tmp_path / 'nasty'}", "DB:k8s:db-creds/pass"]}
    handle = runner.schedule(runner.dryrun(app, "kubernetes", cfg=cfg))
    app_id = handle.rsplit("/", 1)[-1]
    # the second try runs (the look that retries it is the status call) and waits for the go file
    def second_try_runs() -> bool:
        st = runner.status(handle)
        assert st is not None and not st.state.is_terminal, st
        return all(Path(f"{mark}-1-{i}").exists() for i in range(2))

    _wait_until(second_try_runs, "both replicas' second try to run", HANG)
    ours = cluster.secrets[app_id]["stringData"]
    assert ours[key("TSM_UT_CANARY")] == canary and ours[key("NASTY")] == NASTY and key("DB") not in ours
    objects = json.dumps([*cluster.jobs.values(), *(p.obj for p in cluster.pods.values())])
    assert "-a1" in objects  # the retry's Jobs are there
    for value in (canary, NASTY, kval):
        assert value not in objects and json.dumps(value)[1:-1] not in objects
    Path(f"{mark}-go").touch()
    st = runner.wait(handle, wait_interval=0.05)
    assert st is not None and st.state == AppState.SUCCEEDED, st
    want = f"TSM_UT_CANARY={sha(canary)} NASTY={sha(NASTY)} DB={sha(kval)}"
    for i in range(2):
        assert list(runner.log_lines(handle, "r", i)) == [f"try 0 {want}\n", f"try 1 {want}\n"]
    assert app_id not in cluster.secrets and "db-creds" in cluster.secrets  # the user's stays
    seen = [p for p in tsm_home.rglob("*") if p.is_file()]
    assert any(p.name == "request.json" for p in seen)
    for p in seen:
        data = p.read_bytes()
        for value in (canary, NASTY, kval):
            assert value.encode() not in data and json.dumps(value)[1:-1].encode() not in data, p


def test_a_missing_kubernetes_secret_or_key_fails_the_app_at_once(cluster: FakeCluster) -> None:
    cluster.secrets["db-creds"] = {"metadata": {"name": "db-creds", "labels": {}}, "stringData": {"pass": "x"}}
    runner, sched = runner_on(cluster)
    for entry, words in (("DB:k8s:nope/pass", 'secret "nope" not found'),
                         ("DB:k8s:db-creds/user", "couldn't find key user in Secret default/db-creds")):
        app = AppDef("miss", [Role("r", "fake/python", PY, ["-c", "pass"])])
        handle = runner.schedule(runner.dryrun(app, "kubernetes", cfg={**CFG, "gang_timeout": 3600.0,
                                                                       "secrets": [entry]}))
        st = runner.wait(handle, wait_interval=0.05)
        assert st is not None and st.state == AppState.FAILED, st
        desc = sched.describe(handle.rsplit("/", 1)[-1])
        assert desc is not None and "a replica cannot start" in desc.msg and words in desc.msg, desc.msg
        assert "NAME:k8s:SECRET/KEY" in desc.msg and "gang_timeout" not in desc.msg
    assert list(cluster.secrets) == ["db-creds"]


def test_a_secret_without_a_value_at_submit_makes_nothing(cluster: FakeCluster, tsm_home: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TSM_UT_UNSET", raising=False)
    runner, _ = runner_on(cluster)
    info = runner.dryrun(AppDef("u", [role("r")]), "kubernetes", cfg={**CFG, "secrets": ["TSM_UT_UNSET"]})
    with pytest.raises(SecretError, match=r"TSM_UT_UNSET.*not set"):
        runner.schedule(info)
    assert not cluster.services and not cluster.secrets and not cluster.jobs
    assert not (tsm_home / "kubernetes").exists() or not any((tsm_home / "kubernetes").iterdir())


def test_a_secret_may_not_take_a_name_tsm_sets_itself() -> None:
    app = AppDef("n", [Role("r", "img", "sh", secrets=["TSM_REPLICA_ID"])])
    with pytest.raises(InvalidAppError, match="tsm sets TSM_REPLICA_ID itself"):
        build(app)


@pytest.mark.parametrize(("reason", "message", "hopeless"), [
    ("CreateContainerConfigError", 'secret "db-creds" not found', True),
    ("CreateContainerConfigError", "couldn't find key pass in Secret default/db-creds", True),
    ("CreateContainerConfigError", 'configmap "cfg" not found', False),
    ("ErrImagePull", 'secret "x" not found', False),
])
def test_the_kubelets_words_for_a_missing_secret(reason: str, message: str, hopeless: bool) -> None:
    assert bool(missing(reason, message)) == hopeless


def test_secrets_that_do_not_fit_in_a_secret_are_refused_at_submit(tmp_path: Path) -> None:
    big = tmp_path / "big"
    big.write_text("x" * 60_000)
    entries = [f"S{i}:file:{big}" for i in range(20)]  # 1.2 MB: over the 1 MiB a Secret holds
    req = build(AppDef("b", [Role("r", "img", "sh", secrets=entries)]))
    assert app_secret(build(AppDef("b", [Role("r", "img", "sh", secrets=entries[:2])])))["stringData"][key("S1")] == (
        "x" * 60_000)
    with pytest.raises(SecretError, match="over the 1,048,576 bytes"):
        app_secret(req)
