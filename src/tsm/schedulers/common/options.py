"""A backend's run options, declared once as a dataclass: it makes the ``runopts`` and holds the values.

::

    @dataclass(frozen=True)
    class MyOptions(RunOptions):
        queue: str | None = option("queue to submit to; default: the cluster's")
        retries: int = option("times to retry a failed submission", default=3)

    def run_opts(self) -> runopts:  return MyOptions.runopts()
    def _submit_dryrun(self, app, cfg):  opts = MyOptions.from_cfg(cfg)   # typed from here on

Each field's type (``X | None`` allowed), default and help become one run option; :meth:`runopts.resolve`
coerces the user's values once at dry run, and :meth:`RunOptions.from_cfg` turns the resolved mapping
into the typed instance, running :meth:`RunOptions.check` for rules that span values or need more than a
type. No per-backend re-coercion, no ``type: ignore``.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any, ClassVar, TypeVar

from tsm.specs.runopts import CfgVal, runopts

T = TypeVar("T", bound="RunOptions")


def option(help: str, default: Any = None, *, required: bool = False, trusted: bool = False) -> Any:
    """A run-option field: its help text and default (lists and dicts default to None: an empty value);
    ``trusted``: only from the command line or the user's own config (see :class:`tsm.specs.runopts.runopt`)."""
    return dataclasses.field(default=default, metadata={"help": help, "required": required, "trusted": trusted})


def _option_type(annotation: Any) -> Any:
    """``X`` from ``X | None`` (or ``Optional[X]``); the annotation itself otherwise."""
    origin = typing.get_origin(annotation)
    if origin is typing.Union or origin is types.UnionType:
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return annotation


class RunOptions:
    """Base of a backend's options dataclass (see the module docstring)."""

    #: set by ``@dataclass`` on every subclass; declared so type checkers see a dataclass
    __dataclass_fields__: ClassVar[dict[str, Any]]

    @classmethod
    def runopts(cls) -> runopts:
        """The :class:`runopts` this dataclass declares, in field order."""
        hints = typing.get_type_hints(cls)
        opts = runopts()
        for f in dataclasses.fields(cls):
            if "help" not in f.metadata:
                continue
            default: CfgVal = None if f.default is dataclasses.MISSING else f.default
            opts.add(f.name, _option_type(hints[f.name]), f.metadata["help"], default, f.metadata["required"],
                     trusted=f.metadata.get("trusted", False))
        return opts

    @classmethod
    def from_cfg(cls: type[T], cfg: Mapping[str, CfgVal]) -> T:
        """The typed options from a cfg that :meth:`runopts.resolve` has checked; runs :meth:`check`."""
        names = {f.name for f in dataclasses.fields(cls)}
        out = cls(**{k: v for k, v in cfg.items() if k in names})
        out.check()
        return out

    def check(self) -> None:
        """Rules beyond each value's type; raise :class:`tsm.errors.InvalidRunOptionError`. None by default."""
