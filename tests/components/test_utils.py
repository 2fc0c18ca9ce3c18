"""The utils.* builtins, called as the CLI calls them: through materialize with a command line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tsm.components import materialize, utils as u
from tsm.components.base import app_name, safe_name
from tsm.errors import ComponentArgumentError, UnknownResourceError
from tsm.specs.api import AppDef, Resource, Role
from tsm.specs.named_resources import get_named_resource
from tsm.specs.validate import NAME_RE, validate_app


def only_role(app: AppDef) -> Role:
    validate_app(app)  # every builtin's output must pass the runner's checks
    assert len(app.roles) == 1
    return app.roles[0]


def test_echo() -> None:
    app = materialize(u.echo, ["--msg", "hi there", "--num_replicas", "2"])
    role = only_role(app)
    assert app.name == "echo"
    assert (role.name, role.entrypoint, role.args, role.num_replicas) == ("echo", "echo", ["hi there"], 2)


def test_echo_defaults() -> None:
    role = only_role(materialize(u.echo, []))
    assert (role.args, role.image, role.num_replicas) == (["hello world"], "", 1)


def test_touch_creates_the_file(tmp_path: Path) -> None:
    role = only_role(materialize(u.touch, ["--file", "made"]))
    assert (role.entrypoint, role.args) == ("touch", ["made"])
    subprocess.run([role.entrypoint, *role.args], cwd=tmp_path, check=True)
    assert (tmp_path / "made").exists()


def test_touch_needs_a_file() -> None:
    with pytest.raises(ComponentArgumentError, match="required: --file"):
        materialize(u.touch, [])


def test_sh_joins_words_into_one_command_line() -> None:
    app = materialize(u.sh, ["--env", "A=1,B=x,y", "--max_retries", "2", "--", "echo", "$HOME", "|", "wc -c"])
    role = only_role(app)
    assert app.name == "sh"
    assert (role.entrypoint, role.args) == ("sh", ["-c", "echo $HOME | wc -c"])
    assert role.env == {"A": "1", "B": "x,y"}
    assert role.max_retries == 2
    assert role.resource == Resource(cpu=1, gpu=0, memMB=1024)


def test_sh_runs_in_a_shell() -> None:
    role = only_role(materialize(u.sh, ["--", "echo a; echo b"]))
    out = subprocess.run([role.entrypoint, *role.args], capture_output=True, text=True, check=True)
    assert out.stdout == "a\nb\n"


def test_sh_resources() -> None:
    role = only_role(materialize(u.sh, ["--cpu", "4", "--gpu", "1", "--memMB", "2048", "--", "true"]))
    assert role.resource == Resource(cpu=4, gpu=1, memMB=2048)
    role = only_role(materialize(u.sh, ["-h", "gpu.small", "--", "true"]))
    assert role.resource == get_named_resource("gpu.small")


def test_sh_unknown_named_resource() -> None:
    with pytest.raises(UnknownResourceError, match="did you mean 'gpu.small'"):
        materialize(u.sh, ["-h", "gpu.smal", "--", "true"])


def test_sh_needs_a_command() -> None:
    with pytest.raises(ComponentArgumentError, match="give the command line to run after '--'") as info:
        materialize(u.sh, [], prog="tsm run utils.sh")
    assert info.value.usage.startswith("usage: tsm run utils.sh")


@pytest.mark.parametrize(
    ("argv", "args"),
    [
        (["-m", "http.server", "--", "8000"], ["-m", "http.server", "8000"]),
        (["-c", "import sys; print(sys.argv)", "--", "a"], ["-c", "import sys; print(sys.argv)", "a"]),
        (["--script", "train.py", "--", "--lr", "1"], ["train.py", "--lr", "1"]),
    ],
)
def test_python_modes(
    argv: list[str], args: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "train.py").write_text("")
    monkeypatch.chdir(tmp_path)
    app = materialize(u.python, argv)
    role = only_role(app)
    assert (app.name, role.name, role.entrypoint, role.args) == ("python", "python", "python", args)


def test_python_name_env_and_resources() -> None:
    app = materialize(
        u.python, ["-m", "x", "--name", "job", "--env", "K=v", "-h", "cpu.large", "--num_replicas", "3"]
    )
    role = only_role(app)
    assert (app.name, role.name, role.env, role.num_replicas) == ("job", "job", {"K": "v"}, 3)
    assert role.resource == get_named_resource("cpu.large")


@pytest.mark.parametrize(
    ("argv", "got"),
    [
        ([], "none"),
        (["-m", "a", "-c", "b"], "-m, -c"),
        (["-m", "a", "--script", "s.py"], "-m, --script"),
        (["-m", "a", "-c", "b", "--script", "s.py"], "-m, -c, --script"),
    ],
)
def test_python_needs_exactly_one_of_m_c_script(argv: list[str], got: str) -> None:
    with pytest.raises(ComponentArgumentError) as info:
        materialize(u.python, argv, prog="tsm run utils.python")
    assert str(info.value) == f"tsm run utils.python: give exactly one of -m, -c or --script (got {got})"
    assert info.value.usage.startswith("usage: tsm run utils.python")


def test_python_missing_script_is_refused_at_dry_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(
        ComponentArgumentError, match=rf"--script 'gone.py': no such file \({tmp_path}/gone.py\)"
    ):
        materialize(u.python, ["--script", "gone.py"], prog="tsm run utils.python")
    assert only_role(materialize(u.python, ["--script", "gone.py", "--image", "img:1"])).args == ["gone.py"]


def test_copy_copies_a_file_with_only_python(tmp_path: Path) -> None:
    (tmp_path / "src.txt").write_bytes(b"payload \xff\n")
    app = materialize(u.copy, ["--src", "src.txt", "--dst", f"file://{tmp_path}/dst.txt"])
    role = only_role(app)
    assert (app.name, role.name, role.entrypoint) == ("torchx-utils-copy", "torchx-utils-copy", "python")
    out = subprocess.run(
        [sys.executable, *role.args], cwd=tmp_path, check=True, capture_output=True, text=True
    )
    assert (tmp_path / "dst.txt").read_bytes() == b"payload \xff\n"
    assert out.stdout == f"copied src.txt to file://{tmp_path}/dst.txt\n"


def test_copy_of_a_missing_file_fails(tmp_path: Path) -> None:
    role = only_role(materialize(u.copy, ["--src", "nope", "--dst", "x"]))
    out = subprocess.run([sys.executable, *role.args], cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 1 and "FileNotFoundError" in out.stderr


@pytest.mark.parametrize(("x1", "x2", "value"), [("1", "3", 0.0), ("0", "0", 74.0), ("-1.5", "2", 56.25)])
def test_booth_evaluates_and_saves_where_torchx_reads_it(
    tmp_path: Path, x1: str, x2: str, value: float
) -> None:
    argv = ["--x1", x1, "--x2", x2, "--trial_idx", "3", "--tracker_base", str(tmp_path / "trials")]
    role = only_role(materialize(u.booth, argv))
    out = subprocess.run(
        [sys.executable, *role.args], cwd=tmp_path, check=True, capture_output=True, text=True
    )
    assert out.stdout == f"booth({float(x1)!r}, {float(x2)!r}) = {value!r}\n"
    assert json.loads((tmp_path / "trials" / "3").read_text()) == {"booth_eval": value}
    assert u.booth(1, 3).roles[0].args[-2:] == ["0", "/tmp/torchx-util-booth"]  # TorchX's defaults


def test_binary_passes_arguments_verbatim() -> None:
    app = materialize(u.binary, ["--entrypoint", "/bin/ls", "--name", "list", "--", "-la", "$(x)", "a b"])
    role = only_role(app)
    assert (app.name, role.entrypoint, role.args) == ("list", "/bin/ls", ["-la", "$(x)", "a b"])


def test_binary_needs_an_entrypoint() -> None:
    with pytest.raises(ComponentArgumentError, match="required: --entrypoint"):
        materialize(u.binary, ["--", "x"])


def test_builtins_are_plain_python_functions() -> None:
    assert u.echo("x").roles[0].args == ["x"]
    assert u.python("a", m="pkg").roles[0].args == ["-m", "pkg", "a"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("train", "train"),
        ("my train!.v2", "my-train-v2"),
        ("__init__", "init__"),
        ("-x", "x"),
        ("ü", "fallback"),
        ("", "fallback"),
        ("a" * 100, "a" * 63),
    ],
)
def test_safe_name(text: str, expected: str) -> None:
    name = safe_name(text, "fallback")
    assert name == expected
    assert NAME_RE.match(name)


@pytest.mark.parametrize(
    ("script", "module", "expected"),
    [
        ("train.py", None, "train"),
        ("/abs/path/to/my_train.v2.py", None, "my_train-v2"),
        ("${img_root}/train.py", None, "train"),
        ("dir/", None, "dir"),
        (".py", None, "py"),
        (None, "pkg.mod", "pkg-mod"),
        (None, "_private.mod", "private-mod"),
        (None, None, "fallback"),
    ],
)
def test_app_name(script: str | None, module: str | None, expected: str) -> None:
    assert app_name(script, module, "fallback") == expected


def test_every_builtin_asks_for_a_real_resource(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Roles without a resource are refused at submit (as in TorchX), so every builtin sets one."""
    (tmp_path / "t.py").write_text("")
    monkeypatch.chdir(tmp_path)
    from tsm.components import dist

    apps = [
        u.echo(),
        u.touch("f"),
        u.sh("true"),
        u.python(m="x"),
        u.binary(entrypoint="ls"),
        u.copy("a", "b"),
        u.booth(1, 2),
        dist.ddp(script="t.py"),
        dist.spmd(script="t.py"),
    ]
    for app in apps:
        assert app.roles[0].resource.cpu >= 1 and app.roles[0].resource.memMB >= 1024, app.name
    role = only_role(materialize(u.binary, ["--entrypoint", "ls", "--cpu", "3", "--memMB", "64"]))
    assert role.resource == Resource(cpu=3, gpu=0, memMB=64)
    assert only_role(
        materialize(u.binary, ["--entrypoint", "ls", "-h", "gpu.small"])
    ).resource == get_named_resource("gpu.small")
