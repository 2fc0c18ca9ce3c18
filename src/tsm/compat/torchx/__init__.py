"""The TorchX wing: TorchX's shapes on tsm, laid out at TorchX's module paths.

Each module here is the body of one TorchX module path: ``tsm.compat.torchx.specs.finder`` is what
``torchx.specs.finder`` is. Two kinds live here:

* **TorchX-only modules**, which tsm itself has no use for: the in-process ``schedulers.local_scheduler``
  that tools subclass, ``specs.finder``, ``specs.builders``, ``specs.file_linter`` (TorchX's linter words),
  the AWS and generic named-resource tables, the ``*_scheduler`` modules and ``util.entrypoints``. tsm's
  modules at the same paths (``tsm.specs.finder``, ...) are stubs that only re-export these (:data:`STUBS`),
  so code whose import lines were renamed from ``torchx`` to ``tsm`` finds them too. The nightly's
  ``plugins`` registry is here alone (tsm's own plugin discovery is :mod:`tsm.runner.plugins`).
* **TorchX's face of a module whose tsm rules are stricter**: ``specs`` (the package), ``schedulers``
  (TorchX's registry and default), ``runner`` (TorchX's runner contract) and ``components``. These have no
  stub: ``tsm.runner`` keeps tsm's rules, ``torchx.runner`` is TorchX's (``docs/torchx-compat.md`` says which
  names differ and how).

Under ``python -m tsm.torchx_alias`` an import of ``torchx.<path>`` is answered by the module here when there
is one, else by ``tsm.<path>`` (:mod:`tsm.torchx_alias`). This package imports tsm's layers; nothing below
it imports this package.
"""

#: tsm's modules at TorchX-only paths -> the wing module each re-exports (and nothing else).
STUBS: dict[str, str] = {
    "tsm.schedulers.local_scheduler": "tsm.compat.torchx.schedulers.local_scheduler",
    "tsm.schedulers.docker_scheduler": "tsm.compat.torchx.schedulers.docker_scheduler",
    "tsm.schedulers.kubernetes_scheduler": "tsm.compat.torchx.schedulers.kubernetes_scheduler",
    "tsm.schedulers.slurm_scheduler": "tsm.compat.torchx.schedulers.slurm_scheduler",
    "tsm.cli.argparse_util": "tsm.compat.torchx.cli.argparse_util",
    "tsm.cli.cmd_base": "tsm.compat.torchx.cli.cmd_base",
    "tsm.specs.builders": "tsm.compat.torchx.specs.builders",
    "tsm.specs.file_linter": "tsm.compat.torchx.specs.file_linter",
    "tsm.specs.finder": "tsm.compat.torchx.specs.finder",
    "tsm.specs.named_resources_aws": "tsm.compat.torchx.specs.named_resources_aws",
    "tsm.specs.named_resources_generic": "tsm.compat.torchx.specs.named_resources_generic",
}

#: The wing's faces of tsm modules whose own rules are stricter (TorchX path -> wing module); these have no stub.
FACES: dict[str, str] = {
    "torchx.specs": "tsm.compat.torchx.specs",
    "torchx.schedulers": "tsm.compat.torchx.schedulers",
    "torchx.schedulers.api": "tsm.compat.torchx.schedulers.api",
    "torchx.runner": "tsm.compat.torchx.runner",
    "torchx.runner.api": "tsm.compat.torchx.runner.api",
    "torchx.util": "tsm.compat.torchx.util",
    "torchx.workspace": "tsm.compat.torchx.workspace",
    "torchx.workspace.api": "tsm.compat.torchx.workspace.api",
    # the `torchx` command: TorchX's subcommands, beside tsm's own at tsm.cli
    "torchx.cli": "tsm.compat.torchx.cli",
    "torchx.cli.main": "tsm.compat.torchx.cli.main",
    "torchx.cli.cmd_run": "tsm.compat.torchx.cli.cmd_run",
    "torchx.cli.cmd_log": "tsm.compat.torchx.cli.cmd_log",
    "torchx.cli.cmd_status": "tsm.compat.torchx.cli.cmd_status",
    "torchx.cli.cmd_runopts": "tsm.compat.torchx.cli.cmd_runopts",
    "torchx.cli.cmd_tracker": "tsm.compat.torchx.cli.cmd_tracker",
}
