"""Scheduler parameters and run options: where the runner gets them and how a factory or a dry run gets them.

Parameters given to the runner (``get_runner(namespace="ml")``) are passed to every scheduler factory it
calls; a factory that does not take one refuses it with
:class:`~tsm.schedulers.common.factory.UnknownSchedulerParamError` naming it (the factory rule, see
:mod:`tsm.schedulers.common.factory`), which the caller sees. Parameters read from the environment
(``TSM_NAMESPACE=ml``) are only *offered*: a factory that refuses one is called again without it, so an
environment variable meant for one backend does not break the others. Nothing here looks at a factory's
signature or module.

A plugin factory written for TorchX with fixed parameters raises a plain ``TypeError`` instead; then the
offered parameters are dropped and the factory called again, and a ``TypeError`` for parameters the caller
gave becomes an :class:`~tsm.errors.InvalidRunOptionError`.
"""

from __future__ import annotations

import builtins
import os
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from typing import Any

from tsm.errors import ConfigError, InvalidRunOptionError, UnknownSchedulerError, did_you_mean
from tsm.schedulers.api import Scheduler
from tsm.specs.runopts import CfgVal, runopts

TYPE_CHECKING = False
if TYPE_CHECKING:
    from tsm.runner.config import Config
    from tsm.specs.api import AppDef

#: Environment variables named ``TSM_<PARAM>`` become scheduler parameter ``<param>``.
ENV_PREFIX = "TSM_"

#: ``TSM_*`` variables that are tsm's own settings or a replica's environment, never scheduler params.
RESERVED_ENV = frozenset({
    "TSM_HOME", "TSM_STORE_TIMEOUT", "TSM_APP_ID", "TSM_APP_HANDLE", "TSM_ROLE_NAME", "TSM_REPLICA_ID",
    "TSM_NUM_REPLICAS", "TSM_RANK0_HOST", "TSM_PARENT_RUN_ID", "TSM_SUPERVISOR", "TSM_TIMER_SOCKET",
    "TSM_JOB_DIR", "TSM_JOB_ID", "TSM_TRACKERS", "TSM_KILL_GRACE", "TSM_DEBUG", "TSM_WORKSPACE",
    "TSM_LAUNCHER", "TSM_OWNER", "TSM_SERVE_TOKEN", "TSM_TORCHX_ALIAS", "TSM_PYTHON", "TSM_PYTHON_BIN",
    "TSM_ATTEMPT", "TSM_RESTART_COUNT", "TSM_LAST_EXIT", "TSM_WARN_SIGNAL", "TSM_WARN_RELAY", "TSM_KEEPER",
    "TSM_TENSORBOARD_DIR", "TSM_MLFLOW_RUN_ID",
})

#: Prefixes of ``TSM_*`` variables tsm sets per port or tracker, or that configure the project's engine
#: scripts and their tests (``TSM_K8S_CACHE``, ``TSM_DOCKER_CACHE``, ``TSM_TEST_*``): never scheduler params.
RESERVED_ENV_PREFIXES = ("TSM_PORT_", "TSM_TRACKER_", "TSM_K8S_", "TSM_DOCKER_", "TSM_SLURM_", "TSM_RAY_",
                         "TSM_TEST_", "TSM_LAUNCHER_", "TSM_CLI_", "TSM_KEEPER_", "TSM_NEMO_", "TSM_SWEEP_")

#: The run option (accepted by every scheduler through the runner) that turns TorchX's names off.
TORCHX_ENV_OPTION = "torchx_env"
#: The runner's own run options: every scheduler takes them, the runner handles them (see :func:`with_runner_opts`).
RUNNER_OPTIONS = (TORCHX_ENV_OPTION, "secrets", "trackers", "on_state")

SchedulerFactory = Callable[..., Scheduler]


def scheduler_params_from_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """``TSM_<NAME>=value`` variables as scheduler params ``{"<name>": "value"}`` (see :data:`RESERVED_ENV`)."""
    env = os.environ if environ is None else environ
    return {
        k[len(ENV_PREFIX):].lower(): v
        for k, v in env.items()
        if k.startswith(ENV_PREFIX) and len(k) > len(ENV_PREFIX) and k not in RESERVED_ENV
        and not k.startswith(RESERVED_ENV_PREFIXES)
    }


def make_scheduler(
    name: str, factory: SchedulerFactory, session: str, params: Mapping[str, object], offered: Collection[str]
) -> Scheduler:
    """``factory(session, **params)``, where the keys in ``offered`` came from the environment only (see the
    module docstring for what happens when the factory refuses a parameter)."""
    from tsm.schedulers.common.factory import UnknownSchedulerParamError

    params = dict(params)
    offered = {k for k in offered if k in params}
    while True:
        try:
            return factory(session, **params)
        except UnknownSchedulerParamError as e:
            if e.param not in offered:
                raise
            offered.discard(e.param)  # only offered: this backend does not take it
            params.pop(e.param)
        except TypeError as e:  # a plugin factory with fixed parameters
            if offered:
                for key in offered:
                    params.pop(key)
                offered = set()
                continue
            if not params or "argument" not in str(e):
                raise
            raise InvalidRunOptionError(
                f"scheduler '{name}' does not take the scheduler parameter(s) given to the runner "
                f"({', '.join(sorted(params))}): {e}",
                scheduler=name,
            ) from e


