"""Run tracking: what a job records about itself (metadata, artifacts, sources), and its lineage.

Inside a job, :meth:`AppRun.run_from_env` gives the run of the app the job belongs to; code records
through it and every configured tracker backend stores the record::

    from tsm.tracker import AppRun

    run = AppRun.run_from_env()
    run.add_metadata(lr=0.01, epochs=3)
    run.add_artifact("model", "/data/ckpt/model.pt", {"format": "torchscript"})
    print(run.job_id(), [s.parent.job_id() for s in run.sources()], [c.job_id() for c in run.children()])

The environment contract (the runner sets it in every role; TorchX's names are set beside ours, and a
job reads either, ours first):

==============================  =================================  ==========================================
ours                            TorchX's                           value
==============================  =================================  ==========================================
``TSM_JOB_ID``                  ``TORCHX_JOB_ID``                  the app handle: the run id
``TSM_PARENT_RUN_ID``           ``TORCHX_PARENT_RUN_ID``           the run this one came from (if any)
``TSM_TRACKERS``                ``TORCHX_TRACKERS``                comma-separated tracker names
``TSM_TRACKER_<NAME>_CONFIG``   ``TORCHX_TRACKER_<NAME>_CONFIG``   that tracker's config string (if any)
==============================  =================================  ==========================================

Trackers are found by name: ``tsm`` is built in (:class:`tsm.tracker.store.StoreTracker`, runs in
``$TSM_HOME``'s store, no server); others come from the entry-point groups ``tsm.tracker`` and
``torchx.tracker`` (a factory ``f(config: str | None) -> TrackerBase``). Which trackers a launch
uses: ``$TSM_TRACKERS`` (or ``$TORCHX_TRACKERS``) of the launching process, else the config file's
trackers, else ``tsm``; an empty value turns tracking off.

**Lineage needs no server.** The parent of a launch is ``parent_run_id`` when given, else the
``TSM_JOB_ID`` (or ``TORCHX_JOB_ID``) of the launching process: an app launched from inside a job is
recorded as that job's child by the launcher (:func:`record_launch`), and again by the child when it
calls :meth:`AppRun.run_from_env` (both idempotent). TorchX never implemented ``lineage()`` or
``children()``; here both work.
"""

from __future__ import annotations

import functools
import os
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tsm._logging import module_logger, warn
from tsm.errors import TrackerError as TrackerError, UnknownRunError as UnknownRunError

#: The logger tracker warnings go to (``tracker.api.logger`` is that logger, made on first use).
LOGGER_NAME = "tsm.tracker"


#: ``tracker.api.logger`` is made on first use: logging is imported only when there is something to log
__getattr__ = module_logger(__name__, LOGGER_NAME)
#: a warning on the ``tsm.tracker`` logger
_warn = functools.partial(warn, logger=LOGGER_NAME)

ENV_JOB_ID = "TSM_JOB_ID"
ENV_PARENT_RUN_ID = "TSM_PARENT_RUN_ID"
ENV_TRACKERS = "TSM_TRACKERS"
ENV_TORCHX_JOB_ID = "TORCHX_JOB_ID"
ENV_TORCHX_PARENT_RUN_ID = "TORCHX_PARENT_RUN_ID"
ENV_TORCHX_TRACKERS = "TORCHX_TRACKERS"

#: The job id of a process not launched by tsm (writes go nowhere: no trackers are set up).
UNDEFINED_JOB_ID = "<UNDEFINED>"
#: Name of the built-in tracker (runs in the local store).
BUILTIN_TRACKER = "tsm"
#: Entry-point groups searched for tracker factories, highest precedence first.
ENTRY_POINT_GROUPS = ("tsm.tracker", "torchx.tracker")


@dataclass
class TrackerSource:
    """A source of a run, as a backend stores it: another run's id (or an external id) and its kind."""

    source_run_id: str
    artifact_name: str | None = None


