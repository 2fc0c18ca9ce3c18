"""The dashboard's static page, read as files: one module script from this origin, no inline script, handler or
style (the CSP forbids them anyway), no HTML parsed from data, every module it imports shipped beside it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

STATIC = Path(__file__).resolve().parents[2] / "src" / "tsm" / "views" / "web" / "static"


def scripts() -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(STATIC.glob("*.js"))}


def test_the_page_loads_one_module_and_nothing_inline() -> None:
    html = (STATIC / "index.html").read_text()
    assert re.findall(r"<script[^>]*>", html) == ['<script type="module" src="static/app.js">']
    assert not re.search(r"\son[a-z]+\s*=|style\s*=", html, re.IGNORECASE)  # no inline handlers or styles
    assert not re.search(r"(src|href)\s*=\s*\"(https?:)?//", html)  # nothing from another origin
    assert sorted(p.name for p in STATIC.iterdir()) == sorted(["index.html", "app.css", *scripts()])


@pytest.mark.parametrize("name", sorted(scripts()))
def test_no_script_parses_data_as_html_or_code(name: str) -> None:
    js = scripts()[name]
    for banned in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function",
                   "setAttribute(\"style\"", "http://", "https://"):
        assert banned not in js, f"{name} uses {banned}"


def test_every_import_is_a_module_shipped_beside_it() -> None:
    names = scripts()
    for name, js in names.items():
        for target in re.findall(r"^import .* from \"\./([^\"]+)\";$", js, re.MULTILINE):
            assert target in names, f"{name} imports {target}, which is not in static/"
        assert not re.search(r"^import .* from \"(?!\./)", js, re.MULTILINE), f"{name} imports from elsewhere"
