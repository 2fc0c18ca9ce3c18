"""``.torchxconfig`` files: read beside tsm's own config with TorchX's precedence, and TorchX's config functions."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from tsm.errors import ComponentNotFoundError, ConfigError, UnknownSchedulerError
from tsm.runner import config as cfgmod
from tsm.runner.api import get_runner
from tsm.specs import AppDef, Resource, Role

INI = """\
[cli:run]
scheduler = local_cwd
component = utils.echo

[local]
grace_period = 2.5
prepend_cwd = True
not_an_option = 1

[component:utils.echo]
msg = from torchxconfig

[torchx:tracker]
tsm =

[tracker:tsm]
config = team-config
"""


@pytest.fixture
def dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tsm_home: Path) -> Iterator[tuple[Path, Path]]:
    """(cwd, home): both empty, the working directory and $HOME, with no tsm user file and no $TORCHXCONFIG."""
    cwd, home = tmp_path / "cwd", tmp_path / "home"
    cwd.mkdir()
    home.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("TORCHXCONFIG", raising=False)
    yield cwd, home


def app() -> AppDef:
    return AppDef("a", [Role("r", entrypoint="true", resource=Resource())])


def test_sections_land_where_tsm_keeps_them(dirs: tuple[Path, Path]) -> None:
    cwd, _ = dirs
    (cwd / ".torchxconfig").write_text(INI)
    cfg = cfgmod.load_config()
    assert cfg.default_scheduler == "local_cwd"
    assert cfg.scheduler_cfg["local"] == {"grace_period": "2.5", "prepend_cwd": "True", "not_an_option": "1"}
    assert cfg.component_defaults["utils.echo"] == {"msg": "from torchxconfig"}
    assert cfg.trackers == {"tsm": "team-config"}
    assert cfg.files == [str(cwd / ".torchxconfig")]


def test_runner_uses_them_and_warns_about_undeclared_options(
    dirs: tuple[Path, Path], caplog: pytest.LogCaptureFixture
) -> None:
    cwd, _ = dirs
    (cwd / ".torchxconfig").write_text(INI)
    with caplog.at_level(logging.WARNING, logger="tsm"), get_runner() as r:
        info = r.dryrun(app())
        assert info.scheduler == "local_cwd"  # [cli:run] scheduler
        info = r.dryrun(app(), "local")
        assert info.cfg["grace_period"] == 2.5 and info.cfg["prepend_cwd"] is True
        env = info.app.roles[0].env if info.app else {}
        assert env["TORCHX_TRACKERS"] == env["TSM_TRACKERS"] == "tsm"  # [torchx:tracker] reaches the replicas
        assert env["TORCHX_TRACKER_TSM_CONFIG"] == env["TSM_TRACKER_TSM_CONFIG"] == "team-config"
        echo = r.dryrun_component("utils.echo", [], "local")
        assert echo.app is not None and echo.app.roles[0].args == ["from torchxconfig"]
    assert "not_an_option" in caplog.text and "ignored" in caplog.text  # shared file: a warning, not an error


def test_home_beats_cwd_and_tsm_files_beat_both(dirs: tuple[Path, Path]) -> None:
    # TorchX's order: the user's ~/.torchxconfig is laid over the project's ./.torchxconfig
    cwd, home = dirs
    (home / ".torchxconfig").write_text("[local]\ngrace_period = 1\n")
    (cwd / ".torchxconfig").write_text("[local]\ngrace_period = 2\nlog_dir = /project-logs\n")
    cfg = cfgmod.load_config()
    assert cfg.scheduler_cfg["local"] == {"grace_period": "1", "log_dir": "/project-logs"}
    (cwd / "tsm.toml").write_text("[scheduler.local]\ngrace_period = 3.0\n")
    cfg = cfgmod.load_config()
    assert cfg.scheduler_cfg["local"]["grace_period"] == 3.0
    assert cfg.origin[("local", "grace_period")] == str(cwd / "tsm.toml")
    assert ("local", "grace_period") not in cfg.lenient  # now a tsm setting: strict again


def test_torchxconfig_env_names_the_only_file(dirs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    cwd, home = dirs
    (cwd / ".torchxconfig").write_text("[local]\ngrace_period = 2\n")
    other = home / "team.ini"
    other.write_text("[local]\ngrace_period = 9\n")
    monkeypatch.setenv("TORCHXCONFIG", str(other))
    assert cfgmod.find_configs() == [str(other)]
    assert cfgmod.load_config().scheduler_cfg["local"] == {"grace_period": "9"}
    monkeypatch.setenv("TORCHXCONFIG", "")
    assert cfgmod.find_configs() == []
    monkeypatch.setenv("TORCHXCONFIG", str(home / "missing"))
    with pytest.raises(ConfigError, match="TORCHXCONFIG"):
        cfgmod.find_configs()


def test_find_configs_order(dirs: tuple[Path, Path]) -> None:
    cwd, home = dirs
    (cwd / ".torchxconfig").write_text("")
    (home / ".torchxconfig").write_text("")
    assert cfgmod.find_configs() == [str(home / ".torchxconfig"), str(cwd / ".torchxconfig")]
    assert cfgmod.find_configs([]) == cfgmod.find_configs()  # TorchX: empty dirs mean the defaults
    assert cfgmod.find_configs([str(home), str(home)]) == [str(home / ".torchxconfig")]
    assert cfgmod.find_configs([str(home)]) == [str(home / ".torchxconfig")]


def test_apply_and_load_keep_existing_keys_and_type_values(
    dirs: tuple[Path, Path], caplog: pytest.LogCaptureFixture
) -> None:
    cwd, home = dirs
    (cwd / ".torchxconfig").write_text("[local]\ngrace_period = 2\n")
    (home / ".torchxconfig").write_text("[local]\ngrace_period = 7\nlog_dir = /logs\nbogus = 1\n")
    cfg: dict[str, object] = {"prepend_cwd": True}
    with caplog.at_level(logging.WARNING, logger="tsm"):
        cfgmod.apply("local", cfg)
    assert cfg == {"prepend_cwd": True, "grace_period": 7.0, "log_dir": "/logs"}  # home's file wins, as in TorchX
    assert "bogus" in caplog.text
    cfg2: dict[str, object] = {"grace_period": 5.0}
    cfgmod.load("local", io.StringIO("[local]\ngrace_period = 1\nprepend_cwd = false\n"), cfg2)
    assert cfg2 == {"grace_period": 5.0, "prepend_cwd": False}


def test_get_configs_and_load_sections(dirs: tuple[Path, Path]) -> None:
    cwd, home = dirs
    (home / ".torchxconfig").write_text("[component:dist.ddp]\nj = 1x1\n[component:x]\na = 1\n")
    (cwd / ".torchxconfig").write_text("[component:dist.ddp]\nj = 2x2\nscript = cwd.py\n")
    assert cfgmod.get_configs("component", "dist.ddp") == {"j": "1x1", "script": "cwd.py"}
    assert cfgmod.get_config("component", "dist.ddp", "j") == "1x1"
    assert cfgmod.get_config("component", "dist.ddp", "nope") is None
    assert cfgmod.load_sections("component") == {"dist.ddp": {"j": "1x1", "script": "cwd.py"}, "x": {"a": "1"}}


def test_dump_writes_a_loadable_file(dirs: tuple[Path, Path]) -> None:
    out = io.StringIO()
    cfgmod.dump(out, schedulers=["local"])
    text = out.getvalue()
    assert text.startswith("[local]\n") and "grace_period = 10.0\n" in text and "log_dir = None\n" in text
    cfg: dict[str, object] = {}
    cfgmod.load("local", io.StringIO(text), cfg)
    assert cfg["grace_period"] == 10.0 and cfg["log_dir"] is None  # TorchX's "None" is no value
    with pytest.raises(UnknownSchedulerError):
        cfgmod.dump(io.StringIO(), schedulers=["nosuch"])


def test_a_broken_torchxconfig_names_the_file(dirs: tuple[Path, Path]) -> None:
    cwd, _ = dirs
    (cwd / ".torchxconfig").write_text("no section header\n")
    with pytest.raises(ConfigError, match=r"\.torchxconfig: not a valid config file"):
        cfgmod.load_config()


def test_constants() -> None:
    assert (cfgmod.CONFIG_FILE, cfgmod.ENV_TORCHXCONFIG, cfgmod.CONFIG_PREFIX_DELIM) == (".torchxconfig", "TORCHXCONFIG", ":")


def test_cli_run_component_is_the_component_run_when_none_is_named(dirs: tuple[Path, Path]) -> None:
    cwd, _ = dirs
    with get_runner() as r, pytest.raises(ComponentNotFoundError, match=r"\[cli:run\] component"):
        r.dryrun_component(None, [], "local")
    (cwd / ".torchxconfig").write_text(INI)
    assert cfgmod.load_config().default_component == "utils.echo"
    with get_runner() as r:
        info = r.dryrun_component(None, ["--msg", "hi"], "local")  # TorchX's `torchx run` with no component
    assert info.app is not None and info.app.name == "echo" and info.app.roles[0].args == ["hi"]


def test_lists_and_dicts_in_torchxs_form(dirs: tuple[Path, Path]) -> None:
    cfg: dict[str, object] = {}
    cfgmod.load("local", io.StringIO("[local]\nexclude_nodes = a;b\n"), cfg)
    assert cfg["exclude_nodes"] == ["a", "b"]  # TorchX writes lists with ';'
