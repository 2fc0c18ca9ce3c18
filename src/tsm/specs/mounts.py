"""Mounts a role asks for: a host path, a named volume, or a device, as TorchX spells them.

``Role.mounts`` holds these typed records; each backend maps them to what it has (Docker ``--mount``,
Kubernetes volumes, ...) and refuses what it cannot do at dry run. :func:`parse_mounts` reads the
command-line form, close to Docker's ``--mount``::

    type=bind,src=/data,dst=/data,readonly type=volume,src=cache,dst=/cache type=device,src=/dev/fuse

Each mount starts with ``type=``; options are ``src``/``source``, ``dst``/``destination``/``target``,
``readonly`` (bind and volume) and ``perm`` (device: any of ``r``, ``w``, ``m``; default ``rwm``). A
device's ``dst`` defaults to its ``src``.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

from tsm.errors import InvalidAppError, brief


class MountType(str, enum.Enum):
    """The kinds of mount: ``bind`` (a host path), ``volume`` (a named volume), ``device`` (a device node)."""

    BIND = "bind"
    VOLUME = "volume"
    DEVICE = "device"


@dataclass
class BindMount:
    """Mount host path ``src_path`` at ``dst_path`` inside the replica (read-only if ``read_only``)."""

    src_path: str
    dst_path: str
    read_only: bool = False


@dataclass
class VolumeMount:
    """Mount the named volume (or claim) ``src`` at ``dst_path`` (read-only if ``read_only``)."""

    src: str
    dst_path: str
    read_only: bool = False


@dataclass
class DeviceMount:
    """Expose host device ``src_path`` at ``dst_path`` with cgroup ``permissions`` (letters of ``rwm``)."""

    src_path: str
    dst_path: str
    permissions: str = "rwm"


#: Any of the three mount records.
Mount = BindMount | VolumeMount | DeviceMount

_KEYS = {"src": "src", "source": "src", "dst": "dst", "destination": "dst", "target": "dst",
         "readonly": "readonly", "perm": "perm", "permissions": "perm", "type": "type"}


def parse_mounts(opts: Iterable[str]) -> list[Mount]:
    """Parse ``["type=bind", "src=/a", "dst=/b", "readonly", "type=device", ...]`` into typed mounts.

    Items may also hold several comma-separated options (``"type=bind,src=/a,dst=/b"``). Each mount
    starts with ``type=``; a missing ``src``/``dst``, an unknown option or type, or bad device
    permissions raise :class:`~tsm.errors.InvalidAppError` naming the mount.
    """
    groups: list[dict[str, str]] = []
    for item in opts:
        for token in filter(None, (t.strip() for t in item.split(","))):
            key, sep, value = token.partition("=")
            key = key.strip().lower()
            if key not in _KEYS:
                raise InvalidAppError(f"mount option {brief(token)} is unknown; use type=, src=, dst=, readonly or perm=")
            key = _KEYS[key]
            if key == "type":
                groups.append({})
            elif not groups:
                raise InvalidAppError(f"mount option {brief(token)} comes before any type=bind|volume|device")
            groups[-1][key] = value.strip() if sep else ""
            if key == "type":
                groups[-1]["type"] = value.strip().lower()
    mounts: list[Mount] = []
    for g in groups:
        kind = g.get("type", "")
        where = f"mount type={kind}"
        if kind == MountType.DEVICE.value:
            src = _need(g, "src", where)
            perm = g.get("perm") or "rwm"
            mounts.append(DeviceMount(src_path=src, dst_path=g.get("dst") or src, permissions=perm))
        elif kind in (MountType.BIND.value, MountType.VOLUME.value):
            src, dst = _need(g, "src", where), _need(g, "dst", where)
            ro = "readonly" in g and g["readonly"].lower() not in ("false", "0", "no")
            mounts.append(BindMount(src, dst, ro) if kind == MountType.BIND.value else VolumeMount(src, dst, ro))
        else:
            raise InvalidAppError(f"mount type {brief(kind)} is unknown; use bind, volume or device")
    for m in mounts:
        validate_mount(m, "mounts")
    return mounts


def _need(group: dict[str, str], key: str, where: str) -> str:
    value = group.get(key, "")
    if not value:
        raise InvalidAppError(f"{where}: {key}= is required")
    return value


def validate_mount(mount: object, where: str) -> None:
    """Raise :class:`~tsm.errors.InvalidAppError` unless ``mount`` is a well-formed mount record."""
    if not isinstance(mount, (BindMount, VolumeMount, DeviceMount)):
        raise InvalidAppError(
            f"{where}: {brief(mount)} is not a mount; use tsm.specs.BindMount, VolumeMount or DeviceMount"
        )
    src = mount.src if isinstance(mount, VolumeMount) else mount.src_path
    for label, value in (("source", src), ("destination", mount.dst_path)):
        if not isinstance(value, str) or not value or "\x00" in value:
            raise InvalidAppError(f"{where}: {type(mount).__name__} {label} must be a non-empty string, got {brief(value)}")
    if not mount.dst_path.startswith("/"):
        raise InvalidAppError(f"{where}: {type(mount).__name__} destination {brief(mount.dst_path)} must be an absolute path")
    if isinstance(mount, DeviceMount):
        perms = mount.permissions
        if not isinstance(perms, str) or not perms or set(perms) - set("rwm"):
            raise InvalidAppError(f"{where}: DeviceMount permissions {brief(perms)} must be letters of 'rwm'")
    elif not isinstance(mount.read_only, bool):
        raise InvalidAppError(f"{where}: {type(mount).__name__}.read_only must be a bool, got {brief(mount.read_only)}")


def mount_from_dict(data: dict[str, object]) -> Mount:
    """Rebuild a mount from its ``dataclasses.asdict`` form (as kept in the history)."""
    if "src" in data:
        return VolumeMount(**data)  # type: ignore[arg-type]
    if "permissions" in data:
        return DeviceMount(**data)  # type: ignore[arg-type]
    return BindMount(**data)  # type: ignore[arg-type]
