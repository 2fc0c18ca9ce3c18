"""Tests for tsm.runner.config: project and user TOML files, precedence, origins and errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from tsm.errors import ConfigError, InvalidRunOptionError
from tsm.runner.config import Config, load_config, user_config_path


@pytest.fixture
def user_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``$XDG_CONFIG_HOME`` pointed at an empty temporary directory; returns it."""
    xdg = tmp_path / "xdg"
    xdg.mkdir()
    monkeypatch.setenv("XDG_CONFIG_HOME", str(xdg))
    return xdg


@pytest.fixture
def project(tmp_path: Path, user_dir: Path) -> Path:
    """An empty project directory (with the user file location isolated)."""
    p = tmp_path / "project"
    p.mkdir()
    return p


def _user_file(user_dir: Path, text: str) -> Path:
    path = user_dir / "tsm" / "config.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


# -- locations --------------------------------------------------------------------------------------
def test_user_config_path_uses_xdg(user_dir: Path) -> None:
    assert user_config_path() == user_dir / "tsm" / "config.toml"


def test_user_config_path_defaults_to_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert user_config_path() == tmp_path / ".config" / "tsm" / "config.toml"
    monkeypatch.setenv("XDG_CONFIG_HOME", "")
    assert user_config_path() == tmp_path / ".config" / "tsm" / "config.toml"


def test_no_files_gives_empty_config(project: Path) -> None:
    assert load_config(project) == Config()


# -- project file -----------------------------------------------------------------------------------
def test_tsm_toml(project: Path) -> None:
    (project / "tsm.toml").write_text(
        """
default_scheduler = "local"

[scheduler.local]
grace_period = 5.0
log_dir = "/tmp/x"

[component."dist.ddp"]
j = "2x1"
"""
    )
    cfg = load_config(project)
    assert cfg.default_scheduler == "local"
    assert cfg.scheduler_cfg == {"local": {"grace_period": 5.0, "log_dir": "/tmp/x"}}
    assert cfg.component_defaults == {"dist.ddp": {"j": "2x1"}}
    src = str(project / "tsm.toml")
    assert cfg.origin == {("local", "grace_period"): src, ("local", "log_dir"): src}
    assert cfg.files == [src]


