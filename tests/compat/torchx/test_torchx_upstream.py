"""The harness that runs TorchX's own tests (``upstream.py``): what it counts, and its time limit per test."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import upstream  # noqa: E402

FAKE = '''
import time
import unittest

import torchx.specs


class FakeTest(unittest.TestCase):
    def test_passes(self):
        self.assertEqual(torchx.specs.AppDef.__module__, "tsm.specs.api")

    def test_fails(self):
        self.fail("on purpose")

    def test_hangs(self):
        time.sleep(600)

    def test_listed_and_failing(self):
        raise RuntimeError("not applicable")

    def test_listed_but_passing(self):
        pass
'''


@pytest.fixture
def tests(tmp_path: Path) -> Path:
    folder = tmp_path / "upstream" / "torchx" / "specs" / "test"
    folder.mkdir(parents=True)
    (folder / "__init__.py").write_text("")
    (folder / "fake_test.py").write_text(textwrap.dedent(FAKE))
    return tmp_path / "upstream"


def test_counts_each_verdict_and_a_hung_test_fails_alone(
    tests: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(upstream, "NOT_APPLICABLE", {
        "specs.test.fake_test:FakeTest.test_listed_and_failing": "a reason",
        "specs.test.fake_test:FakeTest.test_listed_but_passing": "a reason gone stale",
    })
    rc = upstream.main(["--tests", str(tests), "--timeout", "3", "--module", "specs.test.fake_test"])
    out = capsys.readouterr().out
    assert rc == 1
    assert "on purpose" in out and "longer than its 3 s limit" in out
    assert "listed as not applicable but it passes" in out and "test_listed_but_passing" in out
    # a stale entry counts as a failure: pass, fail, hang and the stale one; one truly not applicable
    assert out.rstrip().endswith("TorchX 0.7.0's own tests: 1 passed, 3 failed, 1 not applicable")


def test_a_missing_folder_is_a_skip_line_or_under_ci_a_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("CI", raising=False)
    assert upstream.main(["--tests", str(tmp_path / "nowhere")]) == 0
    assert "skipped: no test folder" in capsys.readouterr().out
    monkeypatch.setenv("CI", "true")
    assert upstream.main(["--tests", str(tmp_path / "nowhere")]) == 1
    assert "FAILED: no test folder" in capsys.readouterr().out


def test_the_not_applicable_list_is_short_and_every_entry_names_a_reference_test() -> None:
    assert len(upstream.NOT_APPLICABLE) <= 20
    for test, reason in upstream.NOT_APPLICABLE.items():
        module, _, name = test.partition(":")
        assert module in upstream.MODULES and "." in name and reason, test
