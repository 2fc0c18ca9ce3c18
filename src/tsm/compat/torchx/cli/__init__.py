"""TorchX's ``torchx`` command on tsm: ``torchx run | status | log | describe | list | cancel | builtins |
runopts | configure | tracker`` with TorchX's flags, words and exit codes, on tsm's runner and CLI helpers.

Two ways to start it: the opt-in console script ``torchx`` (the ``tsm-torchx-cli`` distribution in
``packaging/``), which refuses to start over an installed torchx, and ``python -m tsm.torchx_alias -m
torchx.cli.main ...`` under the alias. :mod:`tsm.compat.torchx.cli.main` says what each command does and
where it differs from TorchX 0.7's.
"""
