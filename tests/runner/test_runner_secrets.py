"""The runner's ``secrets`` run option: added to every role, checked against what the scheduler delivers,
and never taken from a project's config file (it hands the user's values to the app)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from schedulers.fake import create_scheduler
from tsm.errors import ConfigError, InvalidAppError, NotSupportedError
from tsm.runner.api import Runner, get_runner
from tsm.runner.params import cfg_from_strs
from tsm.specs.api import AppDef, Role


def _app(tmp_path: Path, **kw: object) -> AppDef:
    roles = [Role(n, image=str(tmp_path), entrypoint=sys.executable, args=["-c", "pass"], **kw)  # type: ignore[arg-type]
             for n in ("a", "b")]
    return AppDef("sec", roles)


@pytest.fixture(autouse=True)
def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("TORCHXCONFIG", raising=False)


def test_the_option_gives_every_role_its_entries_after_the_roles_own(tmp_path: Path) -> None:
    app = _app(tmp_path, secrets=["OWN"])
    with get_runner() as r:
        info = r.dryrun(app, "local", cfg={"secrets": ["A", "OWN", "B:file:/x"]})
    assert [role.secrets for role in info.request.roles] == [["OWN", "A", "B"]] * 2
    assert info.request.secrets == ["OWN", "A", "B:file:/x"]
    assert "secrets" not in info.cfg  # the runner's own option: the scheduler never sees it
    assert app.roles[0].secrets == ["OWN"]  # the caller's app is left as it was


def test_a_comma_separated_value_from_the_command_line_is_the_same_list(tmp_path: Path) -> None:
    with get_runner() as r:
        cfg = cfg_from_strs(r.scheduler_run_opts("local"), ["secrets=A,B:file:~/b"])
        assert cfg == {"secrets": ["A", "B:file:~/b"]}
        assert r.dryrun(_app(tmp_path), "local", cfg=cfg).request.secrets == ["A", "B:file:~/b"]


def test_a_scheduler_that_does_not_deliver_secrets_refuses_them_at_dry_run(tmp_path: Path) -> None:
    runner = Runner("t", scheduler_factories={"fake": create_scheduler})
    app = AppDef("sec", [Role("r", image="img", entrypoint="true")])
    with pytest.raises(NotSupportedError, match="the fake scheduler does not deliver secrets; run it without A"):
        runner.dryrun(app, "fake", cfg={"secrets": ["A"]})
    assert runner.dryrun(app, "fake").request is not None  # none declared: nothing to refuse


def test_a_bad_declaration_is_refused_before_anything_runs(tmp_path: Path) -> None:
    with get_runner() as r:
        with pytest.raises(InvalidAppError, match="not a variable name"):
            r.dryrun(_app(tmp_path), "local", cfg={"secrets": ["1BAD"]})
        for name in ("TSM_APP_ID", "TSM_PORT_HTTP", "TORCHX_JOB_ID", "PATH"):
            with pytest.raises(InvalidAppError, match=f"secret {name}: a variable tsm or the system sets"):
                r.dryrun(_app(tmp_path), "local", cfg={"secrets": [name]})
        with pytest.raises(InvalidAppError, match="declared twice with different sources"):
            r.dryrun(_app(tmp_path, secrets=["A"]), "local", cfg={"secrets": ["A:file:/x"]})


@pytest.mark.parametrize(("name", "text"), [
    ("tsm.toml", "[scheduler.local]\nsecrets = 'KEY:file:~/.ssh/id_rsa'\n"),
    (".torchxconfig", "[local]\nsecrets = KEY:file:~/.ssh/id_rsa\n"),
])
def test_a_project_file_cannot_hand_the_users_values_to_the_app(tmp_path: Path, name: str, text: str) -> None:
    (Path.cwd() / name).write_text(text)
    with get_runner() as r, pytest.raises(ConfigError, match=f"{name}.*'secrets' hands your environment"):
        r.dryrun(_app(tmp_path), "local")


def test_the_users_own_file_may_declare_them(tmp_path: Path) -> None:
    home = Path.home()
    home.mkdir(parents=True, exist_ok=True)
    (home / ".torchxconfig").write_text("[local]\nsecrets = A\n")
    with get_runner() as r:
        assert r.dryrun(_app(tmp_path), "local").request.secrets == ["A"]
