"""RunOptions: one dataclass gives the runopts (type, default, help) and the typed values."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from tsm.errors import InvalidRunOptionError
from tsm.schedulers.common.options import RunOptions, option


@dataclass(frozen=True)
class Opts(RunOptions):
    queue: str | None = option("queue to use")
    retries: int = option("how many times", 3)
    fast: bool = option("go fast", False)
    tags: list[str] | None = option("labels")
    ratio: float | None = option("a ratio")
    token: str | None = option("required token", required=True)

    def check(self) -> None:
        if self.retries < 0:
            raise InvalidRunOptionError(f"retries must be >= 0, got {self.retries}")


def test_runopts_come_from_the_fields() -> None:
    opts = Opts.runopts()
    rows = {name: (o.type_, o.default, o.required, o.help) for name, o in opts}
    assert rows == {
        "queue": (str, None, False, "queue to use"),
        "retries": (int, 3, False, "how many times"),
        "fast": (bool, False, False, "go fast"),
        "tags": (list[str], None, False, "labels"),
        "ratio": (float, None, False, "a ratio"),
        "token": (str, None, True, "required token"),
    }


def test_values_are_coerced_once_then_typed() -> None:
    cfg = Opts.runopts().resolve({"retries": "5", "fast": "yes", "tags": "a,b", "ratio": 2, "token": "t"})
    o = Opts.from_cfg(cfg)
    assert o == Opts(queue=None, retries=5, fast=True, tags=["a", "b"], ratio=2.0, token="t")
    assert isinstance(o.ratio, float)


def test_bad_values_are_refused() -> None:
    with pytest.raises(InvalidRunOptionError, match="'retries' expects int"):
        Opts.runopts().resolve({"retries": "many", "token": "t"})
    with pytest.raises(InvalidRunOptionError, match="'token' is required"):
        Opts.runopts().resolve({})
    with pytest.raises(InvalidRunOptionError, match="retries must be >= 0"):
        Opts.from_cfg(Opts.runopts().resolve({"retries": -1, "token": "t"}))
