"""``local_cwd``, TorchX's name for running an app in the working directory, on tsm's local scheduler.

tsm's ``local`` scheduler runs a role in its image when the image is a directory and refuses any other
image name. TorchX's ``local_cwd`` ignores the image name: replicas run in the working directory, so a
component written for containers (``image="my_app:latest"``) runs locally unchanged. This is that scheduler
on tsm's supervisor (apps outlive the caller, any process can watch them): an image that is not an existing
directory is ignored, and the role runs in the working directory (or the ``cwd`` run option's folder) with
``${img_root}`` naming it. A directory image (a shipped workspace's snapshot) is still used.

The factory also takes TorchX's ``cache_size`` (how many apps TorchX's in-process scheduler keeps): a
positive number is accepted and changes nothing, since tsm keeps every app in its store; any other value is
refused, as TorchX refuses it.
"""

from __future__ import annotations

import copy
import dataclasses
import os
from collections.abc import Mapping
from typing import Any

from tsm.schedulers.local.scheduler import LocalScheduler
from tsm.specs.api import NULL_IMAGE, AppDef, AppDryRunInfo
from tsm.specs.runopts import CfgVal

__all__ = ["CwdLocalScheduler", "create_scheduler"]


def _in_cwd(app: AppDef) -> AppDef:
    """``app`` with every image that is not an existing directory replaced by "the working directory"."""
    if all(not r.image or os.path.isdir(r.image) for r in app.roles):
        return app
    app = copy.copy(app)
    app.roles = [r if not r.image or os.path.isdir(r.image) else dataclasses.replace(r, image=NULL_IMAGE)
                 for r in app.roles]
    return app


class CwdLocalScheduler(LocalScheduler):
    """tsm's local scheduler reading an image that is not a directory as the working directory (TorchX's rule)."""

    def _validate(self, app: AppDef, cfg: Mapping[str, CfgVal]) -> None:
        super()._validate(_in_cwd(app), cfg)

    def _submit_dryrun(self, app: AppDef, cfg: Mapping[str, CfgVal]) -> AppDryRunInfo[Any]:
        return super()._submit_dryrun(_in_cwd(app), cfg)


def create_scheduler(session_name: str, **kwargs: Any) -> CwdLocalScheduler:
    """Factory registered as ``local_cwd``: takes ``backend`` and TorchX's ``cache_size`` (see the module)."""
    from tsm.errors import InvalidRunOptionError
    from tsm.schedulers.common.factory import scheduler_params

    params = scheduler_params("local_cwd", kwargs, ("backend", "cache_size"))
    size = params.get("cache_size", 1)
    if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
        raise InvalidRunOptionError(f"cache_size must be a whole number greater than zero, got {size!r}",
                                    scheduler="local_cwd")
    return CwdLocalScheduler(session_name, str(params.get("backend") or "local"))