@dataclass
class TrackerArtifact:
    """An artifact of a run: a name, where it is, and free-form metadata about it."""

    name: str
    path: str
    metadata: Mapping[str, object] | None = None


@dataclass
class AppRunTrackableSource:
    """A source of a run at the user level: the parent :class:`AppRun` and the kind of link."""

    parent: AppRun
    artifact_name: str | None = None


@dataclass(eq=False)
class Lineage:
    """A run with its ancestors (``parents``, recursively) and descendants (``children``, recursively).

    ``artifact_name`` is the kind of the link that led here from the run one level closer to the root
    of the query (None for the queried run and for plain parent/child links).

    The nodes form a DAG, not a tree: a run reached along several paths (a shared ancestor, a diamond)
    is one node that several lists reference, so the whole lineage is as big as its runs and edges, never
    one copy per path. Walk it with :meth:`ancestors` and :meth:`descendants`, which visit
    each run once; compared by identity (two lineages of the same runs are still two objects).
    """

    run_id: str
    artifact_name: str | None = None
    parents: list[Lineage] = field(default_factory=list)
    children: list[Lineage] = field(default_factory=list)

    def _breadth_first(self, up: bool) -> list[Lineage]:
        out: list[Lineage] = []
        seen = {id(self)}
        level = self.parents if up else self.children
        while level:
            nxt: list[Lineage] = []
            for n in level:
                if id(n) not in seen:
                    seen.add(id(n))
                    out.append(n)
                    nxt.extend(n.parents if up else n.children)
            level = nxt
        return out

    def ancestors(self) -> list[str]:
        """Every run id above this one, nearest first, each once."""
        return [n.run_id for n in self._breadth_first(up=True) if n.run_id != self.run_id]

    def descendants(self) -> list[str]:
        """Every run id below this one, nearest first, each once."""
        return [n.run_id for n in self._breadth_first(up=False) if n.run_id != self.run_id]


class TrackerBase(ABC):
    """A tracker backend: where runs' metadata, artifacts and sources are stored (TorchX's ``TrackerBase``).

    Every method takes the run id explicitly; :class:`AppRun` binds it. :meth:`children` is ours
    (TorchX has none); its default derives it from :meth:`lineage`.
    """

    @abstractmethod
    def add_artifact(self, run_id: str, name: str, path: str, metadata: Mapping[str, object] | None = None) -> None:
        """Record artifact ``name`` at ``path`` (replacing one of the same name)."""

    @abstractmethod
    def artifacts(self, run_id: str) -> Mapping[str, TrackerArtifact]:
        """The run's artifacts by name."""

    @abstractmethod
    def add_metadata(self, run_id: str, **kwargs: object) -> None:
        """Record metadata values (a later value of a key replaces the earlier one)."""

    @abstractmethod
    def metadata(self, run_id: str) -> Mapping[str, object]:
        """The run's metadata."""

    @abstractmethod
    def add_source(self, run_id: str, source_id: str, artifact_name: str | None = None) -> None:
        """Record that the run derives from ``source_id`` (another run, or an external id)."""

    @abstractmethod
    def sources(self, run_id: str, artifact_name: str | None = None) -> Iterable[TrackerSource]:
        """The run's sources, only those of kind ``artifact_name`` when given."""

    @abstractmethod
    def lineage(self, run_id: str) -> Lineage:
        """The run's ancestors and descendants."""

    @abstractmethod
    def run_ids(self, **kwargs: str) -> Iterable[str]:
        """Ids of the runs recorded, filtered by backend-specific keyword arguments."""

    def children(self, run_id: str) -> Iterable[str]:
        """Ids of the runs that name ``run_id`` as a source."""
        return [c.run_id for c in self.lineage(run_id).children]


TrackerFactory = Callable[[str | None], TrackerBase]


