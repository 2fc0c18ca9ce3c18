"""Small helpers at TorchX's ``torchx.util`` path: ``types`` and ``text`` (pure functions), and ``daemon``
(how tsm's detached helper processes start, stay one of a kind and end: standard library only)."""
