"""The scheduler contract (:mod:`conformance`) on the real Docker engine of ``scripts/docker-up``.

Each replica runs ``python3`` in the ``tsm-test/python`` image with the test's ``tmp_path`` bind-mounted at
the same path, so the checks that hand files between the test and a replica work unchanged. Two checks
are run in a Docker form instead (see the tests at the end), because their premise differs in containers:

* ``cancel_ends_the_whole_process_tree`` reads host pids a replica writes; a container has its own pid
  namespace. ``test_cancel_ends_every_process_of_the_container`` proves the same from the host side.
* ``args_and_env_arrive_byte_exact``: Docker's API is JSON text, so values holding bytes that are not
  UTF-8 cannot reach a container; the scheduler refuses them at dry run (checked), and every other
  value of the corpus arrives byte for byte (checked).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import hostile
from integration.docker_engine import PYTHON_IMAGE, DockerEngine
from schedulers import conformance
from schedulers.conformance import CHECKS, Backend
from tsm.errors import InvalidAppError
from tsm.schedulers.api import Stream
from tsm.specs.api import AppDef, AppDryRunInfo, AppState, Role
from tsm.specs.mounts import BindMount

pytestmark = [pytest.mark.integration, pytest.mark.docker]

#: checks run here in a Docker form (module docstring)
REPLACED = {"cancel_ends_the_whole_process_tree", "args_and_env_arrive_byte_exact"}


class DockerBackend(Backend):
    """The contract's backend, with roles that run in the test image and see ``tmp_path``."""

    tmp_path: Path = Path("/tmp")

    def role(self, name: str, *args: str, **kw: Any) -> Role:
        mounts = [BindMount(str(self.tmp_path), str(self.tmp_path))]
        return Role(name, image=PYTHON_IMAGE, entrypoint="python3", args=list(args), resource=conformance.SMALL,
                    mounts=mounts, **kw)


def _inspect(name: str) -> dict[str, Any]:
    out = subprocess.run(["docker", "inspect", name], capture_output=True, text=True, check=True).stdout
    return json.loads(out)[0]  # type: ignore[no-any-return]


def check_submitted(app_id: str, info: AppDryRunInfo[Any]) -> None:
    """What Docker holds for each container is exactly the request's."""
    for c in info.request.containers:
        held = _inspect(c.name)
        assert held["Config"]["Entrypoint"] == [c.command[0]]
        assert held["Config"]["Cmd"] == c.command[1:]
        assert held["Config"]["Image"] == c.image
        assert held["Config"]["Hostname"] == c.hostname
        assert {k: v for k, v in held["Config"]["Labels"].items() if k.startswith("tsm.")} == c.labels
        env = dict(e.split("=", 1) for e in held["Config"]["Env"])
        assert {k: env[k] for k in c.env} == c.env
        assert held["HostConfig"]["NanoCpus"] == (c.nano_cpus or 0)
        assert held["HostConfig"]["Memory"] == (c.mem_limit or 0)


@pytest.fixture
def backend(docker_engine: DockerEngine, tmp_path: Path) -> Iterator[Backend]:
    from tsm.schedulers.docker import create_scheduler

    s = create_scheduler("conformance")
    b = DockerBackend("docker", s, "nosuchapp-00000000", check_submitted, retries=True)
    b.tmp_path = tmp_path
    yield b
    s.cleanup(include_running=True, session="conformance")
    s.close()


@pytest.mark.parametrize("check", sorted(set(CHECKS) - REPLACED))
def test_contract(backend: Backend, check: str, tmp_path: Path) -> None:
    fn = CHECKS[check]
    kwargs: dict[str, Any] = {"tmp_path": tmp_path} if "tmp_path" in fn.__code__.co_varnames else {}
    fn(backend, **kwargs)


def test_replaced_checks_exist() -> None:
    """The checks replaced here are still in the suite (a rename would silently drop the replacement)."""
    assert set(CHECKS) >= REPLACED


def test_cancel_ends_every_process_of_the_container(backend: Backend) -> None:
    code = "import subprocess; subprocess.Popen(['sleep', '600']); import time; time.sleep(600)"
    app_id = backend.submit(AppDef("tree", [backend.role("r", "-c", code)]))
    info = _inspect(f"{app_id}-r-0")
    conformance._wait_until(lambda: _inspect(f"{app_id}-r-0")["State"]["Running"], "the container to run")
    pid = _inspect(f"{app_id}-r-0")["State"]["Pid"]
    assert pid and conformance._alive(pid) and info
    backend.sched.cancel(app_id)
    assert conformance._ended(backend, app_id) == AppState.CANCELLED
    conformance._wait_until(lambda: not conformance._alive(pid), "the container's init to end")
    gone = subprocess.run(["docker", "ps", "-aq", "--filter", f"label=tsm.app-id={app_id}"], capture_output=True,
                          text=True, check=True).stdout
    assert gone == ""


def test_args_and_env_arrive_byte_exact_when_utf8(backend: Backend, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"

    all_args, all_env = hostile.args(str(marker)), hostile.env(str(marker))
    args = [a for a in all_args if hostile.is_utf8(a)]
    env = {k: v for k, v in all_env.items() if hostile.is_utf8(k) and hostile.is_utf8(v)}
    assert len(args) > 40 and len(args) < len(all_args)  # the corpus has both kinds
    app_id = backend.submit(AppDef("hostile", [backend.role("r", "-c", hostile.DUMP, *args, env=env)]))
    assert conformance._ended(backend, app_id) == AppState.SUCCEEDED
    out = "".join(backend.sched.log_iter(app_id, "r", 0, streams=Stream.STDOUT))
    got_args, got_env = hostile.read_dump(out)
    assert not hostile.mismatches(got_args, got_env, args, env)
    assert not marker.exists()
    bad = next(a for a in all_args if not hostile.is_utf8(a))
    with pytest.raises(InvalidAppError, match="not UTF-8"):
        backend.sched.submit_dryrun(AppDef("bytes", [backend.role("r", "-c", "pass", bad)]))
