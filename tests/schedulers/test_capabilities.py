"""The declared scheduler contract: capabilities are classes a backend inherits (asked with isinstance), one
factory rule, one ``structured_error_msg``, and no backend's name or signature read outside its package."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tsm.errors import InvalidRunOptionError
from tsm.schedulers import get_scheduler
from tsm.schedulers.api import (
    BatchedViews,
    DetailedViews,
    DirectoryWorkspaces,
    EventWait,
    MultiReplicaLogs,
    NativeDependencies,
    PresetAppIds,
    SizedPlacement,
    StoreRecords,
    SweepNative,
)
from tsm.schedulers.common.factory import UnknownSchedulerParamError, scheduler_params
from tsm.workspace.api import WorkspaceBuilder

SRC = Path(__file__).resolve().parents[2] / "src" / "tsm"

CAPABILITIES = (BatchedViews, DetailedViews, MultiReplicaLogs, SizedPlacement, DirectoryWorkspaces, EventWait,
                WorkspaceBuilder, SweepNative, StoreRecords, PresetAppIds, NativeDependencies)


def _classes() -> dict[str, type]:
    from tsm.schedulers.docker.scheduler import DockerScheduler
    from tsm.schedulers.kubernetes.scheduler import KubernetesScheduler
    from tsm.schedulers.local.scheduler import LocalScheduler
    from tsm.schedulers.ray.scheduler import RayScheduler
    from tsm.schedulers.slurm.scheduler import SlurmScheduler

    return {"local": LocalScheduler, "slurm": SlurmScheduler, "docker": DockerScheduler,
            "kubernetes": KubernetesScheduler, "ray": RayScheduler}


#: What each builtin backend declares (and so what the runner, the views and the CLI will ask of it).
DECLARED = {
    "local": {DetailedViews, BatchedViews, MultiReplicaLogs, DirectoryWorkspaces, EventWait, StoreRecords,
              PresetAppIds},
    "slurm": {BatchedViews, DirectoryWorkspaces, SweepNative, NativeDependencies},
    "docker": {BatchedViews, WorkspaceBuilder, PresetAppIds},
    "kubernetes": {BatchedViews, WorkspaceBuilder, PresetAppIds},
    "ray": {BatchedViews, WorkspaceBuilder, PresetAppIds},
}


@pytest.mark.parametrize("name", sorted(DECLARED))
def test_each_backend_declares_its_capabilities_and_lists_them_in_its_docstring(name: str) -> None:
    cls = _classes()[name]
    assert {c for c in CAPABILITIES if issubclass(cls, c)} == DECLARED[name]
    doc = cls.__doc__ or ""
    assert "Capabilities:" in doc
    for cap in DECLARED[name] - {BatchedViews} if DetailedViews in DECLARED[name] else DECLARED[name]:
        assert cap.__name__ in doc or (cap is DetailedViews and "LocalViews" in doc), (name, cap.__name__)


def test_a_capability_is_declared_not_guessed_from_a_method_of_the_same_name() -> None:
    class LooksLikeIt:
        def view_snapshot(self, app_ids: list[str]) -> list[object]:
            return []

        def log_iter_many(self, app_id: str) -> list[object]:
            return []

    assert not isinstance(LooksLikeIt(), BatchedViews)
    assert not isinstance(LooksLikeIt(), MultiReplicaLogs)


@pytest.mark.parametrize("name", ["local", "local_cwd", "slurm", "docker", "kubernetes", "ray"])
def test_an_unknown_factory_keyword_is_an_invalid_run_option_naming_it(name: str) -> None:
    with pytest.raises(InvalidRunOptionError, match="'bogus_param'") as ei:
        get_scheduler(name, "t", bogus_param=1)
    assert isinstance(ei.value, UnknownSchedulerParamError) and ei.value.param == "bogus_param"


def test_scheduler_params_names_what_a_backend_takes() -> None:
    assert scheduler_params("x", {"a": 1}, ("a", "b")) == {"a": 1}
    with pytest.raises(UnknownSchedulerParamError, match=r"does not take the parameter 'c'.*takes: a, b"):
        scheduler_params("x", {"a": 1, "c": 2}, ("a", "b"))


def _code(path: Path) -> str:
    """The file without its docstrings and comments (what runs, not what is said about it)."""
    text = re.sub(r'"""(?:.|\n)*?"""', '""', path.read_text())
    return "\n".join(line.split("  #")[0] for line in text.splitlines() if not line.lstrip().startswith("#"))


#: Files outside any backend that ask schedulers what they can do: none may sniff or name a backend.
CONSUMERS = ["runner/api.py", "runner/params.py", "cli/_common.py", "views/snapshot.py", "views/top.py",
             "views/text.py", "schedulers/api.py", "workspace/dir.py"]


@pytest.mark.parametrize("rel", CONSUMERS)
def test_consumers_read_no_capability_by_getattr_signature_or_backend_name(rel: str) -> None:
    code = _code(SRC / rel)
    assert "getattr(sched" not in code and "inspect.signature(" not in code
    assert "requires_resource" not in code and "DIR_SCHEDULERS" not in code
    for backend in ("local", "local_cwd", "slurm", "docker", "kubernetes", "ray"):
        assert f'"{backend}"' not in code, (rel, backend)


def test_no_backend_or_kit_module_imports_the_views() -> None:
    paths = [*(SRC / "schedulers" / "common").glob("*.py"), *(SRC / "schedulers").glob("*/*.py")]
    assert len(paths) > 10
    for path in paths:
        assert "tsm.views" not in _code(path), path


def test_the_views_import_no_backend_module() -> None:
    for path in (SRC / "views").glob("*.py"):
        code = _code(path)
        assert "schedulers.local" not in code and "import _os" not in code and "_scheduler(" not in code, path
