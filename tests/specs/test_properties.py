"""Property tests (hypothesis): validation, handles, run options and dry runs never fail in an unexpected way."""

from __future__ import annotations

import json
import string
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from tsm.errors import InvalidAppError, InvalidRunOptionError, MalformedAppHandleError, TsmError
from tsm.runner.api import get_runner
from tsm.specs.api import AppDef, AppDryRunInfo, Resource, RetryPolicy, Role
from tsm.specs.handles import make_app_handle, parse_app_handle
from tsm.specs.runopts import is_type, parse_cfg_value, runopts
from tsm.specs.validate import NAME_RE, validate_app

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# -- AppDefs ----------------------------------------------------------------------------------------
HOSTILE = "/\\.. \t\n\r\x00\x1b\x7f$:;'\"`*?~-_=\u00e9\u200b\ufeff"
names = st.one_of(
    st.from_regex(NAME_RE, fullmatch=True),
    st.text(alphabet=string.ascii_letters + string.digits + HOSTILE, max_size=70),
    st.text(max_size=70),
    st.sampled_from(["", ".", "..", "a/b", "x" * 63, "x" * 64, "a\n", "trainer"]),
)
hostile_text = st.text(alphabet=st.characters(codec="utf-8"), max_size=20) | st.sampled_from(["", "\x00", "a\x00b"])
numbers = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.none(),
    st.text(max_size=3),
)
resources = st.builds(
    Resource,
    cpu=numbers,
    gpu=numbers,
    memMB=numbers,
    capabilities=st.dictionaries(st.text(max_size=5), st.integers() | st.text(max_size=5), max_size=3),
    devices=st.dictionaries(st.text(max_size=5), numbers, max_size=3) | st.lists(st.text(max_size=3), max_size=2),
)
roles = st.builds(
    Role,
    name=names,
    image=hostile_text,
    entrypoint=hostile_text | st.none() | st.integers(),
    args=st.lists(hostile_text, max_size=5) | st.lists(st.integers() | st.none(), min_size=1, max_size=2) | st.none(),
    env=st.dictionaries(hostile_text, hostile_text, max_size=4)
    | st.dictionaries(st.integers() | st.none(), st.integers() | st.none(), min_size=1, max_size=2),
    num_replicas=numbers,
    min_replicas=numbers,
    max_retries=numbers,
    retry_policy=st.sampled_from(list(RetryPolicy)) | st.text(max_size=5),
    resource=resources | st.none() | st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    port_map=st.dictionaries(hostile_text | st.integers(), numbers, max_size=3) | st.lists(st.integers(), max_size=2),
    metadata=st.dictionaries(st.text(max_size=5), hostile_text, max_size=2),
)
apps = st.builds(AppDef, name=names, roles=st.lists(roles, max_size=4), metadata=st.dictionaries(st.text(), st.text(), max_size=2))

good_roles = st.builds(
    Role,
    name=st.from_regex(NAME_RE, fullmatch=True),
    entrypoint=st.text(alphabet=string.printable.replace("\x00", ""), min_size=1).filter(str.strip),
    args=st.lists(st.text().filter(lambda s: "\x00" not in s), max_size=4),
    num_replicas=st.integers(1, 64),
    max_retries=st.integers(0, 5),
    retry_policy=st.sampled_from(list(RetryPolicy)),
    resource=st.builds(Resource, cpu=st.integers(0, 128), gpu=st.integers(0, 8), memMB=st.integers(0, 2**20)),
)


@SETTINGS
@given(apps)
def test_validate_app_passes_or_raises_invalid_app_error(app: AppDef) -> None:
    try:
        validate_app(app)
    except InvalidAppError as e:
        msg = str(e)
        assert msg and "\n" not in msg  # one line that says what is wrong
        return
    # it passed: then everything a scheduler relies on holds
    assert NAME_RE.fullmatch(app.name)
    assert app.roles
    assert len({r.name for r in app.roles}) == len(app.roles)
    for r in app.roles:
        assert NAME_RE.fullmatch(r.name)
        assert isinstance(r.num_replicas, int) and r.num_replicas > 0
        assert r.min_replicas is None or 0 < r.min_replicas <= r.num_replicas
        assert "\x00" not in r.entrypoint and r.entrypoint.strip()
        assert all("\x00" not in a for a in r.args)
        assert all(k and "=" not in k and "\x00" not in k + v for k, v in r.env.items())
        for field_name in ("cpu", "gpu", "memMB"):
            v = getattr(r.resource, field_name)
            assert not isinstance(v, bool) and v >= 0 and v == v and v != float("inf")


@SETTINGS
@given(st.from_regex(NAME_RE, fullmatch=True), st.lists(good_roles, min_size=1, max_size=4, unique_by=lambda r: r.name))
def test_well_formed_apps_pass_and_round_trip(name: str, role_list: list[Role]) -> None:
    app = AppDef(name, roles=role_list)
    validate_app(app)
    back = AppDef.from_dict(json.loads(json.dumps(app.to_dict())))
    assert back == app
    validate_app(back)


