"""The engines' fixtures for the documents' engine examples (the same ones tests/integration uses)."""

from integration.docker_engine import docker_engine
from integration.k8s_cluster import k8s_cluster
from integration.ray_cluster import ray_cluster
from integration.slurm_cluster import slurm_cluster

__all__ = ["docker_engine", "k8s_cluster", "ray_cluster", "slurm_cluster"]
