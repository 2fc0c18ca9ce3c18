"""The ``torchx`` command on tsm, run as TorchX users' scripts run it: through the alias
(``python -m tsm.torchx_alias -m torchx.cli.main``) and as the console script's entry point, on the local
schedulers, checking the words scripts parse and TorchX's exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ALIAS = [sys.executable, "-m", "tsm.torchx_alias", "-m", "torchx.cli.main"]
SCRIPT = [sys.executable, "-c", "from tsm.compat.torchx.cli.main import entry; entry()"]


def torchx(*args: str, cwd: Path, stdin: str | None = None, cmd: list[str] = ALIAS,
           env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*cmd, *args], cwd=cwd, capture_output=True, text=True, timeout=180, input=stdin,
                          env={**os.environ, **(env or {})})


def test_run_echo_on_local_prints_the_handle_then_status_log_describe_list_see_it(tmp_path: Path) -> None:
    run = torchx("run", "-s", "local", "utils.echo", "--msg", "hello torchx", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    handle = run.stdout.strip()
    assert handle.startswith("local://torchx/echo-"), run.stdout
    assert "Waiting for the app to finish..." in run.stderr and "Job finished: SUCCEEDED" in run.stderr
    assert "echo/0 hello torchx" in run.stderr  # a local run streams the logs to stderr, as TorchX's does

    status = torchx("status", handle, cwd=tmp_path)
    assert status.returncode == 0 and "State: SUCCEEDED" in status.stdout and "*echo[0]:SUCCEEDED" in status.stdout
    log = torchx("log", handle, cwd=tmp_path)
    assert (log.returncode, log.stdout) == (0, "echo/0 hello torchx\n")
    one = torchx("log", f"{handle}/echo/0", cwd=tmp_path)
    assert one.stdout == "echo/0 hello torchx\n"
    described = torchx("describe", handle, cwd=tmp_path)
    assert described.returncode == 0 and "'name': 'echo'" in described.stdout
    listed = torchx("list", "-s", "local", cwd=tmp_path).stdout.splitlines()
    assert listed[0].split() == ["APP", "HANDLE", "APP", "STATUS"] and set(listed[1]) == {"-", " "}
    assert any(line.split() == [handle, "SUCCEEDED"] for line in listed[2:]), listed


def test_status_json_has_torchxs_keys(tmp_path: Path) -> None:
    handle = torchx("run", "-s", "local_cwd", "utils.echo", cwd=tmp_path).stdout.strip()
    out = torchx("status", "--json", handle, cwd=tmp_path)
    data = json.loads(out.stdout)
    assert list(data) == ["state", "num_restarts", "roles", "msg", "structured_error_msg", "url"]
    assert data["state"] == "SUCCEEDED" and data["roles"][0]["role"] == "echo"
    replica = data["roles"][0]["replicas"][0]
    assert {"id", "state", "role", "hostname", "structured_error_msg"} <= set(replica) and replica["state"] == 4


def test_a_failed_app_exits_1_with_its_status(tmp_path: Path) -> None:
    run = torchx("run", "-s", "local_cwd", "utils.sh", "exit 3", cwd=tmp_path)
    assert run.returncode == 1
    assert "Job finished: FAILED" in run.stderr and "AppStatus:" in run.stderr


def test_unknown_app_component_and_identifier_exit_1_with_torchxs_words(tmp_path: Path) -> None:
    status = torchx("status", "local://torchx/nope-1", cwd=tmp_path)
    assert status.returncode == 1
    assert "AppDef: nope-1, does not exist or has been removed from local's data plane" in status.stderr
    comp = torchx("run", "-s", "local", "no.such", cwd=tmp_path)
    assert comp.returncode == 1 and "Failed to run component `no.such` got errors" in comp.stderr
    bad = torchx("log", "not-a-handle", cwd=tmp_path)
    assert bad.returncode == 1 and "is not of the form SCHEDULER://" in bad.stderr
    assert "Traceback" not in status.stderr + comp.stderr + bad.stderr


def test_usage_errors_exit_2_and_no_subcommand_exits_1(tmp_path: Path) -> None:
    assert torchx("run", "-s", "nosuch", "utils.echo", cwd=tmp_path).returncode == 2
    twice = torchx("run", "-cfg", "a=1", "-cfg", "b=2", "utils.echo", cwd=tmp_path)
    assert twice.returncode == 1 and "-cfg is specified more than once" in twice.stderr
    bare = torchx(cwd=tmp_path)
    assert bare.returncode == 1 and "usage: torchx" in bare.stdout


def test_a_bad_run_option_is_torchxs_message_and_exit_1(tmp_path: Path) -> None:
    run = torchx("run", "-s", "local", "-cfg", "prepend_cwd=maybe", "utils.echo", cwd=tmp_path)
    assert run.returncode == 1 and run.stdout == ""
    assert run.stderr.startswith("Invalid scheduler configuration: ") and "`torchx runopts local`" in run.stderr
    wrong = torchx("run", "-s", "local", "--dryrun", "utils.echo", "--msg", cwd=tmp_path)
    assert wrong.returncode == 2 and "--msg" in wrong.stderr  # the component's own argparse, as TorchX's


def test_runopts_prints_torchxs_usage_layout(tmp_path: Path) -> None:
    out = torchx("runopts", "local", cwd=tmp_path).stdout
    assert out.startswith("local:\n    usage:\n        [")
    usage = out.split("\n")[2]
    assert "[time_limit=TIME_LIMIT]," in usage and "[environment=ENVIRONMENT]," in usage
    assert "\n    optional arguments:\n        " in out and "\n        time_limit=TIME_LIMIT (str, None)\n            " in out


def test_dryrun_prints_the_application_and_the_request(tmp_path: Path) -> None:
    out = torchx("run", "-s", "local", "--dryrun", "utils.echo", "--msg", "dry", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "=== APPLICATION ===" in out.stdout and "=== SCHEDULER REQUEST ===" in out.stdout
    assert "'args': ['dry']" in out.stdout


def test_stdin_reads_the_run_as_json_and_refuses_other_flags(tmp_path: Path) -> None:
    spec = {"component_name": "utils.echo", "scheduler": "local", "scheduler_args": {},
            "component_args": {"msg": "from json"}}
    run = torchx("run", "--stdin", cwd=tmp_path, stdin=json.dumps(spec))
    assert run.returncode == 0, run.stderr
    assert "echo/0 from json" in run.stderr
    both = torchx("run", "--stdin", "--dryrun", cwd=tmp_path, stdin=json.dumps(spec))
    assert both.returncode == 2 and "Cannot specify --dryrun when using --stdin" in both.stderr
    junk = torchx("run", "--stdin", cwd=tmp_path, stdin="[1, 2]")
    assert junk.returncode == 1 and "Expected a dictionary" in junk.stderr


def test_builtins_runopts_and_configure(tmp_path: Path) -> None:
    found = torchx("builtins", cwd=tmp_path).stdout.splitlines()
    assert found[0].startswith("Found ") and any(line.endswith(". utils.echo") for line in found)
    assert torchx("configure", "-s", "local", cwd=tmp_path).returncode == 0
    assert (tmp_path / ".torchxconfig").is_file()


def test_torchxconfig_sets_runs_default_scheduler(tmp_path: Path) -> None:
    (tmp_path / ".torchxconfig").write_text("[cli:run]\nscheduler = local\ncomponent = utils.echo\n")
    run = torchx("run", "--", "--msg", "configured", cwd=tmp_path, env={"HOME": str(tmp_path)})
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("local://torchx/echo-") and "echo/0 configured" in run.stderr


def test_console_script_runs_and_refuses_over_a_real_torchx(tmp_path: Path) -> None:
    run = torchx("run", "-s", "local", "utils.echo", "--msg", "script", cwd=tmp_path, cmd=SCRIPT)
    assert run.returncode == 0 and "echo/0 script" in run.stderr, run.stderr
    fake = tmp_path / "site" / "torchx"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    refused = torchx("--version", cwd=tmp_path, cmd=SCRIPT, env={"PYTHONPATH": str(tmp_path / "site")})
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.count("\n") == 1 and "the real torchx is installed" in refused.stderr


@pytest.mark.parametrize("cmd", [ALIAS, SCRIPT])
def test_version_names_torchx_and_tsm(cmd: list[str], tmp_path: Path) -> None:
    out = torchx("--version", cwd=tmp_path, cmd=cmd)
    assert out.returncode == 0 and out.stdout.startswith("torchx-0.7.0 (tsm ")


def test_wait_log_and_tee_logs_are_taken(tmp_path: Path) -> None:
    run = torchx("run", "-s", "local", "--wait", "--log", "--tee_logs", "utils.echo", "--msg", "teed", cwd=tmp_path)
    assert run.returncode == 0 and "echo/0 teed" in run.stderr, run.stderr


def test_cancel_ends_a_running_app(tmp_path: Path) -> None:
    import subprocess as sp

    proc = sp.Popen([*ALIAS, "run", "-s", "local", "utils.sh", "sleep 600"], cwd=tmp_path, stdout=sp.PIPE,
                    stderr=sp.DEVNULL, text=True)
    assert proc.stdout is not None
    handle = proc.stdout.readline().strip()
    assert torchx("cancel", handle, cwd=tmp_path).returncode == 0
    assert proc.wait(timeout=120) == 1  # the waiting run sees its app end CANCELLED: exit 1
    assert "State: CANCELLED" in torchx("status", handle, cwd=tmp_path).stdout
    assert torchx("cancel", handle, cwd=tmp_path).returncode == 0  # again: a no-op


def test_tracker_without_a_tracker_says_so(tmp_path: Path) -> None:
    out = torchx("tracker", "list", "jobs", cwd=tmp_path, env={"HOME": str(tmp_path), "TORCHX_TRACKERS": ""})
    assert out.returncode == 1 and "No trackers configured." in out.stderr


def test_a_plugin_subcommand_runs(capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    from tsm.compat.torchx.cli.cmd_base import SubCommand
    from tsm.compat.torchx.cli.main import get_default_sub_cmds, run_main

    class Hello(SubCommand):
        def add_arguments(self, subparser: argparse.ArgumentParser) -> None:
            subparser.add_argument("--who", default="world")

        def run(self, args: argparse.Namespace) -> None:
            print(f"hello {args.who}")

    run_main({**get_default_sub_cmds(), "hello": Hello()}, ["hello", "--who", "plugin"])
    assert capsys.readouterr().out == "hello plugin\n"


def test_the_opt_in_distribution_installs_a_torchx_script(tmp_path: Path) -> None:
    import shutil

    source = tmp_path / "src"
    shutil.copytree(Path(__file__).parents[3] / "packaging" / "tsm-torchx-cli", source)
    target = tmp_path / "target"
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                          "--target", str(target), str(source)], capture_output=True, text=True, timeout=300)
    assert pip.returncode == 0, pip.stderr
    script = target / "bin" / "torchx"
    run = torchx("run", "-s", "local", "utils.echo", "--msg", "installed", cwd=tmp_path,
                 cmd=[sys.executable, str(script)])
    assert run.returncode == 0 and "echo/0 installed" in run.stderr, run.stderr