def test_cwd_is_the_default_project(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (project / "tsm.toml").write_text('default_scheduler = "slurm"\n')
    monkeypatch.chdir(project)
    assert load_config().default_scheduler == "slurm"


def test_cwd_given_as_string(project: Path) -> None:
    (project / "tsm.toml").write_text('default_scheduler = "slurm"\n')
    assert load_config(str(project)).default_scheduler == "slurm"


def test_pyproject_tool_tsm(project: Path) -> None:
    (project / "pyproject.toml").write_text(
        """
[project]
name = "x"

[tool.other]
y = 1

[tool.tsm]
default_scheduler = "kubernetes"

[tool.tsm.scheduler.kubernetes]
namespace = "ml"
"""
    )
    cfg = load_config(project)
    assert cfg.default_scheduler == "kubernetes"
    assert cfg.scheduler_cfg == {"kubernetes": {"namespace": "ml"}}
    src = str(project / "pyproject.toml")
    assert cfg.origin == {("kubernetes", "namespace"): src}
    assert cfg.files == [src]


def test_pyproject_without_tool_tsm_is_ignored(project: Path) -> None:
    (project / "pyproject.toml").write_text('[project]\nname = "x"\n[tool.ruff]\nline-length = 1\n')
    assert load_config(project) == Config()


def test_tsm_toml_wins_over_pyproject(project: Path) -> None:
    (project / "tsm.toml").write_text('default_scheduler = "local"\n')
    (project / "pyproject.toml").write_text('[tool.tsm]\ndefault_scheduler = "slurm"\n[tool.tsm.scheduler.slurm]\nq = "x"\n')
    cfg = load_config(project)
    assert cfg.default_scheduler == "local"
    assert cfg.scheduler_cfg == {}  # pyproject is not read at all
    assert cfg.files == [str(project / "tsm.toml")]


def test_tsm_toml_directory_is_not_a_file(project: Path) -> None:
    (project / "tsm.toml").mkdir()
    (project / "pyproject.toml").write_text('[tool.tsm]\ndefault_scheduler = "slurm"\n')
    assert load_config(project).default_scheduler == "slurm"


# -- user file and precedence -----------------------------------------------------------------------
def test_user_file_alone(project: Path, user_dir: Path) -> None:
    path = _user_file(user_dir, 'default_scheduler = "slurm"\n[scheduler.slurm]\npartition = "gpu"\n')
    cfg = load_config(project)
    assert cfg.default_scheduler == "slurm"
    assert cfg.scheduler_cfg == {"slurm": {"partition": "gpu"}}
    assert cfg.origin == {("slurm", "partition"): str(path)}
    assert cfg.files == [str(path)]


def test_project_beats_user(project: Path, user_dir: Path) -> None:
    user = _user_file(
        user_dir,
        """
default_scheduler = "slurm"

[scheduler.local]
grace_period = 1.0
log_dir = "/user/logs"

[scheduler.slurm]
partition = "gpu"

[component."dist.ddp"]
j = "1x1"
script = "user.py"
""",
    )
    proj = project / "tsm.toml"
    proj.write_text(
        """
default_scheduler = "local"

[scheduler.local]
grace_period = 9.0

[component."dist.ddp"]
j = "4x2"
"""
    )
    cfg = load_config(project)
    assert cfg.default_scheduler == "local"
    # merged option by option: the project's value wins, the user's other options stay
    assert cfg.scheduler_cfg == {
        "local": {"grace_period": 9.0, "log_dir": "/user/logs"},
        "slurm": {"partition": "gpu"},
    }
    assert cfg.origin == {
        ("local", "grace_period"): str(proj),
        ("local", "log_dir"): str(user),
        ("slurm", "partition"): str(user),
    }
    assert cfg.component_defaults == {"dist.ddp": {"j": "4x2", "script": "user.py"}}
    assert cfg.files == [str(user), str(proj)]  # lowest precedence first


def test_user_default_scheduler_kept_when_project_has_none(project: Path, user_dir: Path) -> None:
    _user_file(user_dir, 'default_scheduler = "slurm"\n')
    (project / "tsm.toml").write_text('[scheduler.local]\nx = 1\n')
    assert load_config(project).default_scheduler == "slurm"


def test_user_file_directory_is_skipped(project: Path, user_dir: Path) -> None:
    (user_dir / "tsm" / "config.toml").mkdir(parents=True)
    assert load_config(project) == Config()


# -- component defaults as command-line text --------------------------------------------------------
def test_component_defaults_become_command_line_strings(project: Path) -> None:
    (project / "tsm.toml").write_text(
        """
[component."dist.ddp"]
j = "2x1"
debug = true
quiet = false
nnodes = 2
lr = 0.5
mounts = ["a", "b", 3]
env = { A = "1", B = "x" }
empty_list = []
flags = [true, false]
opts = { fast = true, n = 1 }
"""
    )
    assert load_config(project).component_defaults == {
        "dist.ddp": {
            "j": "2x1",
            "debug": "true",
            "quiet": "false",
            "nnodes": "2",
            "lr": "0.5",
            "mounts": "a,b,3",
            "env": "A=1,B=x",
            "empty_list": "",
            "flags": "true,false",
            "opts": "fast=true,n=1",
        }
    }


def test_scheduler_options_keep_their_toml_types(project: Path) -> None:
    (project / "tsm.toml").write_text('[scheduler.local]\nflag = true\nn = 3\ntags = ["a"]\nlabels = { k = "v" }\n')
    assert load_config(project).scheduler_cfg == {"local": {"flag": True, "n": 3, "tags": ["a"], "labels": {"k": "v"}}}


# -- errors -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text",
    [
        "default_scheduler = ",
        "[scheduler.local\n",
        "x = 'unterminated\n",
        "a = 1\na = 2\n",
    ],
)
def test_bad_toml_names_the_file(project: Path, text: str) -> None:
    path = project / "tsm.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as ei:
        load_config(project)
    assert str(ei.value).startswith(f"{path}: not valid TOML")


def test_not_utf8_names_the_file(project: Path) -> None:
    path = project / "tsm.toml"
    path.write_bytes(b'default_scheduler = "\xff\xfe"\n')
    with pytest.raises(ConfigError) as ei:
        load_config(project)
    assert str(ei.value).startswith(f"{path}: not valid TOML")
    assert "UTF-8" in str(ei.value)


def test_bad_user_toml_names_the_user_file(project: Path, user_dir: Path) -> None:
    path = _user_file(user_dir, "[[[")
    with pytest.raises(ConfigError, match=f"^{path}: not valid TOML"):
        load_config(project)


