"""TorchX's ``torchx.util``: ``util.entrypoints`` and ``util.io`` are here; ``util.types`` is :mod:`tsm.util.types`."""