# -- handles ----------------------------------------------------------------------------------------
part = st.text(alphabet=string.ascii_letters + string.digits + "_.-", min_size=1, max_size=20)
scheduler_part = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,15}", fullmatch=True)
app_id_part = part.filter(lambda s: s not in (".", ".."))
session_part = (part | st.just("")).filter(lambda s: s not in (".", ".."))


@SETTINGS
@given(scheduler_part, session_part, app_id_part)
def test_handle_round_trip(scheduler: str, session: str, app_id: str) -> None:
    handle = make_app_handle(scheduler, session, app_id)
    assert handle == f"{scheduler}://{session}/{app_id}"
    assert parse_app_handle(handle) == (scheduler, session, app_id)


handle_like = st.one_of(
    st.text(max_size=40),
    st.text(alphabet="local:/._-ab0 \n\x00\\", max_size=30),
    st.builds(lambda a, b, c: f"{a}://{b}/{c}", st.text(max_size=8), st.text(max_size=8), st.text(max_size=8)),
)


@SETTINGS
@given(handle_like)
def test_any_text_parses_or_is_malformed(text: str) -> None:
    try:
        parsed = parse_app_handle(text)
    except MalformedAppHandleError as e:
        shown = repr(text) if len(repr(text)) <= 120 else repr(text)[:80]  # a long handle is shown cut short
        assert shown in str(e) and "\n" not in str(e)
        return
    # it parsed: the parts rebuild exactly the text, and none can climb out of a directory
    assert f"{parsed.scheduler}://{parsed.session}/{parsed.app_id}" == text
    assert "/" not in parsed.session and "/" not in parsed.app_id
    assert parsed.app_id not in (".", "..") and parsed.session not in (".", "..")
    assert parsed.app_id.isascii() and parsed.app_id.isprintable() and " " not in parsed.app_id


@SETTINGS
@given(st.text(max_size=10), st.text(max_size=10), st.text(max_size=10))
def test_make_app_handle_returns_or_is_malformed(scheduler: str, session: str, app_id: str) -> None:
    try:
        handle = make_app_handle(scheduler, session, app_id)
    except MalformedAppHandleError:
        return
    assert parse_app_handle(handle) == (scheduler, session, app_id)


# -- run options ------------------------------------------------------------------------------------
TYPES: list[Any] = [str, int, float, bool, list[str], dict[str, str]]
OPTION_NAMES = ["log_dir", "grace_period", "retries", "verbose", "tags", "labels", "queue"]


def _declared() -> runopts:
    o = runopts()
    o.add("log_dir", str, "h", default="/tmp")
    o.add("grace_period", float, "h", default=5)
    o.add("retries", int, "h", default=0)
    o.add("verbose", bool, "h", default=False)
    o.add("tags", list[str], "h", default=["a"])
    o.add("labels", dict[str, str], "h")
    o.add("queue", str, "h", required=True)
    return o


cfg_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=10**300, max_value=10**400)
    | st.floats()
    | st.text(max_size=10)
    | st.sampled_from(["true", "no", "1", "2.5", "a,b", "k:v,k2:v2", ":v", "k=v", " ", ",", "nan", "1e999"]),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=4), children, max_size=3),
    max_leaves=6,
)
cfg_keys = st.sampled_from(OPTION_NAMES) | st.text(max_size=12)


@SETTINGS
@given(st.dictionaries(cfg_keys, cfg_values, max_size=6))
def test_resolve_returns_or_raises_invalid_run_option_error(cfg: dict[str, Any]) -> None:
    opts = _declared()
    try:
        out = opts.resolve(cfg)
    except InvalidRunOptionError as e:
        assert str(e).startswith(("run option '", "unknown run option '"))
        return
    # resolved: every declared option is present and of its type (or None when unset and optional); a key no
    # option declares is passed on as given (one cfg may serve several schedulers)
    assert set(out) == set(OPTION_NAMES) | set(cfg)
    assert all(out[k] == v for k, v in cfg.items() if k not in OPTION_NAMES)
    for name, opt in opts:
        if out[name] is None:
            assert not opt.required
        else:
            assert is_type(out[name], opt.type_)
    assert isinstance(out["grace_period"], float)


@SETTINGS
@given(st.sampled_from(TYPES), st.text(max_size=20))
def test_parse_cfg_value_returns_its_type_or_raises(type_: Any, text: str) -> None:
    try:
        value = parse_cfg_value("opt", text, type_)
    except InvalidRunOptionError as e:
        assert "run option 'opt' expects" in str(e)
        return
    assert is_type(value, type_)


@SETTINGS
@given(st.lists(st.text(alphabet=string.ascii_letters + string.digits + "_-./ ", min_size=1).map(str.strip).filter(bool), max_size=5))
def test_list_string_form_round_trips(items: list[str]) -> None:
    assert parse_cfg_value("o", ",".join(items), list[str]) == items


