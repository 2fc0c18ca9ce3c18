"""Defaults from config files: the default scheduler, run options per scheduler, arguments per component.

Files, highest precedence first (the command line beats them all):

1. the project file: ``tsm.toml`` in the working directory, else ``[tool.tsm]`` of its ``pyproject.toml``;
2. the user file: ``$XDG_CONFIG_HOME/tsm/config.toml`` (default ``~/.config/tsm/config.toml``);
3. TorchX's ``.torchxconfig`` files, with TorchX's own precedence among them: only ``$TORCHXCONFIG``
   when that is set (empty: none), else the user's ``~/.torchxconfig`` over the project's
   ``./.torchxconfig`` (TorchX lays the user file "on top of the one defined at the project root").

The two tsm files have the same shape::

    default_scheduler = "local"    # default scheduler for run / dryrun

    [scheduler.local]              # run options, as with -c
    grace_period = 5.0

    [component."dist.ddp"]         # component argument defaults, as on the command line
    j = "2x1"

A ``.torchxconfig`` is INI, read as TorchX reads it::

    [cli:run]                      # default scheduler, and the component run when none is named
    scheduler = local
    component = dist.ddp

    [local]                        # run options of one scheduler, as strings
    log_dir = /tmp/logs

    [component:dist.ddp]           # component argument defaults
    j = 1x2

    [torchx:tracker]               # trackers, each configured in [tracker:<name>]
    my_tracker =

    [tracker:my_tracker]
    config = s3://bucket/config.json

Because a ``.torchxconfig`` is shared with TorchX, a run option in it that a scheduler does not declare
is ignored with a warning (as TorchX does), where the same in a tsm file is an error.

A file that is not TOML (or INI), or holds an unknown key or a value of the wrong shape, raises
:class:`~tsm.errors.ConfigError` naming the file. Scheduler names are not checked here: a shared user
file may configure schedulers installed elsewhere.

TorchX's ``torchx.runner.config`` functions are here under the same names and parameters:
:func:`find_configs`, :func:`load`, :func:`apply`, :func:`dump`, :func:`get_configs`,
:func:`get_config` and :func:`load_sections`.
"""

from __future__ import annotations

import configparser
import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from tsm._logging import warn as _warn
from tsm.errors import ConfigError, ConfigFileNotFoundError, UnknownSchedulerError, did_you_mean
from tsm.schedulers import get_scheduler_factories

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

_KEYS = ("default_scheduler", "scheduler", "component")


@dataclass
class Config:
    """Merged defaults and where each came from."""

    default_scheduler: str | None = None
    #: the file that set ``default_scheduler`` (for errors about it), or None
    default_scheduler_origin: str | None = None
    #: ``.torchxconfig``'s ``[cli:run] component``: the component run when none is named (TorchX's), or None
    default_component: str | None = None
    scheduler_cfg: dict[str, dict[str, Any]] = field(default_factory=dict)
    component_defaults: dict[str, dict[str, str]] = field(default_factory=dict)
    #: for error messages: (scheduler, option) -> file that set it
    origin: dict[tuple[str, str], str] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)
    #: (scheduler, option) pairs set by a ``.torchxconfig``: an undeclared one is warned about, not refused
    lenient: dict[tuple[str, str], bool] = field(default_factory=dict)
    #: ``[torchx:tracker]`` names with their ``[tracker:<name>] config`` (None when not set); what
    #: :func:`tsm.tracker.api.configured_trackers` uses when the environment names none
    trackers: dict[str, str | None] = field(default_factory=dict)


    def component(self, name: str | None) -> str:
        """``name``, else :attr:`default_component`; ComponentNotFoundError when neither says which."""
        if name:
            return name
        if not self.default_component:
            from tsm.errors import ComponentNotFoundError

            raise ComponentNotFoundError("no component named, and no config file names one ([cli:run] component)")
        return self.default_component


