"""The search space of a sweep: axes, their command-line spelling, and the trials they expand to.

An axis is one component parameter and the values it takes::

    "0.1,0.01,0.001"     Choices(("0.1", "0.01", "0.001"))    a list: every value (grid) or one at random
    "sgd,adam"           Choices(("sgd", "adam"))
    "0:0.5"              Uniform(0.0, 0.5)                    a range: random search only
    "log:1e-4:1e-1"      LogUniform(1e-4, 1e-1)               a log-uniform range: random search only

:func:`expand` turns ``{name: axis}`` into the trials' parameters: the grid (every combination, the last
axis varying fastest) or ``random`` samples drawn with ``seed`` (the same seed, the same trials). Values
stay the strings the component's command line takes (``--lr 0.01``), so what a trial ran with is exactly
what its row shows. Every mistake (an empty list, ``low > high``, a log range touching 0, a range in a grid,
more than :data:`MAX_TRIALS` trials) raises :class:`InvalidSweepError`, before anything is submitted.
"""

from __future__ import annotations

import itertools
import math
import random as _random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tsm.errors import InvalidRunOptionError

#: The most trials one sweep may have (a typo in a grid multiplies fast).
MAX_TRIALS = 100_000

_NUMBER = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")


class InvalidSweepError(InvalidRunOptionError):
    """The sweep's space or options are wrong (CLI exit code 2): nothing was submitted."""


@dataclass(frozen=True)
class Choices:
    """A list of values: the grid takes each, a random search picks one."""

    values: tuple[str, ...]


@dataclass(frozen=True)
class Uniform:
    """A uniform range ``low:high`` (random search only); integer ends give integer samples."""

    low: float
    high: float
    integer: bool = False


@dataclass(frozen=True)
class LogUniform:
    """A log-uniform range ``log:low:high`` with ``0 < low <= high`` (random search only)."""

    low: float
    high: float


Axis = Choices | Uniform | LogUniform


def _number(text: str, name: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise InvalidSweepError(f"--{name}: {text!r} is not a finite number")
    return value


def parse_axis(name: str, text: str) -> Axis:
    """Parse one axis as the command line spells it (see the module doc); raises :class:`InvalidSweepError`."""
    if text.startswith("log:"):
        parts = text[4:].split(":")
        if len(parts) != 2 or not all(_NUMBER.fullmatch(p.strip()) for p in parts):
            raise InvalidSweepError(f"--{name}: {text!r} is not a log range; write log:LOW:HIGH, e.g. log:1e-4:1e-1")
        low, high = (_number(p.strip(), name) for p in parts)
        return _checked_log(name, low, high)
    parts = text.split(":")
    if len(parts) == 2 and all(_NUMBER.fullmatch(p.strip()) for p in parts):
        low, high = (_number(p.strip(), name) for p in parts)
        if low > high:
            raise InvalidSweepError(f"--{name}: range {text!r} has its low end above its high end")
        integer = all(re.fullmatch(r"[+-]?\d+", p.strip()) for p in parts)
        return Uniform(low, high, integer)
    values = tuple(v.strip() for v in text.split(","))
    if not text.strip() or any(not v for v in values):
        raise InvalidSweepError(f"--{name}: empty value in list {text!r}; give values like 0.1,0.01")
    return Choices(values)


def _checked_log(name: str, low: float, high: float) -> LogUniform:
    if low <= 0 or high <= 0:
        raise InvalidSweepError(f"--{name}: a log range must stay above 0, got log:{low:g}:{high:g}")
    if low > high:
        raise InvalidSweepError(f"--{name}: log range log:{low:g}:{high:g} has its low end above its high end")
    return LogUniform(low, high)


def as_axis(name: str, value: object) -> Axis:
    """An axis from the Python API: an :data:`Axis`, a string in the command line's syntax, or a list."""
    if isinstance(value, (Choices, Uniform, LogUniform)):
        if isinstance(value, Choices) and not value.values:
            raise InvalidSweepError(f"parameter {name!r}: empty list of values")
        if isinstance(value, LogUniform):
            return _checked_log(name, value.low, value.high)
        if isinstance(value, Uniform) and value.low > value.high:
            raise InvalidSweepError(f"parameter {name!r}: range has its low end above its high end")
        return value
    if isinstance(value, str):
        return parse_axis(name, value)
    if isinstance(value, Sequence):
        if not value:
            raise InvalidSweepError(f"parameter {name!r}: empty list of values")
        return Choices(tuple(_text(v) for v in value))
    raise InvalidSweepError(f"parameter {name!r}: give a list of values or a range string, not {type(value).__name__}")


def _text(value: object) -> str:
    """A value as the component's command line takes it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def space_of(space: Mapping[str, object]) -> dict[str, Axis]:
    """``{name: axis}`` from the Python API's mapping (each value as :func:`as_axis` takes it)."""
    if not space:
        raise InvalidSweepError("the sweep's space is empty: give at least one parameter and its values")
    return {name: as_axis(name, value) for name, value in space.items()}


def count(space: Mapping[str, Axis], random: int | None) -> int:
    """How many trials :func:`expand` would give, without making them."""
    if random is not None:
        return random
    return math.prod(len(a.values) for a in space.values() if isinstance(a, Choices))


def expand(space: Mapping[str, Axis], random: int | None = None, seed: int | None = None) -> list[dict[str, str]]:
    """The trials' parameters: the grid, or ``random`` samples drawn with ``seed``; checked first."""
    if random is not None:
        if random < 1:
            raise InvalidSweepError(f"--random must be at least 1, got {random}")
        if random > MAX_TRIALS:
            raise InvalidSweepError(f"--random {random} is more than {MAX_TRIALS:,} trials; split the sweep")
        rng = _random.Random(seed)
        return [{name: _sample(axis, rng) for name, axis in space.items()} for _ in range(random)]
    ranges = [n for n, a in space.items() if not isinstance(a, Choices)]
    if ranges:
        raise InvalidSweepError(
            f"--{ranges[0]} is a range: a grid needs lists of values; add --random N to sample ranges"
        )
    n = count(space, None)
    if n > MAX_TRIALS:
        raise InvalidSweepError(f"the grid has {n:,} trials, more than {MAX_TRIALS:,}; split the sweep or use --random")
    names = list(space)
    lists = [a.values for a in space.values() if isinstance(a, Choices)]
    return [dict(zip(names, combo, strict=True)) for combo in itertools.product(*lists)]


def probes(space: Mapping[str, Axis], first: Mapping[str, str]) -> list[dict[str, str]]:
    """Trials that, with ``first`` (the sweep's first trial), take every listed value of every list axis once:
    ``first`` with one value changed at a time, for each value ``first`` does not hold (grid or random alike).

    What a sweep materializes before it submits anything, so a value its parameter cannot take fails at once
    rather than as a trial that was never launched.
    """
    out = []
    for name, axis in space.items():
        if isinstance(axis, Choices):
            for value in dict.fromkeys(axis.values):
                if value != first.get(name):
                    out.append({**first, name: value})
    return out


def _sample(axis: Axis, rng: _random.Random) -> str:
    if isinstance(axis, Choices):
        return rng.choice(axis.values)
    if isinstance(axis, LogUniform):
        return f"{math.exp(rng.uniform(math.log(axis.low), math.log(axis.high))):.6g}"
    if axis.integer:
        return str(rng.randint(int(axis.low), int(axis.high)))
    return f"{rng.uniform(axis.low, axis.high):.6g}"
