"""Tests for tsm.errors: the error tree drawn in the module docstring is the real class tree."""

from __future__ import annotations

import inspect
import re

import pytest

import tsm.errors as errors
from tsm.errors import ComponentArgumentError, TsmError, brief, did_you_mean


def _docstring_tree() -> list[tuple[str, str | None]]:
    """(class, parent) for every class drawn in the module docstring's tree, in drawing order."""
    doc = errors.__doc__ or ""
    rows: list[tuple[int, str]] = []
    for line in doc.splitlines():
        m = re.match(r"^(?P<indent>[ │├└─]*)(?P<name>[A-Z][A-Za-z]*Error)\b", line)
        if not m or not line.startswith("    "):
            continue
        depth = len(m.group("indent"))
        rows.append((depth, m.group("name")))
    out: list[tuple[str, str | None]] = []
    stack: list[tuple[int, str]] = []
    for depth, name in rows:
        while stack and stack[-1][0] >= depth:
            stack.pop()
        out.append((name, stack[-1][1] if stack else None))
        stack.append((depth, name))
    return out


TREE = _docstring_tree()


def test_docstring_tree_was_parsed() -> None:
    assert TREE[0] == ("TsmError", None)
    assert len(TREE) >= 15
    assert ("ConfigError", "InvalidRunOptionError") in TREE
    assert ("SubmissionError", "SchedulerError") in TREE
    assert ("ComponentArgumentError", "ComponentError") in TREE


@pytest.mark.parametrize(("name", "parent"), TREE)
def test_docstring_class_exists_and_subclasses_as_drawn(name: str, parent: str | None) -> None:
    cls = getattr(errors, name, None)
    assert inspect.isclass(cls), f"{name} is drawn in the docstring but tsm.errors has no such class"
    assert issubclass(cls, Exception)
    if parent is None:
        assert cls is TsmError
        return
    parent_cls = getattr(errors, parent)
    # drawn under ``parent``: its nearest tsm ancestor is exactly that class
    tsm_bases = [b for b in cls.__bases__ if issubclass(b, TsmError)]
    assert tsm_bases == [parent_cls], f"{name} is drawn under {parent} but derives from {tsm_bases}"


def test_every_error_class_is_in_the_docstring() -> None:
    drawn = {name for name, _ in TREE}
    defined = {
        name
        for name, obj in vars(errors).items()
        if inspect.isclass(obj) and issubclass(obj, TsmError) and obj.__module__ == errors.__name__
    }
    assert defined == drawn
    assert len(drawn) == len(TREE)  # nothing drawn twice


@pytest.mark.parametrize(
    ("name", "builtin"),
    [
        ("InvalidAppError", ValueError),
        ("InvalidRunOptionError", ValueError),
        ("ConfigError", ValueError),
        ("MalformedAppHandleError", ValueError),
        ("UnknownAppError", LookupError),
        ("UnknownSchedulerError", LookupError),
        ("UnknownResourceError", LookupError),
        ("ComponentNotFoundError", LookupError),
        ("ComponentImportError", ImportError),
        ("ComponentArgumentError", ValueError),
        ("StoreError", OSError),
    ],
)
def test_builtin_bases_let_plain_handlers_catch(name: str, builtin: type[Exception]) -> None:
    cls = getattr(errors, name)
    assert issubclass(cls, builtin)
    with pytest.raises(builtin):
        raise cls("x")


def test_every_class_has_a_docstring_and_message() -> None:
    for name, _ in TREE:
        cls = getattr(errors, name)
        assert cls.__doc__ and cls.__doc__.strip()
        if cls in (ComponentArgumentError, errors.AppStatusError):  # their first argument is not the message
            continue
        assert str(cls("what to fix")) == "what to fix"


def test_component_argument_error_carries_usage() -> None:
    e = ComponentArgumentError("bad -j", usage="usage: dist.ddp [-j J]")
    assert str(e) == "bad -j"
    assert e.usage == "usage: dist.ddp [-j J]"
    assert ComponentArgumentError("m").usage == ""