def test_bad_pyproject_names_it(project: Path) -> None:
    path = project / "pyproject.toml"
    path.write_text("[tool.tsm\n")
    with pytest.raises(ConfigError, match=f"^{path}: not valid TOML"):
        load_config(project)


def test_unreadable_file_names_it(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = project / "tsm.toml"
    path.write_text('default_scheduler = "local"\n')
    path.chmod(0)
    try:
        try:
            open(path, "rb").close()
        except PermissionError:
            pass
        else:
            pytest.skip("running with privileges that ignore file permissions")
        with pytest.raises(ConfigError) as ei:
            load_config(project)
        assert str(ei.value).startswith(f"{path}: cannot read:")
    finally:
        path.chmod(0o644)


def test_read_error_names_the_file(tmp_path: Path) -> None:
    from tsm.runner.config import _read

    with pytest.raises(ConfigError) as ei:
        _read(tmp_path)  # a directory: open() fails the way an unreadable file does
    assert str(ei.value).startswith(f"{tmp_path}: cannot read: ")


@pytest.mark.parametrize(
    ("text", "key", "suggestion"),
    [
        ('default_schedular = "local"\n', "default_schedular", "default_scheduler"),
        ("[schedulers.local]\nx = 1\n", "schedulers", "scheduler"),
        ('[components."a"]\nx = 1\n', "components", "component"),
    ],
)
def test_unknown_key_did_you_mean(project: Path, text: str, key: str, suggestion: str) -> None:
    path = project / "tsm.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as ei:
        load_config(project)
    msg = str(ei.value)
    assert msg.startswith(f"{path}: unknown key '{key}'")
    assert f"(did you mean '{suggestion}'?)" in msg
    assert "allowed: default_scheduler, scheduler, component" in msg


def test_unknown_key_without_suggestion(project: Path) -> None:
    (project / "tsm.toml").write_text("zzzz = 1\n")
    with pytest.raises(ConfigError) as ei:
        load_config(project)
    assert "unknown key 'zzzz'; allowed:" in str(ei.value)


def test_unknown_key_in_pyproject_names_the_table(project: Path) -> None:
    path = project / "pyproject.toml"
    path.write_text("[tool.tsm]\ndefault_schedulr = 'x'\n")
    with pytest.raises(ConfigError) as ei:
        load_config(project)
    assert str(ei.value).startswith(f"{path} [tool.tsm]: unknown key 'default_schedulr'")
    assert "did you mean 'default_scheduler'" in str(ei.value)


def test_unknown_key_in_user_file(project: Path, user_dir: Path) -> None:
    path = _user_file(user_dir, "sheduler = 1\n")
    with pytest.raises(ConfigError, match=f"^{path}: unknown key 'sheduler' \\(did you mean 'scheduler'\\?\\)"):
        load_config(project)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("default_scheduler = 1\n", "'default_scheduler' must be a scheduler name (a string)"),
        ("default_scheduler = ['local']\n", "'default_scheduler' must be a scheduler name (a string)"),
        ('scheduler = "local"\n', "use tables [scheduler.<name>] of run option = value"),
        ("[scheduler]\nlocal = 1\n", "use tables [scheduler.<name>] of run option = value"),
        ("[scheduler]\nlocal = [1, 2]\n", "use tables [scheduler.<name>] of run option = value"),
        ('component = "dist.ddp"\n', 'use tables [component."<name>"] of argument = value'),
        ('[component]\n"dist.ddp" = "j=2"\n', 'use tables [component."<name>"] of argument = value'),
        ("[[component]]\nx = 1\n", 'use tables [component."<name>"] of argument = value'),
    ],
)
def test_wrong_shapes_name_the_file(project: Path, text: str, fragment: str) -> None:
    path = project / "tsm.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as ei:
        load_config(project)
    assert str(ei.value).startswith(f"{path}: ")
    assert fragment in str(ei.value)


@pytest.mark.parametrize("text", ['[tool]\ntsm = "x"\n', "[tool]\ntsm = 1\n", "[[tool.tsm]]\nx = 1\n"])
def test_tool_tsm_not_a_table(project: Path, text: str) -> None:
    path = project / "pyproject.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=f"^{path}: \\[tool.tsm\\] must be a table"):
        load_config(project)


def test_tool_not_a_table_is_not_ours(project: Path) -> None:
    (project / "pyproject.toml").write_text('tool = "nothing"\n')
    assert load_config(project) == Config()


def test_config_error_is_a_run_option_error() -> None:
    assert issubclass(ConfigError, InvalidRunOptionError)
