"""materialize / component_help: how a typed signature becomes a command line, and every way it refuses one."""

from __future__ import annotations

import json
from typing import Any, Dict, List, Optional  # noqa: UP035 (TorchX components use these spellings)

import pytest

from tsm.components import component_help, materialize, wants_help
from tsm.components.cmdline import ParamType, param_type, parse_value
from tsm.errors import ComponentArgumentError, ComponentError
from tsm.specs.api import AppDef, Role


def _app(*args: str, **values: Any) -> AppDef:
    """An AppDef that carries what the component was called with, for the test to read back."""
    payload = json.dumps({"args": list(args), **values})
    return AppDef("t", roles=[Role("r", entrypoint="true", args=[payload])])


def called(app: AppDef) -> dict[str, Any]:
    return json.loads(app.roles[0].args[0])  # type: ignore[no-any-return]


def typed(
    name: str,
    count: int,
    ratio: float,
    flag: bool,
    tags: list[str],
    env: dict[str, str],
) -> AppDef:
    """Every supported type, all required.

    Args:
        name: a string
        count: an int
        ratio: a float
        flag: a bool
        tags: a list
        env: a dict
    """
    return _app(name=name, count=count, ratio=ratio, flag=flag, tags=tags, env=env)


def optionals(
    a: Optional[str] = None,  # noqa: UP045 (both spellings must work)
    b: int | None = None,
    c: Optional[list[str]] = None,  # noqa: UP045
    d: dict[str, str] | None = None,
    e: bool | None = None,
    f: float | None = None,
) -> AppDef:
    """Optional parameters, single-letter names."""
    return _app(a=a, b=b, c=c, d=d, e=e, f=f)


def with_defaults(
    msg: str = "hello", num_replicas: int = 1, verbose: bool = False, tags: list[str] | None = None
) -> AppDef:
    """Parameters with defaults.

    Args:
        msg: the message, 100% literal
        num_replicas: how many
        verbose: talk more
        tags: some tags
    """
    return _app(msg=msg, num_replicas=num_replicas, verbose=verbose, tags=tags)


def varargs(*args: str, prefix: str = "", n: int = 1) -> AppDef:
    """Takes a trailing argument list.

    Args:
        *args: the words
        prefix: put before
        n: a number
    """
    return _app(*args, prefix=prefix, n=n)


def positional_then_varargs(first: str, *rest: str) -> AppDef:
    """A positional-or-keyword parameter before *rest (must be passed positionally)."""
    return _app(*rest, first=first)


# -- types ---------------------------------------------------------------------------------------------
def test_every_type_converts() -> None:
    app = materialize(
        typed,
        ["--name", "x y", "--count", "3", "--ratio", "0.5", "--flag", "--tags", "a,b", "--env", "K=v,K2=w=1"],
    )
    assert called(app) == {
        "args": [],
        "name": "x y",
        "count": 3,
        "ratio": 0.5,
        "flag": True,
        "tags": ["a", "b"],
        "env": {"K": "v", "K2": "w=1"},
    }


def test_bool_negation_sets_false() -> None:
    argv = ["--name", "x", "--count", "1", "--ratio", "1", "--no-flag", "--tags", "", "--env", ""]
    assert called(materialize(typed, argv)) == {
        "args": [],
        "name": "x",
        "count": 1,
        "ratio": 1.0,
        "flag": False,
        "tags": [],
        "env": {},
    }


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--verbose"], True),
        (["--verbose", "True"], True),  # TorchX's spelling
        (["--verbose", "False"], False),
        (["--verbose", "false"], False),
        (["--verbose=no"], False),
        (["--verbose=TRUE"], True),
        (["--no-verbose"], False),
        (["--verbose", "False", "--msg", "m"], False),
    ],
)
def test_bool_takes_true_false_or_no_value(argv: list[str], expected: bool) -> None:
    assert called(materialize(with_defaults, argv))["verbose"] is expected


def test_a_word_after_a_bare_bool_flag_is_not_its_value() -> None:
    def flagged(*args: str, debug: bool = False) -> AppDef:
        """A flag before a pass-through list."""
        return _app(*args, debug=debug)

    assert called(materialize(flagged, ["--debug", "train.py", "x"])) == {
        "args": ["train.py", "x"],
        "debug": True,
    }
    assert called(materialize(flagged, ["--debug", "False", "true"])) == {"args": ["true"], "debug": False}