class MetricsTracker(ABC):
    """A tracker that also keeps metrics as series (a step per value): MLflow, W&B, TensorBoard."""

    @abstractmethod
    def log_metrics(self, run_id: str, metrics: Mapping[str, float], step: int | None = None) -> None:
        """Record one value of each metric at ``step`` (None: the backend's next step)."""


def _backend(module: str) -> TrackerFactory:
    """The factory ``create`` of ``tsm.tracker.<module>``, imported when the tracker is first built."""

    def factory(config: str | None) -> TrackerBase:
        import importlib

        created: TrackerBase = importlib.import_module(f"tsm.tracker.{module}").create(config)
        return created

    return factory


#: The trackers shipped with tsm besides the store, each with its client as an optional extra.
_BACKENDS: dict[str, TrackerFactory] = {
    "mlflow": _backend("mlflow_tracker"), "wandb": _backend("wandb_tracker"),
    "tensorboard": _backend("tensorboard_tracker"),
}


def tracker_config_env_var_name(name: str, prefix: str = "TSM") -> str:
    """``TSM_TRACKER_<NAME>_CONFIG`` (``prefix="TORCHX"`` gives TorchX's name)."""
    return f"{prefix}_TRACKER_{name.upper()}_CONFIG"


def tracker_factories() -> dict[str, TrackerFactory]:
    """Every tracker by name: the built-in ``tsm``, ``mlflow``, ``wandb`` and ``tensorboard``, then ``tsm.tracker``
    and ``torchx.tracker`` entry points.

    A plugin never replaces the built-in; a ``tsm.tracker`` name wins over the same ``torchx.tracker`` name.
    """
    out: dict[str, TrackerFactory] = {BUILTIN_TRACKER: _backend("store"), **_BACKENDS}
    for ep in _plugin_entry_points(tuple(sys.path)):
        if ep.name not in out:
            out[ep.name] = _lazy(ep)
    return out


@functools.lru_cache(maxsize=4)
def _plugin_entry_points(path: tuple[str, ...]) -> tuple[Any, ...]:
    """The tracker entry points of every group, in order, for one ``sys.path`` (the key: what can be found).

    Reading every installed distribution's metadata took about a third of ``Runner.run()``; a process asks
    once per ``sys.path``, so a plugin that a test or a user adds to the path is still found.
    """
    from tsm.runner.plugins import entry_points

    return tuple(entry_points(ENTRY_POINT_GROUPS))


def _lazy(ep: Any) -> TrackerFactory:
    def factory(config: str | None) -> TrackerBase:
        try:
            fn = ep.load()
        except Exception as e:  # noqa: BLE001 - a broken plugin is reported by name
            raise TrackerError(f"tracker '{ep.name}' ({ep.value}) cannot be loaded: {type(e).__name__}: {e}") from e
        tracker = fn(config)
        if not isinstance(tracker, TrackerBase):
            raise TrackerError(f"tracker '{ep.name}' ({ep.value}) returned {type(tracker).__name__}, not a TrackerBase")
        return tracker

    return factory


def _split(names: str) -> list[str]:
    return [n.strip() for n in names.split(",") if n.strip()]


def _env(environ: Mapping[str, str], ours: str, theirs: str) -> str | None:
    return environ.get(ours, environ.get(theirs))


def build_trackers(names_and_config: Mapping[str, str | None]) -> list[TrackerBase]:
    """Tracker instances for ``{name: config}``; an unknown name raises :class:`TrackerError`."""
    factories = tracker_factories()
    out = []
    for name, config in names_and_config.items():
        if name not in factories:
            from tsm.errors import did_you_mean

            raise TrackerError(
                f"unknown tracker '{name}'{did_you_mean(name, factories)}; available: {', '.join(sorted(factories))}"
            )
        out.append(factories[name](config))
    return out