def test_store_error_is_an_os_error_with_a_message() -> None:
    e = errors.StoreError("disk full")
    assert str(e) == "disk full"


# -- did_you_mean -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "choices", "expected"),
    [
        ("grace_perod", ["grace_period", "log_dir"], " (did you mean 'grace_period'?)"),
        ("lcoal", ["local", "slurm", "kubernetes"], " (did you mean 'local'?)"),
        ("zzz", ["local", "slurm"], ""),
        ("x", [], ""),
        ("", ["a"], ""),
        ("gpu.smal", iter(["gpu.small", "gpu.medium"]), " (did you mean 'gpu.small'?)"),
        ("local", ["local"], " (did you mean 'local'?)"),
    ],
)
def test_did_you_mean(name: str, choices: object, expected: str) -> None:
    assert did_you_mean(name, choices) == expected  # type: ignore[arg-type]


def test_did_you_mean_picks_the_closest() -> None:
    assert did_you_mean("slurmm", ["slum", "slurm", "local"]) == " (did you mean 'slurm'?)"


def test_did_you_mean_accepts_dict_keys() -> None:
    assert did_you_mean("cpu.smal", {"cpu.small": 1, "x": 2}) == " (did you mean 'cpu.small'?)"


# -- brief -------------------------------------------------------------------------------------------------
def test_brief_keeps_short_values_and_cuts_long_ones() -> None:
    assert brief("a\nb") == "'a\\nb'"
    long = "x" * 500
    cut = brief(long)
    assert cut.endswith("...' (500 characters)") and len(cut) < 80
    assert brief(list(range(100))).endswith("...") and len(brief(list(range(100)))) == 80
    assert len(brief(long, 120)) > len(cut)


def test_brief_of_an_int_too_long_to_print() -> None:
    import sys

    limit = sys.get_int_max_str_digits()
    if not limit:
        return
    assert brief(10 ** (limit + 1)) == "<int>"


# -- what every error carries --------------------------------------------------------------------------
def test_errors_carry_handle_and_scheduler() -> None:
    e = errors.UnknownAppError("gone", handle="local://s/a", scheduler="local")
    assert (str(e), e.handle, e.scheduler) == ("gone", "local://s/a", "local")
    plain = errors.InvalidAppError("bad")
    assert plain.handle is None and plain.scheduler is None
    store = errors.StoreError("disk full", scheduler="local")  # an OSError too: keywords still work
    assert store.scheduler == "local" and isinstance(store, OSError)
    usage = ComponentArgumentError("bad -j", usage="u", handle="h")
    assert usage.handle == "h" and usage.usage == "u"


def test_usage_error_lives_in_errors_and_its_old_import_still_works() -> None:
    from tsm.cli._common import UsageError as old

    assert old is errors.UsageError and issubclass(old, TsmError)


def test_app_still_running_error_is_a_scheduler_error() -> None:
    e = errors.AppStillRunningError("local://s/a is still RUNNING; cancel it first", handle="local://s/a")
    assert isinstance(e, errors.SchedulerError) and e.handle == "local://s/a"


def test_app_status_error_carries_the_status() -> None:
    from tsm.specs import AppState, AppStatus

    status = AppStatus(AppState.FAILED)
    e = errors.AppStatusError(status)
    assert e.status is status and "FAILED" in str(e)
    assert str(errors.AppStatusError(status, "custom")) == "custom"


def test_not_supported_error_is_a_not_implemented_error() -> None:
    assert issubclass(errors.NotSupportedError, NotImplementedError)


def test_unknown_resource_error_is_a_key_error_with_a_plain_message() -> None:
    e = errors.UnknownResourceError("unknown named resource 'x'")
    assert isinstance(e, KeyError) and str(e) == "unknown named resource 'x'"