class RegistryFactories(Mapping[str, SchedulerFactory]):
    """Every registered scheduler as a read-only ``{name: factory}`` mapping: what ``Runner._scheduler_factories``
    is when the runner was given none (TorchX's attribute, so a subclass can read it). A factory's module is
    imported only when it is looked up; an unknown name is a ``KeyError``."""

    def _names(self) -> builtins.list[str]:
        from tsm.schedulers import scheduler_names

        return scheduler_names()

    def __getitem__(self, name: str) -> SchedulerFactory:
        from tsm.schedulers import get_scheduler_factory

        if name not in self._names():
            raise KeyError(name)
        return get_scheduler_factory(name)

    def __contains__(self, name: object) -> bool:
        return name in self._names()

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __len__(self) -> int:
        return len(self._names())

    def __repr__(self) -> str:
        return f"RegistryFactories({self._names()!r})"


def factory_of(factories: Mapping[str, SchedulerFactory], name: str) -> SchedulerFactory:
    """``factories[name]``, or :class:`~tsm.errors.UnknownSchedulerError` with a did-you-mean."""
    if name in factories:
        return factories[name]
    names = builtins.list(factories)
    where = "available" if isinstance(factories, RegistryFactories) else "this runner has"
    raise UnknownSchedulerError(
        f"unknown scheduler '{name}'{did_you_mean(name, names)}; {where}: {', '.join(names) or 'none'}",
        scheduler=name,
    )


def cfg_json(cfg: Mapping[str, Any] | None) -> str | None:
    """A run config as the JSON events carry (None when empty)."""
    import json

    if not cfg:
        return None
    shown = dict(cfg)
    if isinstance(shown.get("on_state"), str):  # a hook's URL may hold a token: its host only
        from tsm.runner.hooks import describe

        shown["on_state"] = describe(shown["on_state"])
    return json.dumps(shown, default=str, sort_keys=True)


#: Run options a project's config file may not set (it would act with the user's rights), and why.
_USERS_OWN = {"secrets": "hands your environment's and files' values to the app",
              "on_state": "runs a command or sends your apps' states to a URL"}


def resolve_cfg(config: Config, scheduler: str, opts: runopts, cfg: Mapping[str, CfgVal] | None) -> dict[str, CfgVal]:
    """The config files' run options of ``scheduler`` under ``cfg`` (which wins); a bad file option is reported
    with its file (:class:`~tsm.errors.ConfigError`), one a shared ``.torchxconfig`` names but ``opts`` lacks
    is ignored with a warning, as TorchX does."""
    from tsm._logging import warn

    file_cfg = dict(config.scheduler_cfg.get(scheduler, {}))
    for key, value in file_cfg.items():
        origin = config.origin.get((scheduler, key), "config file")
        if key in _USERS_OWN and not _users_own(origin):
            raise ConfigError(
                f"{origin}: [scheduler.{scheduler}] run option '{key}' {_USERS_OWN[key]}, so it is taken only from "
                f"the command line (-c {key}=...) or your own config file (~/.config/tsm/config.toml, "
                "~/.torchxconfig), not from a project's"
            )
        if key in RUNNER_OPTIONS:
            continue
        opt = opts.get(key)
        if opt is None:
            if config.lenient.get((scheduler, key)):
                warn("%s: [%s] '%s' is not a run option of the %s scheduler; ignored", origin, scheduler, key, scheduler)
                continue
            raise ConfigError(
                f"{origin}: [scheduler.{scheduler}] unknown run option '{key}'{did_you_mean(key, dict(opts))}; "
                f"`tsm runopts {scheduler}` lists them"
            )
        if opt.trusted and not _users_own(origin):
            raise ConfigError(
                f"{origin}: [scheduler.{scheduler}] run option '{key}' can make this machine run commands (the file "
                f"it names may hold an exec plugin), so it is taken only from the command line (-c {key}=...) or "
                "your own config file (~/.config/tsm/config.toml, ~/.torchxconfig), not from a project's"
            )
        alone = runopts()  # check this one option's type without demanding the required ones
        alone.add(key, opt.type_, opt.help)
        try:
            alone.resolve({key: value})
        except InvalidRunOptionError as e:
            raise ConfigError(f"{origin}: [scheduler.{scheduler}] {e}") from e
    out = {k: v for k, v in file_cfg.items() if k in opts or k in RUNNER_OPTIONS}
    out.update(cfg or {})
    return out


def _users_own(path: str) -> bool:
    from tsm.runner.config import users_own

    return users_own(path)


def flag(value: Any) -> bool:
    """The ``torchx_env`` run option's value as a bool (a string from a file or ``-c`` is parsed)."""
    if isinstance(value, str):
        from tsm.specs.runopts import parse_cfg_value

        return bool(parse_cfg_value(TORCHX_ENV_OPTION, value, bool))
    if not isinstance(value, bool):
        raise InvalidRunOptionError(f"run option '{TORCHX_ENV_OPTION}' expects bool, got {value!r}")
    return value


