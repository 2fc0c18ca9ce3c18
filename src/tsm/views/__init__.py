"""What ``tsm top`` and ``tsm serve`` show: one :class:`~tsm.views.snapshot.Snapshot` model, two faces.

Nothing here is imported by ``import tsm``; the optional libraries (psutil, starlette, uvicorn) are imported
only by the modules that need them, and say which extra to install when missing.
"""
