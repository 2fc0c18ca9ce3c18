"""Random AppDefs and run options through the docker scheduler's dry run: a printable request or a TsmError,
never another exception, and nothing touches Docker (the dry run is pure)."""

from __future__ import annotations

import string

from hypothesis import HealthCheck, given, settings, strategies as st

from tsm.errors import TsmError
from tsm.schedulers.docker.scheduler import DockerScheduler
from tsm.specs.api import AppDef, Resource, RetryPolicy, Role

texts = st.text(max_size=10).filter(lambda t: "\x00" not in t)
roles = st.builds(
    Role,
    name=st.text(alphabet=string.ascii_letters + "_-.", min_size=1, max_size=8),
    image=st.sampled_from(["", "img:1", "a/b@sha256:" + "0" * 64, "x"]),
    entrypoint=st.sampled_from(["sh", "python3", "${img_root}/run", "-c"]),
    args=st.lists(texts | st.sampled_from(["${app_id}", "$${rank0_env}", "\udcff"]), max_size=4),
    env=st.dictionaries(st.text(min_size=1, max_size=6).filter(lambda k: "=" not in k and "\x00" not in k), texts,
                        max_size=3),
    num_replicas=st.integers(1, 3),
    max_retries=st.integers(0, 2),
    retry_policy=st.sampled_from(list(RetryPolicy)),
    resource=st.builds(Resource, cpu=st.integers(-1, 4), gpu=st.integers(0, 1), memMB=st.integers(-1, 4096)),
)
cfgs = st.dictionaries(st.sampled_from(["pull", "grace_period", "remove_finished", "shm_fraction", "nope"]),
                       st.none() | st.text(max_size=6) | st.integers(-2, 5) | st.floats(-1, 2) | st.booleans(),
                       max_size=3)


class NoEngine:
    """Any use of the client fails the test: a dry run must not talk to Docker."""

    def __getattr__(self, name: str) -> object:
        raise AssertionError(f"the dry run used the Docker client ({name})")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(app_roles=st.lists(roles, min_size=1, max_size=3), cfg=cfgs)
def test_dry_run_gives_a_request_or_a_tsm_error(app_roles: list[Role], cfg: dict[str, object]) -> None:
    s = DockerScheduler("fuzz", client=NoEngine())  # type: ignore[arg-type]
    try:
        info = s.submit_dryrun(AppDef("fuzz", app_roles), cfg)  # type: ignore[arg-type]
    except TsmError:
        return
    text = str(info)
    assert text.count("docker run") == sum(r.num_replicas for r in app_roles)
