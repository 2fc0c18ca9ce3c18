"""TorchX's ``torchx.runtime``: what an app's own code imports while it runs (``runtime.tracking``)."""
