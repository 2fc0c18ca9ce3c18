"""Small helpers at TorchX's ``torchx.util`` path (``tsm.util.types``): pure functions, no I/O."""
