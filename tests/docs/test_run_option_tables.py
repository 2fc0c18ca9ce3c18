"""Each scheduler's run options are documented once, by the code (issue 38: one source per manual): its page holds
the marker ``docs/hooks.py`` replaces with the table of what the scheduler declares, as ``tsm runopts`` prints it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from tsm.cli.reference import run_options
from tsm.runner.api import Runner
from tsm.schedulers import scheduler_names

ROOT = Path(__file__).resolve().parents[2]


def _hooks() -> object:
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_scheduler_page_holds_the_table_of_the_options_it_declares() -> None:
    hooks = _hooks()
    for name in scheduler_names(aliases=False):
        page = ROOT / "docs" / "schedulers" / f"{name}.md"
        text = page.read_text()
        assert f"<!-- run-options: {name} -->" in text, f"{page.name} has no generated option table"
        rendered = hooks.on_page_markdown(text, page=None)  # type: ignore[attr-defined]
        with Runner("docs") as runner:
            declared = [opt for opt, _ in runner.scheduler_run_opts(name)]
        assert declared and all(f"| `{opt}` |" in rendered for opt in declared)
        assert "<!-- run-options:" not in rendered


def test_a_table_escapes_what_markdown_would_read_as_a_cell() -> None:
    import re

    for name in scheduler_names(aliases=False):  # help texts name choices as a|b|c
        for line in run_options(name).splitlines():
            assert len(re.split(r"(?<!\\)\|", line)) == 6, line
