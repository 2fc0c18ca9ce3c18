"""A lockfile environment as an image layer on a role's image, tagged by its key (container backends).

:func:`plan_image` (dry run) keys the environment on the role's *base image id* (as the platform) and points
the role at ``tsm-env:<key>``, recording the plan in the role's metadata (:func:`apply` for every role of an
app); :func:`build_image` (submit; :func:`build_all` for an app)
builds that tag once: under the key's lock on this machine (concurrent launches build once, the others
wait and find it), unless the engine has it already. The layer is built without uv in the image: uv
installs the lock here for the image's Python version and platform (``uv pip install --target``, offline
from a wheelhouse when asked), and the image's own ``python3 -m venv`` makes the environment those files go
into, so ``python`` in a container is ``/opt/tsm-env/<key>/bin/python`` (first on the image's PATH). A
Python in the image of another version than the environment's fails the build, at submit, in one line.
"""

from __future__ import annotations

import copy
import io
import os
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tsm.env.spec import EnvPlan, plan as make_plan
from tsm.errors import EnvBuildError, SubmissionError

if TYPE_CHECKING:
    from tsm.env.options import EnvOptions
    from tsm.specs.api import AppDef, Role
    from tsm.workspace.image import ImageEngine

#: The role metadata key of the plan (what the dry run shows and ``schedule`` builds from).
METADATA_KEY = "tsm.environment"
#: The repository of environment images; the tag is the key.
REPOSITORY = "tsm-env"
#: Where the environment lives in the image.
ROOT = "/opt/tsm-env"
LABEL_ENV = "tsm.environment"
#: How the build's own checks start the line they print when they fail (the error's one line).
_SAID = "tsm-env: "


@dataclass(frozen=True)
class ImageEnvPlan:
    """One role's environment image: its key and tag, the base it is built on, whether it must be built."""

    role: str
    key: str
    tag: str
    base_image: str
    base_image_id: str
    plan: dict[str, Any]
    build: bool

    @classmethod
    def from_metadata(cls, role: Role) -> ImageEnvPlan | None:
        data = role.metadata.get(METADATA_KEY)
        if not isinstance(data, dict) or data.get("tag") != role.image:
            return None
        return cls(role=role.name, key=str(data["key"]), tag=str(data["tag"]), base_image=str(data["base_image"]),
                   base_image_id=str(data["base_image_id"]), plan=dict(data["plan"]), build=bool(data["build"]))


def plan_image(role: Role, env: EnvPlan, client: ImageEngine, pull: str = "missing") -> ImageEnvPlan:
    """Key ``env`` on ``role``'s base image and point the role at its tag (the build runs at submit)."""
    from tsm.env.spec import IndexSettings
    from tsm.specs.environment import Environment

    base = role.image
    base_id = client.image_id(base)
    if base_id is None:
        why = client.ensure_image(base, pull)
        base_id = client.image_id(base)
        if base_id is None:
            raise SubmissionError(f"environment image of role '{role.name}': {why or repr(base) + ' not found'}")
    keyed = make_plan(Environment(env.lock, env.python), IndexSettings(env.index_url, env.find_links),
                      platform=f"image {base_id}", where=f"role '{role.name}': environment")
    tag = f"{REPOSITORY}:{keyed.key}"
    out = ImageEnvPlan(role=role.name, key=keyed.key, tag=tag, base_image=base, base_image_id=base_id,
                       plan=keyed.to_dict(), build=client.image_id(tag) is None)
    role.image = tag
    role.metadata[METADATA_KEY] = {**asdict(out), "lock": keyed.lock, "python": keyed.python}
    return out


def line(p: ImageEnvPlan) -> str:
    """The dry run's line for ``p``: key, whether it is built already, the base and the lock."""
    state = "not cached: built at submit" if p.build else "cached"
    return (f"# environment of role {p.role}: {p.key} ({state}) as {p.tag} FROM {p.base_image} "
            f"from {p.plan['lock']!r}, Python {p.plan['python']}")


def build_image(p: ImageEnvPlan, client: ImageEngine, cache_root: str | os.PathLike[str]) -> bool:
    """Build ``p``'s image unless the engine has its tag; True when this call built it (once per key)."""
    from tsm.env.build import EnvCache

    if client.image_id(p.tag) is not None:
        return False
    cache = EnvCache(cache_root)
    cache.root.mkdir(parents=True, exist_ok=True, mode=0o700)
    import time

    with cache.locked(f"image-{p.key}"):
        if client.image_id(p.tag) is not None:  # built by the launch we waited for
            return False
        t0 = time.monotonic()
        ok = False
        try:
            with tempfile.TemporaryDirectory(prefix="tsm-env-image-") as tmp:
                _engine_build(client, p, _context(EnvPlan.from_dict(p.plan), p.base_image, Path(tmp)))
            ok = True
        finally:
            cache.log_build(EnvPlan.from_dict(p.plan), time.monotonic() - t0, ok)
    return True