def test_negated_bool_takes_no_value() -> None:
    with pytest.raises(ComponentArgumentError, match="argument --no-verbose: takes no value"):
        materialize(with_defaults, ["--no-verbose=true"])
    with pytest.raises(ComponentArgumentError, match="invalid bool value 'maybe'"):
        materialize(with_defaults, ["--verbose=maybe"])


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a,b,c", ["a", "b", "c"]),
        (" a , b ", ["a", "b"]),
        ("a,,b,", ["a", "b"]),
        ("", []),
        ("single", ["single"]),
    ],
)
def test_list_parsing(text: str, expected: list[str]) -> None:
    assert parse_value(text, ParamType(list)) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("k=v,k2=v2", {"k": "v", "k2": "v2"}),
        ("A=0,1,B=2", {"A": "0,1", "B": "2"}),  # a piece without '=' continues the previous value
        ("URL=a=b", {"URL": "a=b"}),
        ("EMPTY=", {"EMPTY": ""}),
        (" k =v", {"k": "v"}),
        ("", {}),
    ],
)
def test_dict_parsing(text: str, expected: dict[str, str]) -> None:
    assert parse_value(text, ParamType(dict)) == expected


@pytest.mark.parametrize("text", ["novalue", "=v", "a=1,=2"])
def test_dict_parsing_rejects_pieces_without_a_key(text: str) -> None:
    with pytest.raises(ValueError, match="key=value"):
        parse_value(text, ParamType(dict))


@pytest.mark.parametrize(
    ("text", "expected"),
    [("true", True), ("Yes", True), ("1", True), ("false", False), ("off", False), ("0", False)],
)
def test_bool_parsing(text: str, expected: bool) -> None:
    assert parse_value(text, ParamType(bool)) is expected


def test_bool_parsing_rejects_other_words() -> None:
    with pytest.raises(ValueError, match="invalid bool value 'maybe'"):
        parse_value("maybe", ParamType(bool))


@pytest.mark.parametrize(
    ("annotation", "expected"),
    [
        (str, ParamType(str)),
        (int, ParamType(int)),
        (float, ParamType(float)),
        (bool, ParamType(bool)),
        (list[str], ParamType(list)),
        (dict[str, str], ParamType(dict)),
        (Optional[int], ParamType(int, optional=True)),  # noqa: UP045
        (int | None, ParamType(int, optional=True)),
        (None | list[str], ParamType(list, optional=True)),
        (list[int], ParamType(list, item=int)),
        (List[float], ParamType(list, item=float)),  # noqa: UP006 (typing spellings must work)
        (dict[str, int], ParamType(dict, item=int)),
        (Dict[int, str], ParamType(dict, key=int)),  # noqa: UP006
        (Optional[List[int]], ParamType(list, optional=True, item=int)),  # noqa: UP006, UP045
        (Dict[str, List[str]], ParamType(dict, item_list=True)),  # noqa: UP006
        (list[bool], None),
        (list[list[str]], None),
        (dict[str, dict[str, str]], None),
        (list, None),
        (int | str, None),
        (Optional[int | str], None),  # noqa: UP045
        (bytes, None),
        (Any, None),
    ],
)
def test_param_type(annotation: Any, expected: ParamType | None) -> None:
    assert param_type(annotation) == expected


# -- optionals and defaults ------------------------------------------------------------------------------
def test_optionals_default_to_none_and_take_values() -> None:
    assert called(materialize(optionals, [])) == {
        "args": [],
        "a": None,
        "b": None,
        "c": None,
        "d": None,
        "e": None,
        "f": None,
    }
    app = materialize(optionals, ["-a", "x", "-b", "2", "-c", "p,q", "-d", "k=v", "-e", "-f", "1.5"])
    assert called(app) == {
        "args": [],
        "a": "x",
        "b": 2,
        "c": ["p", "q"],
        "d": {"k": "v"},
        "e": True,
        "f": 1.5,
    }
    assert called(materialize(optionals, ["--no-e"]))["e"] is False


def test_function_defaults_apply() -> None:
    assert called(materialize(with_defaults, [])) == {
        "args": [],
        "msg": "hello",
        "num_replicas": 1,
        "verbose": False,
        "tags": None,
    }


