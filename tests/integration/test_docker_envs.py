"""Lockfile environments on the real Docker engine: an image layer on the role's image, tagged by the key.

Offline from a wheelhouse the test makes: two roles x two replicas run ``/opt/tsm-env/<key>/bin/python``
with the package in it, a retried replica and a sweep's trials reuse the one image built; a changed lock
builds one more; a Python the image does not run fails at submit in one line and creates nothing.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

import tsm
from envkit import make_wheel, uv_lock
from integration.docker_engine import PYTHON_IMAGE, DockerEngine
from tsm.env.build import EnvCache
from tsm.errors import EnvBuildError
from tsm.runner.api import get_runner
from tsm.schedulers.docker.scheduler import DockerScheduler
from tsm.specs.api import AppState, BindMount, Resource, RetryPolicy
from tsm.sweep import run_sweep, sweep_trials, sweep_wait

pytestmark = [pytest.mark.integration, pytest.mark.docker]

HANG = 300.0  # seconds: a guard against a hang, never a performance claim
SESSION = "envit"
PRINT = "import sys, tsmenvdemo; print(sys.executable, tsmenvdemo.__version__)"
SMALL = Resource(cpu=1, memMB=200)


@pytest.fixture
def engine(docker_engine: DockerEngine) -> Iterator[list[str]]:
    """The engine; the environment images a test names in the list it gets are removed after it."""
    made: list[str] = []
    yield made
    s = DockerScheduler(SESSION)
    s.cleanup(include_running=True, session=SESSION)
    s.close()
    for tag in made:
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True)


def _lines(runner: tsm.Runner, handle: str, role: str, n: int) -> list[str]:
    return [line.strip() for i in range(n) for line in runner.log_lines(handle, role, i) if line.strip()]


def test_two_roles_a_retry_and_a_sweep_build_one_image(engine: list[str], tsm_home: Path, tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    make_wheel(wheels, "1.0")
    make_wheel(wheels, "2.0")
    lock = uv_lock(tmp_path / "proj", wheels, "tsmenvdemo==1.0")
    env = tsm.Environment(str(lock), python="3.11")
    flag = tmp_path / "failed-once"
    fail_once = (f"import os, sys\nif os.environ['TSM_REPLICA_ID'] == '0' and not os.path.exists({str(flag)!r}):\n"
                 f"    open({str(flag)!r}, 'w').close(); sys.exit(1)\n" + PRINT)
    app = tsm.AppDef("envs", roles=[
        tsm.Role("a", image=PYTHON_IMAGE, entrypoint="python", args=["-c", PRINT], num_replicas=2, resource=SMALL,
                 environment=env),
        tsm.Role("b", image=PYTHON_IMAGE, entrypoint="python", args=["-c", fail_once], num_replicas=2, resource=SMALL,
                 environment=env, max_retries=1, retry_policy=RetryPolicy.REPLICA,
                 mounts=[BindMount(str(tmp_path), str(tmp_path))]),
    ])
    cfg = {"find_links": [str(wheels)]}
    with get_runner(SESSION) as runner:
        info = runner.dryrun(app, "docker", cfg=cfg)
        tag = info.request.spec["roles"][0]["image"]
        key = tag.rpartition(":")[2]
        engine.append(tag)
        assert f"{key} (not cached: built at submit) as {tag} FROM {PYTHON_IMAGE}" in str(info)
        handle = runner.schedule(info)
        status = runner.wait(handle, wait_interval=0.2, timeout=HANG)
        assert status is not None and status.state == AppState.SUCCEEDED, status
        python = f"/opt/tsm-env/{key}/bin/python"
        assert _lines(runner, handle, "a", 2) == [f"{python} 1.0"] * 2
        assert f"{python} 1.0" in _lines(runner, handle, "b", 2)
        assert flag.exists()  # replica b/0 failed once and was restarted in the same image

        sweep = run_sweep(runner, "utils.python", {"c": [PRINT, PRINT + "  # trial 1"]}, scheduler="docker",
                          parallel=1, cfg={"environment": str(lock), "environment_python": "3.11",
                                           "find_links": [str(wheels)]},
                          args=["--image", PYTHON_IMAGE, "--memMB", "200"])
        assert sweep_wait(sweep, timeout=HANG).state == "SUCCEEDED"
        for t in sweep_trials(sweep):
            assert t.handle and _lines(runner, t.handle, "python", 1) == [f"{python} 1.0"]
        cache = EnvCache(tsm_home / "envs")
        assert [b["key"] for b in cache.builds()] == [key]

        pyproject = lock.parent / "pyproject.toml"  # a changed lock: one more image, then reused
        pyproject.write_text(pyproject.read_text().replace("==1.0", "==2.0"))
        uv_lock(lock.parent, wheels, "tsmenvdemo==2.0")
        for _ in range(2):
            info = runner.dryrun(tsm.AppDef("v2", roles=[app.roles[0]]), "docker", cfg=cfg)
            engine.append(info.request.spec["roles"][0]["image"])
            h = runner.schedule(info)
            assert runner.wait(h, wait_interval=0.2, timeout=HANG).state == AppState.SUCCEEDED  # type: ignore[union-attr]
            assert _lines(runner, h, "a", 2)[0].endswith(" 2.0")
        assert len(cache.builds()) == 2


def test_a_python_the_image_does_not_run_fails_at_submit(engine: list[str], tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    make_wheel(wheels, "1.0")
    lock = uv_lock(tmp_path / "proj", wheels, "tsmenvdemo==1.0")
    role = tsm.Role("a", image=PYTHON_IMAGE, entrypoint="python", args=["-c", PRINT], resource=SMALL,
                    environment=tsm.Environment(str(lock), python="3.12"))
    with get_runner(SESSION) as runner:
        info = runner.dryrun(tsm.AppDef("wrongpy", roles=[role]), "docker", cfg={"find_links": [str(wheels)]})
        engine.append(info.request.spec["roles"][0]["image"])
        with pytest.raises(EnvBuildError) as e:
            runner.schedule(info)
    assert "\n" not in str(e.value) and "the image runs Python 3.11" in str(e.value), str(e.value)
    assert not [a for a in runner.list("docker") if "wrongpy" in a.app_handle]