@SETTINGS
@given(
    st.dictionaries(
        st.text(alphabet=string.ascii_letters + "_", min_size=1, max_size=8),
        st.text(alphabet=string.ascii_letters + string.digits + ":/.", max_size=8),
        max_size=4,
    )
)
def test_dict_string_form_round_trips(d: dict[str, str]) -> None:
    text = ",".join(f"{k}:{v}" for k, v in d.items())
    assert parse_cfg_value("o", text, dict[str, str]) == d


# -- dry run on every builtin scheduler ---------------------------------------------------------------------
BUILTIN_SCHEDULERS = ["local", "local_cwd", "slurm"]
SCHEDULER_OPTIONS = [
    "log_dir", "grace_period", "prepend_cwd", "timers", "cwd", "auto_set_cuda_visible_devices",
    "partition", "time", "job_dir", "kill_grace", "comment", "sbatch_args", "srun_args", "slurm_version",
    "pack_replicas", "exclusive", "requeue", "constraint",
]  # fmt: skip
run_cfgs = st.dictionaries(st.sampled_from(SCHEDULER_OPTIONS) | st.text(max_size=8), cfg_values, max_size=4)
#: Roles that mostly pass validation, so the schedulers' own code meets hostile values: odd images and
#: entrypoints, fractional resources, capabilities, ports, mounts and macros.
env_names = st.text(min_size=1, max_size=8).filter(lambda k: "=" not in k and "\x00" not in k)
plausible_roles = st.builds(
    Role,
    name=st.from_regex(NAME_RE, fullmatch=True),
    image=st.sampled_from(["", "", "", ".", "..", "/", "/nonexistent", "~", "./x", "img:latest", "${img_root}"]),
    entrypoint=st.sampled_from(["true", "true", "true", "python", "/bin/sh", "no-such-program", "./x", "${img_root}/run", "a=b", "-c"]),
    args=st.lists(st.text(max_size=12).filter(lambda a: "\x00" not in a) | st.sampled_from(["${app_id}", "$${rank0_env}"]), max_size=4),
    env=st.dictionaries(env_names, st.text(max_size=12).filter(lambda v: "\x00" not in v), max_size=3),
    num_replicas=st.integers(1, 4),
    min_replicas=st.none() | st.just(1),
    max_retries=st.integers(0, 3),
    retry_policy=st.sampled_from(list(RetryPolicy)),
    resource=st.builds(
        Resource,
        cpu=st.integers(0, 8) | st.floats(0, 8),
        gpu=st.integers(0, 3) | st.floats(0, 3),
        memMB=st.integers(0, 4096) | st.floats(0, 4096),
        capabilities=st.dictionaries(st.sampled_from(["partition", "constraint", "x"]), st.text(max_size=6) | st.integers(), max_size=2),
    ),
    port_map=st.dictionaries(st.from_regex(r"[a-z_][a-z0-9_]{0,5}", fullmatch=True), st.integers(0, 65535), max_size=2),
    mounts=st.lists(st.text(max_size=5), max_size=1),
)
plausible_apps = st.builds(
    AppDef,
    name=st.from_regex(NAME_RE, fullmatch=True),
    roles=st.lists(plausible_roles | good_roles, min_size=1, max_size=3, unique_by=lambda r: r.name),
)
hostile_apps = st.one_of(apps, plausible_apps, plausible_apps, plausible_apps)


@pytest.mark.reliability(
    "random AppDefs and run options: dry run on local, local_cwd and slurm (no cluster)",
    expect="an AppDryRunInfo that prints, or a TsmError; never another exception; TSM_HOME stays empty",
    group="Hostile input",
)
def test_dryrun_returns_a_request_or_raises_tsm_error(tsm_home: Path, dryrun_env: None, figure: Any) -> None:
    outcomes = {"requests": 0, "refused": 0}

    @settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(app=hostile_apps, scheduler=st.sampled_from(BUILTIN_SCHEDULERS), cfg=run_cfgs | st.none())
    def dry_run(app: AppDef, scheduler: str, cfg: dict[str, Any] | None) -> None:
        with get_runner() as runner:
            try:
                info = runner.dryrun(app, scheduler, cfg)
            except TsmError as e:
                assert str(e)
                outcomes["refused"] += 1
            else:
                assert isinstance(info, AppDryRunInfo)
                assert str(info)  # a dry run is a value that prints
                outcomes["requests"] += 1
        assert list(tsm_home.iterdir()) == []  # a dry run writes nothing

    dry_run()
    figure("dry runs that returned a request", outcomes["requests"], "")
    figure("dry runs refused with a TsmError", outcomes["refused"], "")


@pytest.fixture
def dryrun_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No config files, a private working directory, and four GPUs as far as the local scheduler can tell."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
