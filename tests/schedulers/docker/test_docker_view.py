"""The Docker views hook's pure parts: figures from a container stats answer (as dockerd 20.10 gave them)."""

from __future__ import annotations

from tsm.schedulers.docker.view import cpu_ns, memory_mb

# trimmed from api.stats(name, stream=False, one_shot=True) on scripts/docker-up's engine (cgroup v1)
V1 = {"cpu_stats": {"cpu_usage": {"total_usage": 4193809515}, "system_cpu_usage": 22962270000000},
      "memory_stats": {"usage": 37007360, "stats": {"total_inactive_file": 675840, "inactive_file": 675840}}}
# the shape of the same answer under cgroup v2
V2 = {"cpu_stats": {"cpu_usage": {"total_usage": 10}}, "memory_stats": {"usage": 2**21, "stats": {"inactive_file": 2**20}}}


def test_memory_is_usage_less_inactive_file_cache() -> None:
    assert memory_mb(V1) == round((37007360 - 675840) / 2**20, 1)
    assert memory_mb(V2) == 1.0
    assert memory_mb({"memory_stats": {}}) is None  # a stopped container: n/a
    assert memory_mb({}) is None


def test_cpu_time_in_nanoseconds() -> None:
    assert cpu_ns(V1) == 4193809515
    assert cpu_ns({"cpu_stats": {}}) is None


def test_the_sampler_takes_turns_when_there_are_more_containers_than_a_round_holds() -> None:
    from tsm.schedulers.docker.client import DockerClient
    from tsm.schedulers.docker.view import StatsSampler

    sampler = StatsSampler(DockerClient(), limit=2)  # no engine is reached: _batch only picks names
    wanted = ["a", "b", "c"]
    rounds = [sampler._batch(wanted) for _ in range(3)]
    assert rounds == [["a", "b"], ["c", "a"], ["b", "c"]]
    assert sampler._batch(["x"]) == ["x"]