def trackers_from_environ(environ: Mapping[str, str] | None = None) -> list[TrackerBase]:
    """The trackers a job's environment names (``TSM_TRACKERS`` / ``TORCHX_TRACKERS``) with their configs.

    Inside a job an unknown or broken tracker must not take the job down: it is logged as a warning
    and left out (the launcher already refused unknown names).
    """
    environ = os.environ if environ is None else environ
    names = _env(environ, ENV_TRACKERS, ENV_TORCHX_TRACKERS)
    if not names:
        return []
    out = []
    for name in _split(names):
        config = _env(environ, tracker_config_env_var_name(name), tracker_config_env_var_name(name, "TORCHX"))
        try:
            out.extend(build_trackers({name: config}))
        except TrackerError as e:
            _warn("tracking: %s; this run records nothing there", e)
    return out


def configured_trackers(config: Any = None, environ: Mapping[str, str] | None = None) -> dict[str, str | None]:
    """``{tracker name: config}`` a launch uses: environment, else config file, else the built-in tracker.

    The launching process's ``TSM_TRACKERS`` (or ``TORCHX_TRACKERS``) wins; else ``config.trackers``
    (a mapping of name to config string, or a list of names: ``.torchxconfig``'s ``[torchx:tracker]``)
    when it names any; else ``{"tsm": None}``. ``TSM_TRACKERS=""`` turns tracking off.
    ``TSM_TRACKER_<NAME>_CONFIG`` / ``TORCHX_TRACKER_<NAME>_CONFIG`` override a tracker's config.
    """
    environ = os.environ if environ is None else environ
    names = _env(environ, ENV_TRACKERS, ENV_TORCHX_TRACKERS)
    chosen: dict[str, str | None]
    if names is not None:
        chosen = {n: None for n in _split(names)}
    else:
        from_file = getattr(config, "trackers", None)
        if isinstance(from_file, Mapping) and from_file:
            chosen = {str(k): (None if v in (None, "") else str(v)) for k, v in from_file.items()}
        elif isinstance(from_file, (list, tuple)) and from_file:
            chosen = {str(n): None for n in from_file}
        else:
            chosen = {BUILTIN_TRACKER: None}
    for name in chosen:
        override = _env(environ, tracker_config_env_var_name(name), tracker_config_env_var_name(name, "TORCHX"))
        if override is not None:
            chosen[name] = override
    return chosen


def launch_parent(parent_run_id: str | None = None, environ: Mapping[str, str] | None = None) -> str | None:
    """The parent run of a launch: ``parent_run_id``, else the launching job's own ``TSM_JOB_ID``/``TORCHX_JOB_ID``."""
    if parent_run_id:
        return parent_run_id
    environ = os.environ if environ is None else environ
    job = _env(environ, ENV_JOB_ID, ENV_TORCHX_JOB_ID)
    return job if job and job != UNDEFINED_JOB_ID else None


def tracker_env(
    handle: str,
    parent_run_id: str | None = None,
    config: Any = None,
    environ: Mapping[str, str] | None = None,
    torchx: bool = True,
    app: Any = None,
) -> dict[str, str]:
    """The variables the runner adds to every role of the app ``handle`` (ours, and TorchX's unless ``torchx=False``).

    ``handle`` may hold the ``${app_id}`` macro (the scheduler fills it per replica). The parent is
    :func:`launch_parent`; trackers are :func:`configured_trackers`. An unknown tracker name raises
    :class:`TrackerError` here, at launch, rather than inside the job. Given the ``app``, the run of each
    tracker that every attempt shares is fixed here too (:func:`tsm.tracker.attempts.attempt_env`; an
    MLflow run is created), its roles' own values winning.
    """
    env = _tracker_env(handle, parent_run_id, config, environ)
    if app is not None:
        from tsm.tracker.attempts import attempt_env

        trackers = configured_trackers(config, environ)
        parent = env.get(ENV_PARENT_RUN_ID)
        env.update(attempt_env(handle, trackers, [r.env for r in app.roles], parent, environ, getattr(app, "name", None)))
    if not torchx:
        env = {k: v for k, v in env.items() if not k.startswith("TORCHX_")}
    return env


