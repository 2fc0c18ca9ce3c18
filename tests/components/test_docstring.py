"""parse_docstring: the description and the per-argument help of a Google-style docstring."""

from __future__ import annotations

from tsm.components.docstring import parse_docstring

DOC = """Launch a script.

    More text that
    spans lines.

    Args:
        script: the script
        j (str): nodes times processes,
            continued here
        *args: passed through
        **kwargs: ignored by components
        weird_name (Optional[str], optional): typed in the docstring too

    Returns:
        the app

    Raises:
        ValueError: not an argument
    """


def test_description_is_everything_before_the_first_section() -> None:
    doc = parse_docstring(DOC)
    assert doc.description == "Launch a script.\n\nMore text that\nspans lines."
    assert doc.summary == "Launch a script."


def test_args_with_types_continuations_and_stars() -> None:
    assert parse_docstring(DOC).args == {
        "script": "the script",
        "j": "nodes times processes, continued here",
        "args": "passed through",
        "kwargs": "ignored by components",
        "weird_name": "typed in the docstring too",
    }


def test_other_sections_are_not_arguments() -> None:
    assert "ValueError" not in parse_docstring(DOC).args


def test_no_docstring() -> None:
    doc = parse_docstring(None)
    assert (doc.description, doc.args, doc.summary) == ("", {}, "")


def test_one_line_docstring() -> None:
    doc = parse_docstring("Just this.")
    assert (doc.description, doc.args) == ("Just this.", {})


def test_text_back_at_the_margin_ends_the_argument_list() -> None:
    doc = parse_docstring("Summary.\n\nArgs:\n    a: first\nNot an arg: really\n    b: after\n")
    assert doc.args == {"a": "first"}
    assert doc.description == "Summary."


def test_arguments_alias_section() -> None:
    assert parse_docstring("S.\n\nArguments:\n    x: an x\n").args == {"x": "an x"}