def _engine_build(client: ImageEngine, p: ImageEnvPlan, context: bytes) -> None:
    """Build the image; a failed step is one :class:`EnvBuildError` line (the build's log as its ``detail``)."""
    import docker.errors  # type: ignore[import-untyped,unused-ignore]

    try:
        client.api.images.build(fileobj=io.BytesIO(context), custom_context=True, tag=p.tag, labels={LABEL_ENV: p.key},
                                rm=True, forcerm=True)
    except docker.errors.BuildError as e:
        log = "".join(str(x.get("stream", x.get("error", ""))) for x in list(e.build_log))
        said = [ln.strip()[len(_SAID):] for ln in log.splitlines() if ln.strip().startswith(_SAID)]
        raise EnvBuildError(f"environment {p.key} of role '{p.role}': building {p.tag} on {p.base_image} failed: "
                            + (said[-1] if said else str(e.msg).splitlines()[0]), detail=log) from e
    except Exception as e:
        mine = client.translate(f"building {p.tag}", e)
        if mine is not None:
            raise mine from e
        raise


# -- what a container backend calls: at dry run, at submit, to print ------------------------------------------
def apply(app: AppDef, opts: EnvOptions, client: Callable[[], ImageEngine], pull: str) -> tuple[AppDef, list[ImageEnvPlan]]:
    """``app`` (a copy, when any role has an environment) with those roles on their environment images."""
    if not opts.environment and not any(r.environment for r in app.roles):
        return app, []
    from tsm.env.options import role_plan

    plans = {r.name: p for r in app.roles if (p := role_plan(r, opts)) is not None}
    if not plans:
        return app, []
    app = copy.deepcopy(app)
    engine = client()
    out = [plan_image(r, plans[r.name], engine, pull) for r in app.roles if r.name in plans]
    return app, out


def plans_of(app: AppDef) -> list[ImageEnvPlan]:
    """The environment images ``app``'s roles run (recorded in their metadata at dry run)."""
    return [p for p in map(ImageEnvPlan.from_metadata, app.roles) if p is not None]


def build_all(app: AppDef, client: ImageEngine) -> None:
    """Build every environment image of ``app`` the engine lacks (each tag once)."""
    plans = plans_of(app)
    if not plans:
        return
    from tsm.store import tsm_home

    done: set[str] = set()
    for p in plans:
        if p.tag not in done:
            done.add(p.tag)
            build_image(p, client, tsm_home() / "envs")


def fmt(inner: Callable[[Any], str], plans: list[ImageEnvPlan]) -> Callable[[Any], str]:
    """``inner`` (the request's printer) with each role's environment line above what it prints."""
    head = [line(p) for p in plans]
    return lambda req: "\n".join([*head, inner(req)])


def _context(plan: EnvPlan, base_image: str, tmp: Path) -> bytes:
    """The build context: the lock's packages installed for the image's Python, and the Dockerfile."""
    from tsm.env.build import export_requirements, install_target

    reqs = export_requirements(plan, tmp)
    site = tmp / "site"
    install_target(plan, reqs, site)
    root = f"{ROOT}/{plan.key}"
    scripts = tmp / "bin"
    scripts.mkdir()
    if (site / "bin").is_dir():  # console scripts (torchrun): into the environment's bin, run by its python
        for f in sorted((site / "bin").iterdir()):
            data = f.read_bytes()
            if data.startswith(b"#!") and b"python" in data.split(b"\n", 1)[0]:
                data = f"#!{root}/bin/python".encode() + data[data.index(b"\n"):] if b"\n" in data else data
            (scripts / f.name).write_bytes(data)
            (scripts / f.name).chmod(0o755)
        for f in (site / "bin").iterdir():
            f.unlink()
        (site / "bin").rmdir()
    major_minor = ".".join(plan.python.split(".")[:2])
    check = (f"import sys; v = '%d.%d' % sys.version_info[:2]; ok = v == '{major_minor}'; ok or print("
             f"'{_SAID}the image runs Python ' + v + ', the environment is for Python {major_minor}'); "
             "sys.exit(0 if ok else 1)")
    dockerfile = "\n".join([
        f"FROM {base_image}",
        "RUN " + _json(["python3", "-c", check]),
        "RUN " + _json(["python3", "-m", "venv", "--without-pip", root]),
        f"COPY site/ {root}/lib/python{major_minor}/site-packages/",
        f"COPY bin/ {root}/bin/",
        f"ENV PATH={root}/bin:$PATH VIRTUAL_ENV={root} TSM_ENV_KEY={plan.key}",
        "",
    ])
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        data = dockerfile.encode()
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
        tar.add(site, arcname="site")
        tar.add(scripts, arcname="bin")
    return buf.getvalue()


def _json(argv: list[str]) -> str:
    import json

    return json.dumps(argv)
