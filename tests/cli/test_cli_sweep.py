"""``tsm sweep``: bad input is one line and exit 2 with nothing submitted; a real sweep end to end.

The end-to-end test drives real ``tsm`` processes on the local scheduler (its own ``$TSM_HOME``); time limits
are hang guards only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tsm.cli.main import main
from tsm.store import tsm_home

TSM = [sys.executable, "-m", "tsm.cli.main"]
HANG = 180

COMPONENT = '''
import sys
from tsm import AppDef, Role


def train(lr: float = 0.1, batch: int = 32) -> AppDef:
    """A tiny training run: records its loss through the tracker."""
    code = (
        "from tsm.tracker import AppRun\\n"
        f"AppRun.run_from_env().add_metadata(loss=abs({lr} - 0.01) * 100 + 64 / {batch})\\n"
    )
    return AppDef(name="train", roles=[Role(name="trainer", image="", entrypoint=sys.executable, args=["-c", code])])
'''


@pytest.fixture
def comp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "train.py").write_text(COMPONENT)
    monkeypatch.chdir(tmp_path)
    return "train.py:train"


def _nothing_submitted() -> None:
    home = tsm_home()
    assert not (home / "sweeps").exists() or not any((home / "sweeps").rglob("state.db"))
    assert not (home / "local").exists() or not any((home / "local").iterdir())


@pytest.mark.parametrize("words,why", [
    (["--foo", "1,2"], "--foo is not a parameter of component"),
    (["--lr", ""], "empty"),
    (["--lr", "0.1,,0.2"], "empty value"),
    (["--random", "3", "--lr", "0.5:0.1"], "low end above"),
    (["--random", "3", "--lr", "log:0:0.1"], "above 0"),
    (["--lr", "0:0.5"], "add --random"),
    (["--parallel", "0", "--lr", "0.1"], "--parallel must be at least 1"),
    (["--parallel", "1001", "--lr", "0.1"], "at most 1,000"),
    (["--max-failures", "0", "--lr", "0.1"], "--max-failures must be at least 1"),
    (["--lr", ",".join(str(i) for i in range(400)), "--batch", ",".join(str(i) for i in range(1, 400))],
     "more than 100,000"),
    (["--random", "100001", "--lr", "0.1"], "more than 100,000"),
    (["--lr"], "needs values"),
    (["stray"], "expected --PARAM VALUES"),
    (["--lr", "0.1", "--lr", "0.2"], "given twice"),
    ([], "give the space"),
    (["--batch", "32,big"], "big"),  # a value its parameter cannot take
    (["--random", "3", "--batch", "big,32,64"], "big"),  # the first listed value too, in a random search
    (["--random", "2", "--batch", ",".join(str(i) for i in range(1, 400)) + ",big"], "big"),  # past the 200 called
])
def test_bad_input_is_one_line_exit_2_and_nothing_submitted(
    comp: str, words: list[str], why: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # options of tsm sweep go before COMPONENT, axes after it
    before: list[str] = []
    after: list[str] = []
    i = 0
    while i < len(words):
        if words[i] in ("--parallel", "--random", "--max-failures"):
            before += words[i : i + 2]
            i += 2
        else:
            after.append(words[i])
            i += 1
    code = main(["sweep", *before, comp, *after])
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    lines = [line for line in err.splitlines() if line.startswith("error:") or "error:" in line]
    assert len(lines) == 1 and why in lines[0], err
    assert "Traceback" not in err
    _nothing_submitted()


@pytest.mark.parametrize("handle", ["sweep://", "sweep://default/../x", "local://default/x", "nonsense"])
def test_malformed_or_unknown_handles_exit_2(handle: str, capsys: pytest.CaptureFixture[str]) -> None:
    for verb in ("status", "wait", "cancel", "show", "resume"):
        assert main(["sweep", verb, handle]) == 2
        assert "not a sweep handle" in capsys.readouterr().err
    assert main(["sweep", "status", "sweep://default/never-00000000"]) == 2
    assert "unknown sweep" in capsys.readouterr().err


def test_dryrun_prints_every_trial_and_the_first_request(comp: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sweep", "--dryrun", "--random", "4", "--seed", "1", comp, "--lr", "log:1e-4:1e-1",
                 "--batch", "32,64"]) == 0
    out = capsys.readouterr().out
    assert "4 trial(s) on local" in out
    assert out.count("  trial ") == 4
    assert "=== scheduler request (local) ===" in out and "add_metadata" in out
    again = main(["sweep", "--dryrun", "--random", "4", "--seed", "1", comp, "--lr", "log:1e-4:1e-1",
                  "--batch", "32,64"])
    assert again == 0
    out2 = capsys.readouterr().out
    trials = [line for line in out.splitlines() if line.startswith("  trial ")]
    assert trials == [line for line in out2.splitlines() if line.startswith("  trial ")]  # seeded
    _nothing_submitted()


def _tsm(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*TSM, *args], capture_output=True, text=True, timeout=HANG, stdin=subprocess.DEVNULL,
                          cwd=cwd, env=dict(os.environ))


def test_sweep_end_to_end_show_sorted_and_list_folds_it(comp: str, tmp_path: Path) -> None:
    started = _tsm("sweep", "--parallel", "2", "--metric", "loss", comp, "--lr", "0.1,0.01", "--batch", "32,64",
                   cwd=tmp_path)
    assert started.returncode == 0, started.stderr
    handle = started.stdout.strip()
    assert handle.startswith("sweep://default/train-")
    waited = _tsm("sweep", "wait", handle, cwd=tmp_path)
    assert waited.returncode == 0, waited.stdout + waited.stderr
    assert "SUCCEEDED (4 trials: 4 succeeded)" in waited.stdout
    shown = _tsm("sweep", "show", handle, cwd=tmp_path)
    lines = shown.stdout.splitlines()
    assert lines[0].split() == ["TRIAL", "lr", "batch", "STATE", "DURATION", "loss", "HANDLE"]
    losses = [float(line.split()[5]) for line in lines[1:]]
    assert losses == sorted(losses) and len(losses) == 4
    assert lines[1].split()[1:3] == ["0.01", "64"]  # the best trial first
    best_last = _tsm("sweep", "show", handle, "--sort=-loss", "--json", cwd=tmp_path)
    rows = json.loads(best_last.stdout)
    assert [r["params"] for r in rows][0] == {"lr": 0.1, "batch": 32}  # typed as the component takes them
    assert all(r["state"] == "SUCCEEDED" and r["handle"].startswith("local://") for r in rows)
    listed = _tsm("list", cwd=tmp_path).stdout
    assert listed.count(handle) == 1 and "4 trials: 4 succeeded" in listed
    assert "local://" not in listed  # the trials are folded into the sweep's line
    status = _tsm("sweep", "status", handle, cwd=tmp_path)
    assert status.returncode == 0 and "SUCCEEDED" in status.stdout
    # a trial is an ordinary app
    trial = rows[0]["handle"]
    assert _tsm("status", trial, cwd=tmp_path).returncode == 0


def _call(argv: list[str]) -> tuple[int, str]:
    import io

    out, err = io.StringIO(), io.StringIO()
    old = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = out, err
    try:
        code = main(argv)
    except SystemExit as e:  # argparse: --help and usage errors
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    finally:
        sys.stdout, sys.stderr = old
    return code, err.getvalue()


def test_hostile_values_in_every_sweep_slot_are_one_line_and_submit_nothing(comp: str) -> None:
    from cli.test_cli_fuzz import HOSTILE

    templates = [
        ["sweep", "--dryrun", comp, "--lr", "{}"],
        ["sweep", "--dryrun", "--random", "2", comp, "--lr", "{}"],
        ["sweep", "--dryrun", "--random", "{}", comp, "--lr", "0:1"],
        ["sweep", "--dryrun", "--parallel", "{}", comp, "--lr", "0.1"],
        ["sweep", "--dryrun", comp, "--{}", "0.1"],
        ["sweep", "--dryrun", comp, "--lr", "0.1", "--", "{}"],
        ["sweep", "status", "{}"],
        ["sweep", "show", "{}"],
        ["sweep", "resume", "{}"],
        ["sweep", "wait", "--timeout", "{}", "sweep://default/x-00000000"],
    ]
    failures = []
    for template in templates:
        for value in HOSTILE:
            argv = [w.replace("{}", value) for w in template]
            code, err = _call(argv)
            errors = [line for line in err.splitlines() if line.startswith(("error", "tsm"))]
            if code not in (0, 2) or "Traceback" in err or "internal error" in err or len(errors) > 1:
                failures.append(f"{argv!r}: exit {code}: {err[-300:]!r}")
    assert not failures, "\n".join(failures[:20])
    _nothing_submitted()


ESCAPES = "\x1b[2J\x1b]0;owned\x07\r"

RECORDS_ESCAPES = '''
import sys
from tsm import AppDef, Role

CODE = """
from tsm.tracker import AppRun
esc = chr(27) + "[2J" + chr(27) + "]0;owned" + chr(7) + chr(13)
AppRun.run_from_env().add_metadata(**{esc + "loss": "x" + esc})
"""


def train(lr: float = 0.1) -> AppDef:
    """Records a metric whose name and value hold terminal escape sequences."""
    return AppDef(name="train", roles=[Role(name="trainer", image="", entrypoint=sys.executable, args=["-c", CODE])])
'''


@pytest.mark.reliability(
    "escape codes a sweep's trials recorded never reach the terminal",
    expect="metric names and values with ESC/BEL/CR print escaped in tsm sweep show (--json keeps them as recorded)",
    group="Hostile input",
)
def test_sweep_show_escapes_what_trials_recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "esc.py").write_text(RECORDS_ESCAPES)
    monkeypatch.chdir(tmp_path)
    started = _tsm("sweep", "esc.py:train", "--lr", "0.1", cwd=tmp_path)
    assert started.returncode == 0, started.stderr
    handle = started.stdout.strip()
    assert _tsm("sweep", "wait", handle, cwd=tmp_path).returncode == 0
    shown = _tsm("sweep", "show", handle, cwd=tmp_path).stdout
    assert "loss" in shown and "\\x1b[2J" in shown, shown
    assert not any(c in shown for c in "\x1b\x07\r"), repr(shown)
    rows = json.loads(_tsm("sweep", "show", handle, "--json", cwd=tmp_path).stdout)
    assert rows[0]["metrics"] == {ESCAPES + "loss": "x" + ESCAPES}  # --json keeps the data as recorded
