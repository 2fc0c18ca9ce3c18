"""TorchX's ``schedulers.api``: tsm's scheduler interface, with TorchX's :func:`split_lines_iterator`.

Every class here is tsm's own (``torchx.schedulers.api.Scheduler is tsm.schedulers.api.Scheduler``). The one
difference is :func:`split_lines_iterator`: TorchX's cuts each chunk into lines on its own (a chunk's
unterminated end is a line of its own), where tsm's re-cuts across chunks
(:func:`tsm.schedulers.common.logs.split_lines_iterator`, what tsm's backends use). The nightly's
``StructuredOpts`` is here too (:mod:`tsm.compat.torchx.schedulers.structured_opts`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from tsm.compat.torchx.schedulers.structured_opts import StructuredOpts
from tsm.schedulers.api import (
    BatchedViews,
    DescribeAppResponse,
    DetailedViews,
    DirectoryWorkspaces,
    EventWait,
    ListAppResponse,
    MultiReplicaLogs,
    Scheduler,
    SizedPlacement,
    StoreRecords,
    Stream,
    filter_regex,
    split_lines,
)
from tsm.specs.api import AppDef, AppDryRunInfo, AppState, Role, RoleStatus

__all__ = ["AppDef", "AppDryRunInfo", "AppState", "BatchedViews", "DescribeAppResponse", "DetailedViews",
           "DirectoryWorkspaces", "EventWait", "ListAppResponse", "MultiReplicaLogs", "Role", "RoleStatus", "Scheduler",
           "SizedPlacement", "StoreRecords", "Stream", "StructuredOpts", "filter_regex", "split_lines", "split_lines_iterator"]


def split_lines_iterator(chunks: Iterable[str]) -> Iterator[str]:
    """The lines of each chunk in turn, each chunk cut on its own (:func:`split_lines` of every chunk)."""
    for chunk in chunks:
        yield from split_lines(chunk)
