"""submitit 1.5.4's own unit tests, unchanged, through the alias (upstream.py): every applicable test passes."""

from __future__ import annotations

import pytest
from submitit_upstream import NOT_APPLICABLE, main

pytestmark = pytest.mark.integration


def test_submitits_own_tests_pass_on_tsm(capsys: pytest.CaptureFixture[str]) -> None:
    status = main([])
    out = capsys.readouterr().out
    assert status == 0, out[-20000:]
    assert "0 failed" in out.splitlines()[-1]
    assert all(reason for reason in NOT_APPLICABLE.values())