def _tracker_env(handle: str, parent_run_id: str | None, config: Any, environ: Mapping[str, str] | None) -> dict[str, str]:
    env = {ENV_JOB_ID: handle, ENV_TORCHX_JOB_ID: handle}
    parent = launch_parent(parent_run_id, environ)
    if parent:
        env[ENV_PARENT_RUN_ID] = env[ENV_TORCHX_PARENT_RUN_ID] = parent
    trackers = configured_trackers(config, environ)
    known = tracker_factories()
    for name in trackers:
        if name not in known:
            from tsm.errors import did_you_mean

            raise TrackerError(
                f"unknown tracker '{name}'{did_you_mean(name, known)}; available: {', '.join(sorted(known))}"
            )
    env[ENV_TRACKERS] = env[ENV_TORCHX_TRACKERS] = ",".join(trackers)
    for name, value in trackers.items():
        if value is not None:
            env[tracker_config_env_var_name(name)] = env[tracker_config_env_var_name(name, "TORCHX")] = value
    return env


def record_launch(
    handle: str, parent_run_id: str | None = None, config: Any = None, environ: Mapping[str, str] | None = None
) -> str | None:
    """After a launch: record ``handle``'s parent in every configured tracker; returns the parent (or None).

    The runner calls it once the scheduler has accepted the app, so lineage holds even when the child
    never calls :meth:`AppRun.run_from_env`. A tracker that fails is logged, never fatal: the app runs.
    """
    parent = launch_parent(parent_run_id, environ)
    if not parent:
        return None
    for name, value in configured_trackers(config, environ).items():
        try:
            for tracker in build_trackers({name: value}):
                tracker.add_source(handle, parent, None)
        except Exception as e:  # noqa: BLE001 - a tracker must never cost the launched app its handle
            _warn("launched %s but tracker '%s' could not record its parent %s: %s", handle, name, parent, e)
    return parent


def record_scheduled(handle: str, app: Any) -> str | None:
    """After the scheduler accepted ``app`` as ``handle``: record its parent where its roles were told to.

    Reads what :func:`tracker_env` put in the first role's env (parent and trackers), so the record
    matches what the job sees. Returns the parent, or None when there is none or tracking is off.
    Never raises for a tracker's failure (logged): the app runs either way.
    """
    roles = getattr(app, "roles", None) or []
    env: Mapping[str, str] = roles[0].env if roles else {}
    _mark_scheduled(handle, env)
    parent = _env(env, ENV_PARENT_RUN_ID, ENV_TORCHX_PARENT_RUN_ID)
    names = _env(env, ENV_TRACKERS, ENV_TORCHX_TRACKERS)
    if not parent or not names:
        return None
    for name in _split(names):
        config = _env(env, tracker_config_env_var_name(name), tracker_config_env_var_name(name, "TORCHX"))
        try:
            for tracker in build_trackers({name: config}):
                tracker.add_source(handle, parent, None)
        except Exception as e:  # noqa: BLE001 - a tracker must never cost the launched app its handle
            _warn("launched %s but tracker '%s' could not record its parent %s: %s", handle, name, parent, e)
    return parent


def _mark_scheduled(handle: str, env: Mapping[str, str]) -> None:
    if "TSM_MLFLOW_RUN_ID" not in env:
        return
    from tsm.tracker.attempts import mark_scheduled

    try:
        mark_scheduled(handle, env)
    except Exception as e:  # noqa: BLE001 - a tracker must never cost the launched app its handle
        _warn("launched %s but could not tag its MLflow run %s with it: %s", handle, env["TSM_MLFLOW_RUN_ID"], e)


_RUN_CACHE: dict[tuple[str | None, ...], AppRun] = {}