def test_config_defaults_override_function_defaults_but_not_the_command_line() -> None:
    defaults = {"msg": "from config", "num_replicas": "4", "verbose": "true", "tags": "x,y"}
    assert called(materialize(with_defaults, [], defaults=defaults)) == {
        "args": [],
        "msg": "from config",
        "num_replicas": 4,
        "verbose": True,
        "tags": ["x", "y"],
    }
    app = materialize(
        with_defaults, ["--msg", "cli", "--no-verbose", "--num_replicas", "2"], defaults=defaults
    )
    assert called(app) == {"args": [], "msg": "cli", "num_replicas": 2, "verbose": False, "tags": ["x", "y"]}


def test_config_default_makes_a_required_parameter_optional() -> None:
    defaults = {"name": "n", "count": "1", "ratio": "2", "flag": "no", "tags": "", "env": "A=1"}
    assert called(materialize(typed, [], defaults=defaults)) == {
        "args": [],
        "name": "n",
        "count": 1,
        "ratio": 2.0,
        "flag": False,
        "tags": [],
        "env": {"A": "1"},
    }


def test_config_default_names_may_use_dashes() -> None:
    assert called(materialize(with_defaults, [], defaults={"num-replicas": "3"}))["num_replicas"] == 3


def test_config_default_for_unknown_argument_is_an_error() -> None:
    with pytest.raises(
        ComponentArgumentError, match=r"unknown argument 'num_replica' \(did you mean 'num_replicas'\?\)"
    ):
        materialize(with_defaults, [], defaults={"num_replica": "3"})


def test_config_default_of_wrong_type_is_an_error() -> None:
    with pytest.raises(
        ComponentArgumentError, match="config default for argument 'num_replicas': invalid int value 'many'"
    ):
        materialize(with_defaults, [], defaults={"num_replicas": "many"})


def test_help_shows_config_defaults() -> None:
    text = component_help(with_defaults, prog="x", defaults={"msg": "from config"})
    assert "default: from config" in text


# -- names: -x, --name, --name-with-dashes -----------------------------------------------------------
def test_single_letter_parameters_take_one_or_two_dashes() -> None:
    assert called(materialize(varargs, ["-n", "5"]))["n"] == 5
    assert called(materialize(varargs, ["--n", "6"]))["n"] == 6  # TorchX registers both
    assert called(materialize(varargs, ["--n=7"]))["n"] == 7
    assert called(materialize(optionals, ["--c", "x,y", "--e", "false"])) | {} == {
        "args": [],
        "a": None,
        "b": None,
        "c": ["x", "y"],
        "d": None,
        "e": False,
        "f": None,
    }


def test_underscored_names_also_accept_dashes() -> None:
    assert called(materialize(with_defaults, ["--num_replicas", "2"]))["num_replicas"] == 2
    assert called(materialize(with_defaults, ["--num-replicas", "3"]))["num_replicas"] == 3
    assert called(materialize(with_defaults, ["--num-replicas=4"]))["num_replicas"] == 4


def test_abbreviations_are_refused() -> None:
    with pytest.raises(ComponentArgumentError, match="unrecognized arguments: --num 2"):
        materialize(with_defaults, ["--num", "2"])


# -- *args -----------------------------------------------------------------------------------------------
def test_everything_after_double_dash_goes_to_varargs_verbatim() -> None:
    app = materialize(varargs, ["--prefix", "p", "--", "--prefix", "-n", "--", "$(x)", "a b"])
    assert called(app) == {"args": ["--prefix", "-n", "--", "$(x)", "a b"], "prefix": "p", "n": 1}


def test_words_from_the_first_positional_on_are_passed_through_not_parsed() -> None:
    app = materialize(varargs, ["--prefix", "p", "a", "--prefix", "q", "-n", "b", "--", "c"])
    assert called(app) == {"args": ["a", "--prefix", "q", "-n", "b", "--", "c"], "prefix": "p", "n": 1}


def test_option_values_may_look_like_words_or_negative_numbers() -> None:
    app = materialize(varargs, ["--prefix", "a b", "-n", "-3", "x"])
    assert called(app) == {"args": ["x"], "prefix": "a b", "n": -3}
    assert called(materialize(varargs, ["--prefix=-v", "x"]))["prefix"] == "-v"


