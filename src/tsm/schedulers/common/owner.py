"""Who owns a container app: the value of the owner label every object tsm makes carries.

A Docker engine or a Kubernetes namespace is shared: other users (and other ``$TSM_HOME``\\ s) run tsm apps
on it too. Every container, network, pod, Job, Service and Secret gets the owner label, and every list,
cleanup and cancel selects by it, so nobody's ``tsm list`` shows, and nobody's cleanup removes, another
user's apps. The value is the login name, as a label value (``[A-Za-z0-9._-]``, at most 63 characters,
alphanumeric at both ends); ``TSM_OWNER`` overrides it (a shared service account naming its user).
"""

from __future__ import annotations

import getpass
import hashlib
import os
import re

_BAD = re.compile(r"[^A-Za-z0-9._-]+")


def owner() -> str:
    """This process's owner label value (see the module docstring)."""
    name = os.environ.get("TSM_OWNER", "")
    if not name:
        try:
            name = getpass.getuser()
        except (KeyError, OSError):  # no passwd entry (a container's arbitrary uid)
            name = f"uid-{os.getuid()}"
    return label_safe(name)


def label_safe(text: str) -> str:
    """``text`` as a label value: other characters become ``-``; a long or changed one ends with a hash."""
    value = _BAD.sub("-", text).strip("-._")
    if value != text or len(value) > 63:
        digest = hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()[:8]
        value = f"{value[:54].strip('-._')}-{digest}".strip("-._")
    return value or "x"
