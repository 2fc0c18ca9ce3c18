"""Store a workspace snapshot on a login node: ``python3 -c <this file's text> STORE DIGEST``.

Reads a tar on stdin of ``objects/ab/<sha256>[.x]`` files (the objects STORE lacks) and ``manifest.json``,
checks each object's SHA-256 as it lands (a partial or damaged object is never stored), then builds
``STORE/snapshots/DIGEST`` from hard links to the objects, read-only, in a temporary directory renamed into
place. Runs in the login node's ``python3``, where tsm need not be installed: the standard library only, and
syntax any Python 3 reads.
"""

import hashlib
import json
import os
import secrets
import shutil
import sys
import tarfile

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any


def receive(store: str) -> "dict[str, Any] | None":
    """Store the objects of the tar on stdin; the manifest it carried (None when it carried none)."""
    manifest = None
    with tarfile.open(fileobj=sys.stdin.buffer, mode="r|*") as tar:
        for m in tar:
            f = tar.extractfile(m) if m.isfile() else None
            if f is None:
                continue
            data = f.read()
            if m.name == "manifest.json":
                manifest = json.loads(data)
                continue
            parts = m.name.split("/")
            if len(parts) != 3 or parts[0] != "objects" or ".." in parts or parts[2][:2] != parts[1]:
                sys.exit(f"tsm: unexpected member {m.name!r}")
            want = parts[2][:-2] if parts[2].endswith(".x") else parts[2]
            if hashlib.sha256(data).hexdigest() != want:
                sys.exit(f"tsm: object {m.name} arrived damaged")
            dest = os.path.join(store, m.name)
            os.makedirs(os.path.dirname(dest), mode=0o700, exist_ok=True)
            tmp = os.path.join(store, "tmp", "obj-" + secrets.token_hex(8))
            with open(tmp, "wb") as out:
                out.write(data)
            os.chmod(tmp, 0o555 if parts[2].endswith(".x") else 0o444)
            os.replace(tmp, dest)
    return manifest


def populate(store: str, tmp: str, entries: "list[dict[str, Any]]") -> None:
    """Make the snapshot's tree in ``tmp``: directories, links, and files linked to their objects."""
    dirs = []
    for e in entries:
        p = os.path.join(tmp, e["path"])
        if ".." in e["path"].split("/") or e["path"].startswith("/"):
            sys.exit(f"tsm: bad path {e['path']!r}")
        if e["kind"] == "dir":
            os.mkdir(p, 0o700)
            dirs.append(p)
        elif e["kind"] == "link":
            os.symlink(e["target"], p)
        else:
            obj = os.path.join(store, "objects", e["digest"][:2], e["digest"] + (".x" if e["executable"] else ""))
            try:
                os.link(obj, p)
            except OSError:
                shutil.copyfile(obj, p)
                os.chmod(p, 0o555 if e["executable"] else 0o444)
    for d in sorted(dirs, key=lambda d: -d.count("/")):
        os.chmod(d, 0o555)


def build(store: str, digest: str, entries: "list[dict[str, Any]]") -> None:
    """``STORE/snapshots/DIGEST`` from ``entries``, made aside and renamed into place (a race is no error)."""
    final = os.path.join(store, "snapshots", digest)
    if os.path.isdir(final):
        return
    tmp = os.path.join(store, "tmp", "snap-" + secrets.token_hex(8))
    os.mkdir(tmp, 0o700)
    try:
        populate(store, tmp, entries)
        try:
            os.rename(tmp, final)  # the top stays writable until here: moving a directory updates its ".."
        except OSError:
            if not os.path.isdir(final):
                raise
        else:
            os.chmod(final, 0o555)
    finally:
        if os.path.exists(tmp):  # not renamed: another submission made the snapshot first, or a failure
            for root, _, _ in os.walk(tmp):
                os.chmod(root, 0o700)
            shutil.rmtree(tmp, ignore_errors=True)


def main(argv: "Sequence[str]") -> int:
    """The command line of the module docstring."""
    store, digest = argv[0], argv[1]
    os.umask(0o077)
    for d in ("objects", "snapshots", "tmp"):
        os.makedirs(os.path.join(store, d), mode=0o700, exist_ok=True)
    manifest = receive(store)
    if manifest is None or manifest.get("digest") != digest:
        sys.exit(f"tsm: no manifest for {digest}")
    build(store, digest, manifest["entries"])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