def test_parameters_before_varargs_are_passed_positionally() -> None:
    app = materialize(positional_then_varargs, ["--first", "1", "--", "x", "y"])
    assert called(app) == {"args": ["x", "y"], "first": "1"}


def test_double_dash_without_varargs_is_an_error() -> None:
    with pytest.raises(ComponentArgumentError, match="takes no positional arguments, got: x y"):
        materialize(with_defaults, ["--", "x", "y"])
    assert called(materialize(with_defaults, ["--"]))["msg"] == "hello"  # nothing after it: fine


def test_positional_without_varargs_is_an_error() -> None:
    with pytest.raises(ComponentArgumentError, match="unrecognized arguments: stray"):
        materialize(with_defaults, ["stray"])


# -- argument errors: one line, with usage, never SystemExit --------------------------------------------
def test_missing_required_argument() -> None:
    with pytest.raises(ComponentArgumentError) as info:
        materialize(typed, ["--name", "x"], prog="tsm run typed")
    message = str(info.value)
    assert message.startswith("tsm run typed: the following arguments are required: --count")
    assert "\n" not in message
    assert info.value.usage.startswith("usage: tsm run typed")


def test_bad_int() -> None:
    with pytest.raises(
        ComponentArgumentError, match=r"argument --num_replicas: invalid int value 'two'"
    ) as info:
        materialize(with_defaults, ["--num_replicas", "two"])
    assert "usage:" in info.value.usage


def test_bad_float() -> None:
    with pytest.raises(ComponentArgumentError, match=r"argument -f/--f: invalid float value 'x'"):
        materialize(optionals, ["-f", "x"])


def test_bad_dict() -> None:
    with pytest.raises(ComponentArgumentError, match=r"argument -d/--d: invalid dict value 'oops'"):
        materialize(optionals, ["-d", "oops"])


def test_unknown_flag_suggests_the_closest() -> None:
    with pytest.raises(
        ComponentArgumentError, match=r"unrecognized arguments: --mgs hi \(did you mean '--msg'\?\)"
    ):
        materialize(with_defaults, ["--mgs", "hi"])


def test_missing_value() -> None:
    with pytest.raises(ComponentArgumentError, match="argument --msg: expected one argument"):
        materialize(with_defaults, ["--msg"])


def test_help_is_not_an_option_of_the_parser() -> None:
    with pytest.raises(ComponentArgumentError, match="unrecognized arguments: --help"):
        materialize(with_defaults, ["--help"])


def test_argument_error_raised_by_the_component_gets_prog_and_usage() -> None:
    def picky(x: int = 0) -> AppDef:
        """Refuses odd numbers."""
        if x % 2:
            raise ComponentArgumentError("-x must be even")
        return _app(x=x)

    with pytest.raises(ComponentArgumentError, match=r"^picky: -x must be even$") as info:
        materialize(picky, ["-x", "3"])
    assert info.value.usage == "usage: picky [options]   ('picky --help' lists the options)\n"


def test_other_errors_of_the_component_propagate() -> None:
    def broken() -> AppDef:
        """Fails."""
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        materialize(broken, [])


# -- functions that cannot be components ------------------------------------------------------------------
def test_not_returning_an_appdef() -> None:
    def wrong() -> AppDef:
        """Returns a string."""
        return "not an app"  # type: ignore[return-value]

    with pytest.raises(ComponentError, match="returned str, not a tsm.AppDef"):
        materialize(wrong, [])


def test_unannotated_parameter() -> None:
    def f(x) -> AppDef:  # type: ignore[no-untyped-def]
        """Doc."""
        return _app()

    with pytest.raises(ComponentError, match="parameter 'x' has no type annotation"):
        materialize(f, [])


def test_unsupported_parameter_type() -> None:
    def f(x: list[bytes]) -> AppDef:
        """Doc."""
        return _app()

    with pytest.raises(ComponentError, match=r"parameter 'x' has unsupported type list\[bytes\]"):
        materialize(f, [])


def test_varargs_must_be_str() -> None:
    def f(*args: int) -> AppDef:
        """Doc."""
        return _app()

    with pytest.raises(ComponentError, match=r"\*args must be annotated str, got int"):
        materialize(f, [])


def test_kwargs_are_refused() -> None:
    def f(**kwargs: str) -> AppDef:
        """Doc."""
        return _app()

    with pytest.raises(ComponentError, match=r"\*\*kwargs is not supported"):
        materialize(f, [])


