"""Other projects' faces on tsm: modules that exist only so code written for another tool runs unchanged.

:mod:`tsm.compat.torchx` is TorchX's. Nothing in tsm's own layers imports this package; it imports them.
"""
