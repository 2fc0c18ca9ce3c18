"""The seed Training Session Manager API, kept working as thin aliases over specs and the runner.

A program written for the original TSM runs after changing only its import line::

    import tsm

    container = tsm.Container(image="/path/to/code").require(tsm.Resource(cpu=1, gpu=0, memMB=512))
    reader = tsm.Role("reader").runs("reader.py", "--shards", "8", LOGLEVEL="INFO").on(container).replicas(1)
    trainer = tsm.ElasticRole("trainer", nproc_per_node=2, nnodes="1:2").runs("train.py").on(container).replicas(2)
    app = tsm.Application("my_app").of(reader, trainer)
    session = tsm.session("my_session")
    handle = session.run(app, scheduler="local", cfg=tsm.RunConfig())
    print(session.wait(handle))

``Role`` is :class:`tsm.specs.Role` itself (its ``runs``/``on``/``replicas`` builders live there);
``Application`` is :class:`tsm.specs.AppDef`; ``session`` makes a :class:`Session`, a Runner whose ``stop``
cancels. Only what the seed API had that the new one lacks is written here: :class:`Container`,
:class:`ElasticRole`, :class:`RunConfig` and :class:`Session`.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from tsm.runner.api import Runner
from tsm.specs.api import AppDef, Resource, Role, macros
from tsm.specs.runopts import CfgVal
from tsm.specs.validate import check_name

Application = AppDef


class Session(Runner):
    """The seed API's session: a :class:`~tsm.runner.api.Runner` whose ``stop`` is the seed's word for cancel.

    TorchX deprecates ``Runner.stop``; programs written for the seed TSM API call ``session.stop(handle)``
    as their documented way to stop an app, so here it cancels without a deprecation warning.
    """

    def stop(self, app_handle: str) -> None:
        """Cancel the app (the seed API's name for :meth:`~tsm.runner.api.Runner.cancel`)."""
        self.cancel(app_handle)


def session(name: str = "default", **scheduler_kwargs: Any) -> Session:
    """A session: the seed API's name for a :class:`~tsm.runner.api.Runner` (``stop`` cancels)."""
    check_name(name, "session name")
    return Session(name, None, None, scheduler_kwargs)


@dataclass
class Container:
    """An image plus the resources and ports each replica running it needs."""

    image: str
    resources: Resource = field(default_factory=Resource)
    port_map: dict[str, int] = field(default_factory=dict)

    def require(self, resources: Resource) -> Container:
        """Set the resources; returns the container for chaining."""
        self.resources = copy.deepcopy(resources)
        return self

    def ports(self, **ports: int) -> Container:
        """Add named ports; returns the container for chaining."""
        self.port_map.update(ports)
        return self


class RunConfig(dict[str, CfgVal]):
    """Run options as the seed API spelled them: ``cfg.set("log_dir", "/tmp")``."""

    def set(self, name: str, value: CfgVal) -> None:
        """Set run option ``name``."""
        self[name] = value

    def get(self, name: str, default: CfgVal = None) -> CfgVal:  # type: ignore[override]
        """Run option ``name``, or ``default``."""
        return super().get(name, default)


class ElasticRole(Role):
    """A role whose entrypoint runs under ``torchrun`` (``python -m torch.distributed.run``).

    Rendezvous (c10d) is on the role's first replica, whose host the scheduler hands every replica at
    run time in the env var named by ``${rank0_env}`` (``$TSM_RANK0_HOST`` locally);
    ``nnodes="min:max"`` makes it elastic. Other keyword arguments become torchrun options
    (``rdzv_port`` picks the rendezvous port; by default a port free on this machine now). The command
    is the one ``dist.ddp`` builds for several nodes: see :mod:`tsm.components.dist`. Its ``python`` is
    found on the replica's PATH: on the local scheduler that is the interpreter that launched the app
    (its bin directory comes first, so an unactivated virtualenv works), on a cluster the image's.
    """

    def __init__(
        self,
        name: str,
        nproc_per_node: int = 1,
        nnodes: str = "1",
        max_restarts: int = 0,
        rdzv_port: int | None = None,
        **torchrun_opts: Any,
    ) -> None:
        super().__init__(name=name)
        self.torchrun_args = ["--nnodes", str(nnodes), "--nproc_per_node", str(nproc_per_node),
                              "--max_restarts", str(max_restarts), "--rdzv_backend", "c10d",
                              "--rdzv_id", macros.app_id, "--role", name]
        for key, value in torchrun_opts.items():
            self.torchrun_args += [f"--{key}", str(value)]
        if rdzv_port is None:
            import socket

            with socket.socket() as s:
                s.bind(("", 0))
                rdzv_port = int(s.getsockname()[1])
        self.rdzv_port = rdzv_port
        self.port_map["c10d"] = rdzv_port  # so cluster schedulers open it, as dist.ddp does
        low, _, _high = str(nnodes).partition(":")
        if _high:
            self.min_replicas = int(low)

    def runs(self, entrypoint: str, *args: str, **env: str) -> ElasticRole:
        """Run ``entrypoint args`` under torchrun; the rendezvous host comes from the replica's env."""
        # The host variable's name is a macro each scheduler fills in; the values are positional
        # parameters of a fixed script, never part of its text.
        script = f'exec python -m torch.distributed.run --rdzv_endpoint "${macros.rank0_env}:$0" "$@"'
        super().runs("sh", "-c", script, str(self.rdzv_port), *self.torchrun_args, entrypoint, *args, **env)
        return self

    def replicas(self, num_replicas: int) -> ElasticRole:
        super().replicas(num_replicas)
        if self.min_replicas is not None and self.min_replicas > num_replicas:
            self.min_replicas = num_replicas
        return self