def test_unresolvable_annotation() -> None:
    def f(x: NoSuchType) -> AppDef:  # type: ignore[name-defined]  # noqa: F821
        """Doc."""
        return _app()

    with pytest.raises(ComponentError, match="cannot resolve its type annotations: NameError"):
        materialize(f, [])


# -- help --------------------------------------------------------------------------------------------------
def test_component_help_has_usage_description_and_argument_docs() -> None:
    text = component_help(with_defaults, prog="tsm run x")
    assert text.startswith("usage: tsm run x [--msg MSG] [--num_replicas NUM_REPLICAS]")
    assert "Parameters with defaults." in text
    assert "the message, 100% literal (str, default: hello)" in text  # '%' survives argparse's formatting
    assert "how many (int, default: 1)" in text
    assert "--verbose [true|false], --no-verbose" in text
    assert "talk more (bool, default: false)" in text
    assert "also be spelled with dashes" in text


def test_component_help_marks_required_and_varargs() -> None:
    assert "a string (str, required)" in component_help(typed)
    text = component_help(varargs, prog="v")
    assert "[args ...]" in text
    assert "the words" in text
    assert (
        "Words from the first one that is not an option (or after '--') are passed verbatim as args." in text
    )


def test_wants_help_only_before_double_dash() -> None:
    assert wants_help(["--msg", "x", "--help"])
    assert not wants_help(["--msg", "x"])
    assert not wants_help(["-h", "gpu.small"])  # -h is a component's named resource, not help
    assert not wants_help(["--", "--help"])  # belongs to the app


# -- TorchX's container types -----------------------------------------------------------------------------
def containers(
    ints: List[int],  # noqa: UP006
    weights: Dict[str, int],  # noqa: UP006
    ranks: Optional[List[int]] = None,  # noqa: UP006, UP045
    groups: Optional[Dict[str, List[str]]] = None,  # noqa: UP006, UP045
) -> AppDef:
    """The container types TorchX components use.

    Args:
        ints: numbers
        weights: name to weight
        ranks: which ranks
        groups: name to members
    """
    return _app(ints=ints, weights=weights, ranks=ranks, groups=groups)


def test_container_types_of_torchx_components() -> None:
    argv = ["--ints", "1,2,3", "--weights", "a=1,b=-2", "--groups", "x=h1;h2,y=h3", "--ranks", "0"]
    assert called(materialize(containers, argv)) == {
        "args": [],
        "ints": [1, 2, 3],
        "weights": {"a": 1, "b": -2},
        "ranks": [0],
        "groups": {"x": ["h1", "h2"], "y": ["h3"]},
    }
    app = materialize(containers, ["--ints", "", "--weights", "a=1;b=2", "--groups", "x=h1,h2,y=h3"])
    assert called(app)["groups"] == {"x": ["h1", "h2"], "y": ["h3"]}
    assert called(app)["weights"] == {"a": 1, "b": 2}
    assert called(app)["ranks"] is None
    assert "(dict[str, list[str]], default: None)" in component_help(containers)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--ints", "1,x", "--weights", ""], "argument --ints: invalid int value 'x' in list"),
        (["--ints", "1", "--weights", "a=one"], "argument --weights: invalid int value 'one' for a"),
    ],
)
def test_container_items_are_checked(argv: list[str], message: str) -> None:
    with pytest.raises(ComponentArgumentError, match=message):
        materialize(containers, argv)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("FOO=v1;v2;BAR=v3", {"FOO": "v1;v2", "BAR": "v3"}),  # ';' separates pairs too, as in TorchX
        ("FOO=''", {"FOO": ""}),
        ('FOO=""', {"FOO": ""}),
    ],
)
def test_dict_parsing_torchx_forms(text: str, expected: dict[str, str]) -> None:
    assert parse_value(text, ParamType(dict)) == expected


def test_missing_required_argument_is_a_usage_error_with_one_usage_line() -> None:
    with pytest.raises(ComponentArgumentError) as info:
        materialize(containers, [], prog="tsm run c")
    assert str(info.value) == "tsm run c: the following arguments are required: --ints, --weights"
    assert (
        info.value.usage
        == "usage: tsm run c --ints INTS --weights WEIGHTS [options]   ('tsm run c --help' lists the options)\n"
    )
