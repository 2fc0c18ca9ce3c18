"""TorchX's ``schedulers.kubernetes_scheduler`` at TorchX's path: tsm's Kubernetes scheduler under TorchX's names.

``KubernetesScheduler`` *is* tsm's (:class:`tsm.schedulers.kubernetes.scheduler.KubernetesScheduler`), so
subclasses run on tsm's backend. Importing this module does not import the Kubernetes client.
"""

from __future__ import annotations

from tsm.schedulers.kubernetes import create_scheduler as create_scheduler
from tsm.schedulers.kubernetes.scheduler import KubernetesScheduler as KubernetesScheduler

__all__ = ["KubernetesScheduler", "create_scheduler"]