def add_job_env(app: AppDef, handle: str, parent_run_id: str | None, config: Config, torchx: bool,
                trackers: object = None) -> None:
    """Give every role of ``app`` ``TSM_APP_HANDLE`` and the run-tracking contract (job id, parent run,
    trackers: :func:`tsm.tracker.api.tracker_env`, and each tracker's run that every attempt shares), with
    TorchX's names unless ``torchx`` is False; a role's own value of any of them stays. ``trackers`` (the run
    option, a list of names) chooses the trackers as ``TSM_TRACKERS`` would, over the config files'."""
    import os

    from tsm.tracker.api import ENV_TRACKERS, tracker_env

    environ = None
    if isinstance(trackers, str):  # as a config file or an untyped -c gives it
        trackers = trackers.replace(";", ",").split(",")
    if trackers is not None:
        if not isinstance(trackers, list) or not all(isinstance(t, str) for t in trackers):
            raise InvalidRunOptionError(f"trackers: expected a list of tracker names, got {trackers!r}")
        environ = {**os.environ, ENV_TRACKERS: ",".join(t.strip() for t in trackers if t.strip())}
    job_env = tracker_env(handle, parent_run_id, config=config, environ=environ, torchx=torchx, app=app)
    for role in app.roles:
        role.env.setdefault("TSM_APP_HANDLE", handle)
        for key, value in job_env.items():
            role.env.setdefault(key, value)


def with_runner_opts(opts: runopts) -> runopts:
    """A scheduler's run options ``opts`` plus the runner's own: ``torchx_env``, ``secrets``, ``trackers``, ``on_state``."""
    out = runopts()
    out.update(opts)
    if TORCHX_ENV_OPTION not in out:
        out.add(TORCHX_ENV_OPTION, bool, "also set TorchX's variable names (TORCHX_JOB_ID, ...) in each "
                "replica's environment (handled by the runner)", default=True)
    if "secrets" not in out:
        out.add("secrets", list[str], "secrets every replica gets as environment variables, read at submit and "
                "never stored or shown: NAME (from your environment), NAME:file:PATH, NAME:k8s:SECRET/KEY")
    if "trackers" not in out:
        out.add("trackers", list[str], "the run trackers of the app (tsm, mlflow, wandb, tensorboard, a plugin's), "
                "as TSM_TRACKERS names them; each one's config from TSM_TRACKER_<NAME>_CONFIG or the config files")
    if "on_state" not in out:
        out.add("on_state", str, "told of each state change of the app, by tsm's helper (at least once, retried): "
                "an http(s):// URL gets a JSON POST, anything else is a command run with the handle, the old and "
                "new state and the message as arguments")
    return out


def add_secrets(app: AppDef, value: object, sched: Scheduler, scheduler: str) -> None:
    """Add the ``secrets`` run option's entries to every role of ``app`` and check the whole declaration
    (:func:`tsm.specs.secrets.app_secrets`: one source per name, never also in ``env``) against what
    ``sched`` can deliver (:class:`~tsm.schedulers.api.Secrets`)."""
    if value is None and not any(role.secrets for role in app.roles):
        return
    from tsm.errors import InvalidAppError, NotSupportedError
    from tsm.schedulers.api import Secrets
    from tsm.specs.secrets import app_secrets, option_entries

    entries = option_entries(value)
    for role in app.roles:
        role.secrets = [*role.secrets, *(e for e in entries if e not in role.secrets)]
    refs = app_secrets(app.roles)
    if not refs:
        return
    for name in refs:
        if name in RESERVED_ENV or name.startswith((*RESERVED_ENV_PREFIXES, "TORCHX_")) or name == "PATH":
            raise InvalidAppError(f"secret {name}: a variable tsm or the system sets in each replica; give the "
                                  "secret another name", scheduler=scheduler)
    if not isinstance(sched, Secrets):
        raise NotSupportedError(f"the {scheduler} scheduler does not deliver secrets; run it without "
                                f"{', '.join(sorted(refs))}", scheduler=scheduler)
    for ref in refs.values():
        if ref.kind not in sched.secret_kinds:
            raise NotSupportedError(f"secret {ref}: the {scheduler} scheduler takes secrets from "
                                    f"{' or '.join(sched.secret_kinds)}, not {ref.kind}", scheduler=scheduler)


def cfg_from_strs(opts: runopts, literals: Iterable[str]) -> dict[str, CfgVal]:
    """``"k=v,k2=a;b"`` strings parsed into typed run options of ``opts`` and merged; an option two of them
    give is an :class:`~tsm.errors.InvalidRunOptionError` naming it (never the last one silently)."""
    out: dict[str, CfgVal] = {}
    for text in literals:
        for key, value in opts.cfg_from_str(text).items():
            if key in out:
                raise InvalidRunOptionError(f"run option '{key}' is given twice ({out[key]!r} and {value!r}); give it once")
            out[key] = value
    return out