def users_own(path: str) -> bool:
    """Whether config file ``path`` is the user's own (the user file, ``~/.torchxconfig`` or ``$TORCHXCONFIG``),
    not a project file found in the working directory: only those may set a trusted run option."""
    own = {user_config_path(), Path.home() / CONFIG_FILE}
    if os.environ.get(ENV_TORCHXCONFIG):
        own.add(Path(os.environ[ENV_TORCHXCONFIG]))
    try:
        return Path(path).resolve() in {p.resolve() for p in own}
    except OSError:
        return False


def user_config_path() -> Path:
    """``$XDG_CONFIG_HOME/tsm/config.toml`` (``~/.config/tsm/config.toml``)."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "tsm" / "config.toml"


def _read(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            data: dict[str, Any] = tomllib.load(f)
            return data
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from e
    except UnicodeDecodeError as e:  # tomllib decodes the bytes itself and lets this through
        raise ConfigError(f"{path}: not valid TOML: not UTF-8 text ({e.reason} at byte {e.start})") from e
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror}") from e


def _check(data: dict[str, Any], where: str) -> dict[str, Any]:
    for key, value in data.items():
        if key not in _KEYS:
            raise ConfigError(f"{where}: unknown key '{key}'{did_you_mean(key, _KEYS)}; allowed: {', '.join(_KEYS)}")
        if key == "default_scheduler" and not isinstance(value, str):
            raise ConfigError(f"{where}: 'default_scheduler' must be a scheduler name (a string)")
        if key == "scheduler" and (
            not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values())
        ):
            raise ConfigError(f"{where}: use tables [scheduler.<name>] of run option = value")
        if key == "component" and (
            not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values())
        ):
            raise ConfigError(f"{where}: use tables [component.\"<name>\"] of argument = value")
    return data


def _project(cwd: Path) -> tuple[dict[str, Any], str] | None:
    tsm_toml = cwd / "tsm.toml"
    if tsm_toml.is_file():
        return _check(_read(tsm_toml), str(tsm_toml)), str(tsm_toml)
    pyproject = cwd / "pyproject.toml"
    if pyproject.is_file():
        tools = _read(pyproject).get("tool", {})
        tool = tools.get("tsm") if isinstance(tools, dict) else None
        if tool is not None:
            if not isinstance(tool, dict):
                raise ConfigError(f"{pyproject}: [tool.tsm] must be a table")
            return _check(tool, f"{pyproject} [tool.tsm]"), str(pyproject)
    return None


def load_config(cwd: str | Path | None = None) -> Config:
    """Read and merge the ``.torchxconfig`` files, the user file and the project file (project wins)."""
    cfg = Config()
    _merge_torchx(cfg, Path(cwd) if cwd else Path.cwd())
    layers: list[tuple[dict[str, Any], str]] = []
    user = user_config_path()
    if user.is_file():
        layers.append((_check(_read(user), str(user)), str(user)))
    project = _project(Path(cwd) if cwd else Path.cwd())
    if project:
        layers.append(project)
    for data, source in layers:  # lowest precedence first
        cfg.files.append(source)
        if "default_scheduler" in data:
            cfg.default_scheduler = data["default_scheduler"]
            cfg.default_scheduler_origin = source
        for name, opts in (data.get("scheduler") or {}).items():
            cfg.scheduler_cfg.setdefault(name, {}).update(opts)
            for opt in opts:
                cfg.origin[(name, opt)] = source
                cfg.lenient.pop((name, opt), None)
        for comp, args in (data.get("component") or {}).items():
            cfg.component_defaults.setdefault(comp, {}).update({k: _arg_text(v) for k, v in args.items()})
    return cfg


def _arg_text(value: Any) -> str:
    """A component default as the command line would spell it (the components' own rendering)."""
    from tsm.components.cmdline import format_value

    return "" if value == "" else format_value(value)


# -- .torchxconfig (TorchX's INI config) ------------------------------------------------------------------
#: The file name TorchX looks for.
CONFIG_FILE = ".torchxconfig"
#: The variable naming the one ``.torchxconfig`` to read (set but empty: read none).
ENV_TORCHXCONFIG = "TORCHXCONFIG"
#: Between a section's prefix and its name: ``[component:dist.ddp]``.
CONFIG_PREFIX_DELIM = ":"


def _configparser() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(delimiters=("=",), interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # keys keep their case, as in TorchX
    return parser


def _read_ini(path: str | Path) -> configparser.ConfigParser:
    parser = _configparser()
    try:
        with open(path, encoding="utf-8") as f:
            parser.read_file(f, source=str(path))
    except configparser.Error as e:
        raise ConfigError(f"{path}: not a valid config file: {' '.join(str(e).split())}") from e
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not a valid config file: not UTF-8 text ({e.reason} at byte {e.start})") from e
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror}") from e
    return parser


#: Where :func:`find_configs` looks when given no directories (TorchX's name; None: home, then the working
#: directory, as they are when it is called).
DEFAULT_CONFIG_DIRS: list[str] | None = None


def find_configs(dirs: Iterable[str] | None = None) -> list[str]:
    """The ``.torchxconfig`` files to read, highest precedence first.

    ``$TORCHXCONFIG`` alone when set (empty: none; naming a missing file is a ConfigError that is also a
    ``FileNotFoundError``); else ``.torchxconfig`` in each of ``dirs`` that has one (default
    :data:`DEFAULT_CONFIG_DIRS`: home, then the working directory; a directory named twice is read once).
    """
    env = os.environ.get(ENV_TORCHXCONFIG)
    if env is not None:
        if not env:
            return []
        if not Path(env).is_file():
            raise ConfigFileNotFoundError(f"${ENV_TORCHXCONFIG} is set to {env!r}, which is not a file")
        return [env]
    if not dirs:
        dirs = DEFAULT_CONFIG_DIRS if DEFAULT_CONFIG_DIRS is not None else default_config_dirs()
    found: list[str] = []
    for d in dirs:
        path = str(Path(d) / CONFIG_FILE)
        if path not in found and (Path(d) / CONFIG_FILE).is_file():
            found.append(path)
    return found


def default_config_dirs() -> list[str]:
    """Where ``.torchxconfig`` files are looked for, the winning one first: ``$HOME``, then the working directory."""
    return [str(Path.home()), str(Path.cwd())]


def _merge_torchx(cfg: Config, cwd: Path) -> None:
    """Fill ``cfg`` from the ``.torchxconfig`` files (lowest precedence: applied before the tsm files)."""
    dirs = [str(Path.home()), str(cwd)]
    for path in reversed(find_configs(dirs)):  # the lowest first; later ones win
        ini = _read_ini(path)
        cfg.files.append(path)
        for section in ini.sections():
            prefix, delim, name = section.partition(CONFIG_PREFIX_DELIM)
            items = dict(ini.items(section))
            if not delim:  # [<scheduler>]
                cfg.scheduler_cfg.setdefault(section, {}).update(items)
                for key in items:
                    cfg.origin[(section, key)] = path
                    cfg.lenient[(section, key)] = True
            elif prefix == "cli" and name == "run":
                if items.get("scheduler"):
                    cfg.default_scheduler = items["scheduler"]
                    cfg.default_scheduler_origin = path
                cfg.default_component = items.get("component") or cfg.default_component
            elif prefix == "component":
                cfg.component_defaults.setdefault(name, {}).update(items)
            elif prefix == "torchx" and name == "tracker":
                for tracker in items:
                    cfg.trackers[tracker] = None
    for tracker in cfg.trackers:
        cfg.trackers[tracker] = get_config("tracker", tracker, "config", dirs=dirs)


def get_configs(prefix: str, name: str, dirs: Iterable[str] | None = None) -> dict[str, str]:
    """Section ``[prefix:name]`` merged over every ``.torchxconfig`` (a higher-precedence file wins a key)."""
    out: dict[str, str] = {}
    for path in reversed(find_configs(dirs)):
        ini = _read_ini(path)
        section = f"{prefix}{CONFIG_PREFIX_DELIM}{name}"
        if ini.has_section(section):
            out.update(ini.items(section))
    return out


def get_config(prefix: str, name: str, key: str, dirs: Iterable[str] | None = None) -> str | None:
    """One value of section ``[prefix:name]``, or None."""
    return get_configs(prefix, name, dirs).get(key)


def load_sections(prefix: str, dirs: Iterable[str] | None = None) -> dict[str, dict[str, str]]:
    """Every ``[prefix:<name>]`` section as ``{name: {key: value}}`` (higher-precedence files win a key)."""
    out: dict[str, dict[str, str]] = {}
    for path in reversed(find_configs(dirs)):
        ini = _read_ini(path)
        for section in ini.sections():
            pre, delim, name = section.partition(CONFIG_PREFIX_DELIM)
            if delim and pre == prefix and name:
                out.setdefault(name, {}).update(ini.items(section))
    return out


def _scheduler_opts(scheduler: str) -> Any:
    factories = get_scheduler_factories()
    if scheduler not in factories:
        raise UnknownSchedulerError(f"'{scheduler}' is not a registered scheduler; registered: {', '.join(factories)}",
                                    scheduler=scheduler)
    return factories[scheduler](session_name="_").run_opts()


#: How :func:`dump` writes an option without a default, and how :func:`load` reads it back (TorchX's ``None``).
_NONE = "None"


def load(scheduler: str, f: TextIO, cfg: dict[str, Any]) -> None:
    """Add the ``[scheduler]`` options of INI text ``f`` to ``cfg``, typed; keys already in ``cfg`` are kept.

    ``None`` is no value; lists may be separated by ``;`` (TorchX's form) or ``,``, dicts are ``k:v`` pairs
    separated by either. An option the scheduler does not declare is skipped with a warning, as in TorchX.
    """
    from tsm.specs.runopts import parse_cfg_value

    ini = _configparser()
    where = getattr(f, "name", "<config>")
    try:
        ini.read_file(f, source=str(where))
    except configparser.Error as e:
        raise ConfigError(f"{where}: not a valid config file: {' '.join(str(e).split())}") from e
    if not ini.has_section(scheduler):
        return
    opts = _scheduler_opts(scheduler)
    for key, value in ini.items(scheduler):
        if key in cfg:
            continue
        opt = opts.get(key)
        if opt is None:
            _warn("%s: [%s] '%s' is not a run option of the %s scheduler; ignored",
                         where, scheduler, key, scheduler)
            continue
        if value == _NONE:
            cfg[key] = None
            continue
        text = value.replace(";", ",") if opt.type_ in (list[str], dict[str, str]) else value
        cfg[key] = parse_cfg_value(key, text, opt.type_)


def apply(scheduler: str, cfg: dict[str, Any], dirs: Iterable[str] | None = None) -> None:
    """Add run options of ``scheduler`` from the ``.torchxconfig`` files to ``cfg`` (existing keys win)."""
    for path in find_configs(dirs):  # highest precedence first: it sets a key before the others can
        with open(path, encoding="utf-8") as f:
            load(scheduler, f, cfg)


def dump(f: TextIO, schedulers: Iterable[str] | None = None, required_only: bool = False) -> None:
    """Write a ``.torchxconfig`` with every run option of ``schedulers`` (default: all), as TorchX writes one.

    An option is ``name = default`` (lists ``a;b``, dicts ``k:v;k2:v2``, no default ``None``), a required one a
    ``#FIXME:(type) help`` placeholder; ``required_only`` writes only the required ones. A scheduler whose
    client library is not installed is left out; an unknown name raises UnknownSchedulerError.
    """
    from tsm.specs.runopts import type_name

    names = list(schedulers) if schedulers else list(get_scheduler_factories())
    ini = _configparser()
    for name in names:
        try:
            opts = _scheduler_opts(name)
        except ModuleNotFoundError:
            continue
        ini.add_section(name)
        for key, opt in opts:
            if opt.required:
                ini.set(name, key, f"#FIXME:({type_name(opt.type_)}) {opt.help}"[:70])
            elif not required_only:
                ini.set(name, key, _ini_value(opt.default))
    ini.write(f, space_around_delimiters=True)


def _ini_value(value: Any) -> str:
    if value is None or value == [] or value == {}:
        return _NONE
    if isinstance(value, list):
        return ";".join(value)
    if isinstance(value, dict):
        return ";".join(f"{k}:{v}" for k, v in value.items())
    return str(value)