@dataclass
class AppRun:
    """The run of the app this process belongs to, bound to its tracker backends.

    Writes go to every backend; reads (:meth:`sources`, :meth:`children`, :meth:`metadata`, ...) ask
    the first one. With no backends (not launched by tsm, or tracking off) writes do nothing and reads
    are empty.
    """

    id: str
    backends: Iterable[TrackerBase] = field(default_factory=list)

    @staticmethod
    def run_from_env() -> AppRun:
        """The run described by the environment (see the module doc); the same object for the same env.

        When ``TSM_PARENT_RUN_ID`` (or TorchX's) is set, the parent is recorded as a source of this run.
        """
        keys = (ENV_JOB_ID, ENV_TORCHX_JOB_ID, ENV_PARENT_RUN_ID, ENV_TORCHX_PARENT_RUN_ID, ENV_TRACKERS, ENV_TORCHX_TRACKERS)
        names = _env(os.environ, ENV_TRACKERS, ENV_TORCHX_TRACKERS) or ""
        configs = tuple(
            _env(os.environ, tracker_config_env_var_name(n), tracker_config_env_var_name(n, "TORCHX")) for n in _split(names)
        )
        cache_key = tuple(os.environ.get(k) for k in keys) + configs
        if cache_key in _RUN_CACHE:
            return _RUN_CACHE[cache_key]
        job_id = _env(os.environ, ENV_JOB_ID, ENV_TORCHX_JOB_ID) or UNDEFINED_JOB_ID
        run = AppRun(job_id, trackers_from_environ())
        parent = _env(os.environ, ENV_PARENT_RUN_ID, ENV_TORCHX_PARENT_RUN_ID)
        if parent and job_id != UNDEFINED_JOB_ID:
            run.add_source(parent)
        _RUN_CACHE[cache_key] = run
        return run

    def job_id(self) -> str:
        """This run's id (the app handle)."""
        return self.id

    def _first(self) -> TrackerBase | None:
        return next(iter(self.backends), None)

    def add_metadata(self, **kwargs: object) -> None:
        """Record metadata on every backend."""
        for backend in self.backends:
            backend.add_metadata(self.id, **kwargs)

    def metadata(self) -> Mapping[str, object]:
        """This run's metadata (first backend)."""
        first = self._first()
        return first.metadata(self.id) if first else {}

    def log_metrics(self, step: int | None = None, **metrics: float) -> None:
        """Record a value of each metric at ``step`` on every backend that keeps series (:class:`MetricsTracker`:
        MLflow, W&B, TensorBoard); the others keep nothing of it."""
        for backend in self.backends:
            if isinstance(backend, MetricsTracker):
                backend.log_metrics(self.id, metrics, step)

    def add_artifact(self, name: str, path: str, metadata: Mapping[str, object] | None = None) -> None:
        """Record an artifact on every backend."""
        for backend in self.backends:
            backend.add_artifact(self.id, name, path, metadata)

    def artifacts(self) -> Mapping[str, TrackerArtifact]:
        """This run's artifacts (first backend)."""
        first = self._first()
        return first.artifacts(self.id) if first else {}

    def add_source(self, source_id: str, artifact_name: str | None = None) -> None:
        """Record that this run derives from ``source_id`` on every backend."""
        for backend in self.backends:
            backend.add_source(self.id, source_id, artifact_name)

    def sources(self) -> list[AppRunTrackableSource]:
        """This run's sources as runs (first backend)."""
        first = self._first()
        if first is None:
            return []
        return [AppRunTrackableSource(AppRun(s.source_run_id, self.backends), s.artifact_name) for s in first.sources(self.id)]

    def children(self) -> list[AppRun]:
        """Runs that name this one as a source (first backend)."""
        first = self._first()
        return [AppRun(c, self.backends) for c in first.children(self.id)] if first else []

    def lineage(self) -> Lineage:
        """This run's ancestors and descendants (first backend)."""
        first = self._first()
        return first.lineage(self.id) if first else Lineage(self.id)
