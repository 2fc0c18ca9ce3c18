"""Workspaces over SSH: the local content-addressed snapshot, shipped to a store on the cluster by content.

``tsm run -s slurm -c ssh=login --workspace .`` snapshots the tree locally first, as for any directory
workspace (:mod:`tsm.workspace.dir`: ``$TSM_HOME/workspaces/objects`` holds one file per distinct
content, named by its SHA-256). The cluster keeps the same shape under ``<remote_home>/workspaces``
(``objects/ab/<sha256>[.x]``, ``snapshots/<digest>/``), and a submission

1. asks whether the snapshot ``<digest>`` is already there (one remote command, nothing else sent: an
   unchanged tree ends here) and, if not, which of its objects the cluster lacks (the names on stdin);
2. sends only those objects and the manifest in one tar stream (gzip level 1) over the master connection, to
   ``programs/ws_build.py`` in the login node's ``python3``, which checks each object's SHA-256 as it lands
   (a partial or corrupt object is never stored), then builds ``snapshots/<digest>`` from hard links,
   read-only, and renames it into place.

So an unchanged tree sends nothing and a one-file edit sends that one file (plus the manifest). The dry
run only names the remote snapshot (``role.image``); nothing is sent until :meth:`SlurmScheduler.schedule`.
Needs ``python3`` on the login node (any 3.x).
"""

from __future__ import annotations

import io
import json
import tarfile
from dataclasses import dataclass
from pathlib import Path

from tsm.errors import SubmissionError
from tsm.schedulers.common.ssh import SshConnection
from tsm.schedulers.slurm import programs
from tsm.specs.api import AppDef
from tsm.workspace.api import METADATA_KEY


@dataclass
class ShipReport:
    """What shipping a snapshot sent: files (objects) and bytes of the tar stream; ``reused`` when none."""

    digest: str
    files_sent: int = 0
    bytes_sent: int = 0
    reused: bool = False


def remote_workspace_roles(app: AppDef, remote_home: str) -> list[str]:
    """Point every role that runs in a local workspace snapshot at its remote twin; the digests to ship.

    The role's ``PYTHONPYCACHEPREFIX`` (set by the local builder) moves to ``<remote_home>/workspaces/pycache``.
    """
    from tsm.workspace.scanning import workspaces_home

    digests: list[str] = []
    local_cache = str(workspaces_home() / "pycache")
    for role in app.roles:
        meta = role.metadata.get(METADATA_KEY)
        if not isinstance(meta, dict) or not meta.get("digest") or role.image != meta.get("snapshot"):
            continue
        digest = str(meta["digest"])
        role.image = f"{remote_home}/workspaces/snapshots/{digest}"
        if role.env.get("PYTHONPYCACHEPREFIX") == local_cache:
            role.env["PYTHONPYCACHEPREFIX"] = f"{remote_home}/workspaces/pycache"
        meta["remote_snapshot"] = role.image
        if digest not in digests:
            digests.append(digest)
    return digests


def ship(conn: SshConnection, remote_home: str, digest: str) -> ShipReport:
    """Make ``<remote_home>/workspaces/snapshots/<digest>`` exist, sending only the objects it lacks."""
    from tsm.workspace.scanning import workspaces_home

    home = workspaces_home()
    try:
        manifest = json.loads((home / "manifests" / f"{digest}.json").read_text())
    except (OSError, ValueError) as e:
        raise SubmissionError(f"workspace snapshot {digest}: its manifest is gone from {home}: {e}") from e
    objects: dict[str, int] = {}
    for ent in manifest["entries"]:
        if ent["kind"] == "file":
            objects[f"objects/{ent['digest'][:2]}/{ent['digest']}{'.x' if ent['executable'] else ''}"] = ent["size"]
    store = f"{remote_home}/workspaces"
    check = ["sh", "-c", programs.text("ws_check.sh"), "tsm-ws", store, digest]
    proc = conn.run([*check, "0"])  # an unchanged tree: nothing sent
    if proc.returncode == 0 and proc.stdout.strip() == "have-snapshot":
        return ShipReport(digest, reused=True)
    proc = conn.run([*check, "1"], input="".join(f"{o}\n" for o in objects))
    if proc.returncode != 0:
        raise SubmissionError(f"cannot read the workspace store {store} on {conn.target}: {proc.stderr.strip()}")
    if proc.stdout.strip() == "have-snapshot":
        return ShipReport(digest, reused=True)
    missing = [o for o in proc.stdout.splitlines() if o in objects]
    buf = io.BytesIO()
    # gzip at level 1: cheap, and it drops tar's 10 KiB padding from a one-file edit
    with tarfile.open(fileobj=buf, mode="w:gz", format=tarfile.PAX_FORMAT, compresslevel=1) as tar:
        for rel in missing:
            tar.add(str(Path(home, rel)), arcname=rel, recursive=False)
        data = json.dumps({"digest": digest, "entries": manifest["entries"]}).encode()
        info = tarfile.TarInfo("manifest.json")
        info.size, info.mode = len(data), 0o600
        tar.addfile(info, io.BytesIO(data))
    payload = buf.getvalue()
    out = conn.run_bytes(["python3", "-c", programs.text("ws_build.py"), store, digest], input=payload, timeout=600)
    if out.returncode != 0:
        err = out.stderr.decode("utf-8", "replace").strip().splitlines()
        why = err[-1] if err else f"exit {out.returncode}"
        if out.returncode == 127:
            why = "python3 is not on the remote PATH (workspaces over SSH need it on the login node)"
        raise SubmissionError(f"cannot store workspace {digest[:12]} on {conn.target}: {why}")
    return ShipReport(digest, files_sent=len(missing), bytes_sent=len(payload))

