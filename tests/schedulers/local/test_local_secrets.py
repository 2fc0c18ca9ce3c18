"""Secrets on the local scheduler: each replica's environment gets them at every attempt, and no file under
$TSM_HOME, no store row, no dry run, describe, status or list holds a value."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from testutil import everything_under as _everything_under
from tsm.errors import InvalidAppError, NotSupportedError, SecretError
from tsm.runner import get_runner
from tsm.specs.api import AppDef, AppState, RetryPolicy, Role

CANARY = "tsm-canary-7f3a9c"
NASTY = "a b'c\"$HOME`;\n\\x é\n"

# prints each secret's sha256 (never the value), whether the renamed source variable leaked, and fails the
# first attempt of replica 0 so a retry must see the secrets too
PROGRAM = r"""
import hashlib, os, sys
got = {n: hashlib.sha256(os.environ[n].encode()).hexdigest() if n in os.environ else None for n in ("TOKEN", "NASTY")}
print("SEEN", os.environ["TSM_REPLICA_ID"], os.environ["TSM_ATTEMPT"], got["TOKEN"], got["NASTY"],
      "SRC" in os.environ, flush=True)
if os.environ["TSM_REPLICA_ID"] == "0" and os.environ["TSM_ATTEMPT"] == "0":
    sys.exit(3)
"""


def _sha(v: str) -> str:
    return hashlib.sha256(v.encode()).hexdigest()




def test_secrets_reach_every_attempt_of_every_replica_and_are_kept_nowhere(
        tmp_path: Path, tsm_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SRC", CANARY)
    (tmp_path / "nasty").write_text(NASTY + "\n")  # one trailing newline is dropped: NASTY keeps its own
    runner = get_runner()
    role = Role("w", image=str(tmp_path), entrypoint=sys.executable, args=["-c", PROGRAM], num_replicas=2,
                max_retries=1, retry_policy=RetryPolicy.REPLICA, secrets=["NASTY:file:" + str(tmp_path / "nasty")])
    info = runner.dryrun(AppDef("sec", [role]), "local", cfg={"secrets": ["TOKEN:env:SRC"]})
    shown = str(info)
    assert "TOKEN=<secret>" in shown and "NASTY=<secret>" in shown
    handle = runner.schedule(info)
    status = runner.wait(handle, timeout=60)
    assert status is not None and status.state == AppState.SUCCEEDED, status
    seen = [line.split() for i in range(2) for line in runner.log_lines(handle, "w", i) if line.startswith("SEEN")]
    assert sorted((s[1], s[2]) for s in seen) == [("0", "0"), ("0", "1"), ("1", "0")]
    for s in seen:
        assert s[3:] == [_sha(CANARY), _sha(NASTY), "False"], s
    # nowhere tsm keeps or shows the app
    app_dir = next((tsm_home / "local").glob("sec-*"))
    assert not (app_dir / "secrets.json").exists()
    env = {**os.environ, "TSM_CLI_SERVER": "0"}
    cli = [subprocess.run([sys.executable, "-m", "tsm.cli.main", *args], capture_output=True, text=True, env=env, check=True).stdout
           for args in (["status", handle], ["status", "--json", handle], ["list"], ["describe", handle])]
    described = runner.describe(handle)
    for text in (_everything_under(tsm_home), shown, json.dumps(info.request, default=str), repr(described), *cli):
        assert CANARY not in text
        assert "$HOME`;" not in text
    assert "TOKEN:env:SRC" in cli[3] or "TOKEN" in repr(described)


def test_a_secret_without_a_value_fails_at_submit_and_leaves_nothing(tmp_path: Path, tsm_home: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TSM_NO_SUCH_VAR", raising=False)
    runner = get_runner()
    app = AppDef("sec", [Role("w", image=str(tmp_path), entrypoint=sys.executable, args=["-c", "pass"])])
    with pytest.raises(SecretError, match=r"secret X: \$TSM_NO_SUCH_VAR is not set"):
        runner.run(app, "local", cfg={"secrets": ["X:env:TSM_NO_SUCH_VAR"]})
    assert not list((tsm_home / "local").glob("sec-*")) if (tsm_home / "local").exists() else True
    assert runner.list("local") == []


def test_the_command_line_says_what_is_missing_in_one_line(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TSM_NO_SUCH_VAR"}
    out = subprocess.run([sys.executable, "-m", "tsm.cli.main", "run", "-s", "local", "-c", "secrets=TSM_NO_SUCH_VAR",
                          "utils.echo", "--msg", "hi"], capture_output=True, text=True, env=env)
    assert out.returncode == 1
    assert out.stderr.splitlines() == ["error: secret TSM_NO_SUCH_VAR: $TSM_NO_SUCH_VAR is not set in this "
                                       "environment; export it, or declare it as TSM_NO_SUCH_VAR:file:PATH"]


def test_what_local_cannot_deliver_is_refused_at_dry_run(tmp_path: Path) -> None:
    runner = get_runner()
    app = AppDef("sec", [Role("w", image=str(tmp_path), entrypoint=sys.executable, args=["-c", "pass"],
                              env={"A": "1"})])
    with pytest.raises(NotSupportedError, match="takes secrets from env or file, not k8s"):
        runner.dryrun(app, "local", cfg={"secrets": ["B:k8s:creds/b"]})
    with pytest.raises(InvalidAppError, match="A is both in env and a secret"):
        runner.dryrun(app, "local", cfg={"secrets": ["A"]})
