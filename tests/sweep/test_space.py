"""The sweep space: parsing the command line's axes, grid and seeded random expansion, and every refusal."""

from __future__ import annotations

import pytest

from tsm.errors import InvalidRunOptionError
from tsm.sweep.space import (
    MAX_TRIALS,
    Choices,
    InvalidSweepError,
    LogUniform,
    Uniform,
    count,
    expand,
    parse_axis,
    space_of,
)


def test_axes_parse_as_the_command_line_spells_them() -> None:
    assert parse_axis("lr", "0.1,0.01") == Choices(("0.1", "0.01"))
    assert parse_axis("opt", "sgd,adam") == Choices(("sgd", "adam"))
    assert parse_axis("lr", "0.1") == Choices(("0.1",))
    assert parse_axis("dropout", "0:0.5") == Uniform(0.0, 0.5, False)
    assert parse_axis("layers", "1:8") == Uniform(1.0, 8.0, True)
    assert parse_axis("lr", "log:1e-4:1e-1") == LogUniform(1e-4, 1e-1)
    assert parse_axis("path", "a:b") == Choices(("a:b",))  # not numbers: a value, not a range


@pytest.mark.parametrize("text,why", [
    ("", "empty"), ("0.1,,0.2", "empty"), ("0.5:0.1", "low end above"), ("log:0:1", "above 0"),
    ("log:-1:1", "above 0"), ("log:1e-1:1e-4", "low end above"), ("log:1", "log range"), ("0:1e999", "finite"),
])
def test_bad_axes_are_refused_with_a_reason(text: str, why: str) -> None:
    with pytest.raises(InvalidSweepError, match=why) as e:
        parse_axis("x", text)
    assert isinstance(e.value, InvalidRunOptionError)  # the CLI's exit code 2


def test_grid_is_every_combination_last_axis_fastest() -> None:
    trials = expand(space_of({"lr": "0.1,0.01", "batch": [32, 64, 128]}))
    assert len(trials) == 6 == count(space_of({"lr": "0.1,0.01", "batch": [32, 64, 128]}), None)
    assert trials[:2] == [{"lr": "0.1", "batch": "32"}, {"lr": "0.1", "batch": "64"}]
    assert trials[-1] == {"lr": "0.01", "batch": "128"}


def test_grid_refuses_ranges_and_more_than_the_cap() -> None:
    with pytest.raises(InvalidSweepError, match="--random"):
        expand(space_of({"dropout": "0:0.5"}))
    big = {f"p{i}": ",".join(str(v) for v in range(10)) for i in range(6)}  # 10**6 trials
    with pytest.raises(InvalidSweepError, match="more than 100,000"):
        expand(space_of(big))
    with pytest.raises(InvalidSweepError, match="more than"):
        expand(space_of({"lr": "0.1"}), random=MAX_TRIALS + 1)
    with pytest.raises(InvalidSweepError, match="empty list"):
        space_of({"lr": []})
    with pytest.raises(InvalidSweepError, match="empty"):
        space_of({})


def test_random_search_is_seeded_and_stays_in_its_ranges() -> None:
    space = space_of({"lr": "log:1e-4:1e-1", "dropout": "0:0.5", "opt": "sgd,adam", "layers": "2:4"})
    a = expand(space, random=200, seed=7)
    assert a == expand(space, random=200, seed=7)
    assert a != expand(space, random=200, seed=8)
    for t in a:
        assert 1e-4 <= float(t["lr"]) <= 1e-1
        assert 0 <= float(t["dropout"]) <= 0.5
        assert t["opt"] in ("sgd", "adam")
        assert t["layers"] in ("2", "3", "4")
    # log-uniform: about as many below 1e-2.5 as above
    low = sum(float(t["lr"]) < 10 ** -2.5 for t in a)
    assert 60 < low < 140


def test_probes_take_every_listed_value_once_whatever_the_first_trial_holds() -> None:
    from tsm.sweep.space import Choices, Uniform, probes

    space = {"n": Choices(("bad", "1", "2", "1")), "lr": Uniform(0.0, 1.0), "opt": Choices(("sgd", "adam"))}
    first = {"n": "2", "lr": "0.5", "opt": "adam"}  # a random search's first trial: not the first listed values
    got = probes(space, first)
    assert got == [{"n": "bad", "lr": "0.5", "opt": "adam"}, {"n": "1", "lr": "0.5", "opt": "adam"},
                   {"n": "2", "lr": "0.5", "opt": "sgd"}]
    seen = {(name, p[name]) for p in [first, *got] for name in ("n", "opt")}
    assert seen == {("n", "bad"), ("n", "1"), ("n", "2"), ("opt", "sgd"), ("opt", "adam")}
