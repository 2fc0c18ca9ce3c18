"""Defaults from TOML files: the default scheduler, run options per scheduler, arguments per component.

Files, highest precedence first (the command line beats them all):

1. the project file: ``tsm.toml`` in the working directory, else ``[tool.tsm]`` of its ``pyproject.toml``;
2. the user file: ``$XDG_CONFIG_HOME/tsm/config.toml`` (default ``~/.config/tsm/config.toml``).

Both have the same shape::

    default_scheduler = "local"    # default scheduler for run / dryrun

    [scheduler.local]              # run options, as with -c
    grace_period = 5.0

    [component."dist.ddp"]         # component argument defaults, as on the command line
    j = "2x1"

A file that is not TOML, or holds an unknown key or a value of the wrong shape, raises
:class:`~tsm.errors.ConfigError` naming the file. Scheduler names are not checked here: a shared user
file may configure schedulers installed elsewhere.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tsm.errors import ConfigError, did_you_mean

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
    scheduler_cfg: dict[str, dict[str, Any]] = field(default_factory=dict)
    component_defaults: dict[str, dict[str, str]] = field(default_factory=dict)
    #: for error messages: (scheduler, option) -> file that set it
    origin: dict[tuple[str, str], str] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)


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
    """Read and merge the user and project files (project wins)."""
    cfg = Config()
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
        for comp, args in (data.get("component") or {}).items():
            cfg.component_defaults.setdefault(comp, {}).update({k: _arg_text(v) for k, v in args.items()})
    return cfg


def _arg_text(value: Any) -> str:
    """A component default as the command line would spell it (the components' own rendering)."""
    from tsm.components.cmdline import format_value

    return "" if value == "" else format_value(value)
