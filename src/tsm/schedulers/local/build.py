"""The local scheduler's dry run: an app and its options become a :class:`LocalRequest`, one command,
working directory and environment per replica, each checked before anything runs (its interpreter has what
the role needs, its command exists, it fits the kernel's exec limit)."""

from __future__ import annotations

import os
from typing import Any

from tsm.errors import InvalidAppError
from tsm.schedulers.common.interpreter import check_needs
from tsm.schedulers.local import envs as local_envs
from tsm.schedulers.local.request import (
    LocalOptions,
    LocalReplicaRequest,
    LocalRequest,
    LocalRoleRequest,
    assign_gpus,
    detect_gpus,
    lifecycle_request,
    python_entrypoint,
    replica_path,
)
from tsm.specs.api import AppDef, Role, macros
from tsm.specs.validate import check_exec_size, exec_limit
from tsm.store import tsm_home

Gpus = dict[tuple[str, int], list[str]]


def build_request(app: AppDef, opts: LocalOptions, session: str) -> LocalRequest:
    """The request of ``app`` under a new app id; raises InvalidAppError for a role that cannot start."""
    # what secrets.token_hex(4) returns, without importing secrets (hmac, hashlib, random: 7 ms of `tsm run`)
    app_id = f"{app.name}-{os.urandom(4).hex()}"
    app_dir = str(tsm_home() / "local" / app_id)
    log_dir = os.path.join(os.path.abspath(opts.log_dir), app_id) if opts.log_dir else os.path.join(app_dir, "logs")
    default_cwd = os.path.abspath(opts.cwd) if opts.cwd else os.getcwd()
    queue: dict[str, Any] = {}
    gpus: Gpus = {}
    if opts.queue:  # the supervisor reserves, and assigns GPUs, when the app's turn comes
        from tsm.schedulers.local import resources

        queue = resources.demand(app.to_dict()["roles"])
        if (why := resources.too_big(queue, resources.inventory())) is not None:
            raise InvalidAppError(f"{why}: with -c queue=true it would wait forever; lower the role's resource")
        queue["assign_gpus"] = opts.auto_set_cuda_visible_devices
    elif opts.auto_set_cuda_visible_devices:
        gpus = assign_gpus(app.roles, detect_gpus())
    env_plans: dict[str, Any] = {}
    roles = [_role_request(role, opts, app_id, default_cwd, gpus, env_plans) for role in app.roles]
    secrets: list[str] = []
    if any(role.secrets for role in app.roles):
        from tsm.specs.secrets import app_secrets, declared

        secrets = [str(ref) for ref in app_secrets(app.roles).values()]
        for role, rreq in zip(app.roles, roles, strict=True):
            rreq.secrets = [ref.name for ref in declared(role.secrets, f"role '{role.name}'")]
    return LocalRequest(
        app_id=app_id, app_name=app.name, session=session, app_dir=app_dir, log_dir=log_dir,
        grace_period=opts.grace_period, roles=roles, spec=local_envs.annotate(app.to_dict(), env_plans), timers=opts.timers,
        lifecycle=lifecycle_request(opts), queue=queue, environments={k: p.to_dict() for k, p in env_plans.items()},
        secrets=secrets,
    )  # fmt: skip


def _role_request(role: Role, opts: LocalOptions, app_id: str, default_cwd: str, gpus: Gpus,
                  env_plans: dict[str, Any]) -> LocalRoleRequest:
    """The commands of every replica of ``role``, run in its image directory (else ``default_cwd``)."""
    img_root = os.path.abspath(role.image) if role.image else default_cwd
    rreq = LocalRoleRequest(role.name, role.max_retries, role.retry_policy.value, sorted(role.port_map))
    path_prefix = []
    if role.image:
        path_prefix.append(img_root)
    if opts.prepend_cwd:
        path_prefix.append(os.getcwd())
    python, env_plan = local_envs.role_python(role, opts, opts.python, env_plans)  # interpreter.py, or a lock
    check_needs(python, role.name, role.metadata)  # a package the role names (dist.ddp: torch) is there
    # Unless ${replica_id} is in what a replica runs with, every replica's command is the same and its
    # environment differs only in TSM_REPLICA_ID (and CUDA_VISIBLE_DEVICES): the macros are applied once per
    # role, and the exec size is counted once (a replica that could be over the limit is still checked in
    # full, so the error is the same). Only the command and env are substituted: no copy of the role.
    plain = not any("replica_id" in text for text in (role.entrypoint, *role.args, *role.env.values()))
    shared = macros.Values(img_root=img_root, app_id=app_id, replica_id="0").command(role) if plain else None
    size0 = None
    for i in range(role.num_replicas):
        entrypoint, args, role_env = shared or macros.Values(img_root=img_root, app_id=app_id,
                                                             replica_id=str(i)).command(role)  # fmt: skip
        env = dict(role_env)
        env.update({"TSM_APP_ID": app_id, "TSM_ROLE_NAME": role.name, "TSM_REPLICA_ID": str(i),
                    "TSM_NUM_REPLICAS": str(role.num_replicas), "TSM_RANK0_HOST": "localhost"})  # fmt: skip
        # Python replicas' output reaches the log live; a role that sets PYTHONUNBUFFERED itself (e.g. "" so
        # that print(..., flush=True) is one write) keeps its own value.
        env.setdefault("PYTHONUNBUFFERED", "1")
        if "TORCHX_JOB_ID" in env:  # the runner sets TorchX's names unless torchx_env=false
            env["TORCHX_RANK0_HOST"] = env["TSM_RANK0_HOST"]
        env["PATH"] = replica_path(path_prefix, role_env.get("PATH"), python)
        local_envs.replica_env(env_plan, env)
        if (role.name, i) in gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus[(role.name, i)])
        cmd = [*python_entrypoint(entrypoint, img_root, python), *args]
        # what the supervisor will exec: the caller's environment under the replica's own
        if size0 is None or size0 + len(str(i)) - 1 > exec_limit():
            size = check_exec_size(f"role '{role.name}' replica {i}", cmd, env, inherit=True)
            if plain and i == 0 and not gpus:
                size0 = size
        rreq.replicas.append(LocalReplicaRequest(i, cmd, img_root, env))
    if env_plan is None or not local_envs.will_exist(rreq.replicas[0].cmd[0], {"": env_plan.to_dict()}):
        check_entrypoint(role, rreq)
    return rreq


def check_entrypoint(role: Role, rreq: LocalRoleRequest) -> None:
    """Refuse a role whose command cannot start: neither an executable file nor a command on PATH.

    A non-executable ``*.py`` file of the image was already turned into ``<interpreter> FILE`` by
    :func:`~tsm.schedulers.local.request.python_entrypoint`, so its command starts with the interpreter.
    """
    rep = rreq.replicas[0]
    exe = rep.cmd[0]
    path = rep.env.get("PATH", os.environ.get("PATH", os.defpath))
    if os.sep in exe:
        target = exe if os.path.isabs(exe) else os.path.join(rep.cwd or os.getcwd(), exe)
        ok = os.path.isfile(target) and os.access(target, os.X_OK)
    else:
        import shutil  # not at module level: `tsm status`/`list` never need it

        ok = shutil.which(exe, path=path) is not None
    if not ok:
        raise InvalidAppError(f"role '{role.name}': entrypoint {exe!r} is not an executable file or a command on PATH")
