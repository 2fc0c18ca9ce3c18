"""General-purpose builtin components: ``utils.echo``, ``utils.touch``, ``utils.sh``, ``utils.python``,
``utils.binary``, ``utils.copy`` and ``utils.booth``.

Each is a plain typed function returning an AppDef, so it can be called from Python as well as from the
command line (``tsm run utils.python -m http.server -- 8000``). Apart from ``utils.sh``, which exists to
run a shell command line, no component here involves a shell: arguments reach the program verbatim.
``utils.copy`` and ``utils.booth`` run a small fixed Python program (``python -c``) that needs nothing but
Python in the image (and ``fsspec`` for URLs such as ``s3://``), where TorchX's run a module of the
``torchx`` package.
"""

from __future__ import annotations

from tsm.components.base import check_script, exactly_one, resource
from tsm.errors import ComponentArgumentError
from tsm.specs.api import NULL_IMAGE, AppDef, Role


def echo(msg: str = "hello world", image: str = NULL_IMAGE, num_replicas: int = 1) -> AppDef:
    """Print a message from each replica (the smallest app there is; handy to try a scheduler).

    Args:
        msg: the message to print
        image: where to run (a directory for the local scheduler, a container image elsewhere)
        num_replicas: how many copies to run
    """
    return AppDef(
        name="echo",
        roles=[
            Role(
                name="echo",
                image=image,
                entrypoint="echo",
                args=[msg],
                num_replicas=num_replicas,
                resource=resource(None),
            )
        ],
    )


def touch(file: str, image: str = NULL_IMAGE) -> AppDef:
    """Create a file (or update its time): a visible side effect, handy for tests.

    Args:
        file: path of the file, relative to the replica's working directory
        image: where to run (a directory for the local scheduler, a container image elsewhere)
    """
    role = Role(name="touch", image=image, entrypoint="touch", args=[file], resource=resource(None))
    return AppDef(name="touch", roles=[role])


def sh(
    *args: str,
    image: str = NULL_IMAGE,
    num_replicas: int = 1,
    cpu: int = 1,
    gpu: int = 0,
    memMB: int = 1024,  # noqa: N803
    h: str | None = None,
    env: dict[str, str] | None = None,
    max_retries: int = 0,
) -> AppDef:
    """Run a shell command line with sh -c (pipes, globs and $VARS work; quote it as for a shell).

    The words are joined with spaces into one command line, e.g. tsm run utils.sh -- 'echo $HOSTNAME | wc -c'.

    Args:
        *args: the command line (joined with spaces)
        image: where to run (a directory for the local scheduler, a container image elsewhere)
        num_replicas: how many copies to run
        cpu: CPUs per replica (ignored with -h)
        gpu: GPUs per replica (ignored with -h)
        memMB: memory per replica in MB (ignored with -h)
        h: a named resource such as gpu.small, instead of cpu/gpu/memMB
        env: environment variables to set, as KEY=value,KEY2=value2
        max_retries: how many times to restart the app after a failure
    """
    if not args:
        raise ComponentArgumentError("give the command line to run after '--', e.g. -- 'echo hi'")
    return AppDef(
        name="sh",
        roles=[
            Role(
                name="sh",
                image=image,
                entrypoint="sh",
                args=["-c", " ".join(args)],
                env=dict(env or {}),
                num_replicas=num_replicas,
                max_retries=max_retries,
                resource=resource(h, cpu, gpu, memMB),
            )
        ],
    )


def python(
    *args: str,
    m: str | None = None,
    c: str | None = None,
    script: str | None = None,
    image: str = NULL_IMAGE,
    name: str = "python",
    cpu: int = 1,
    gpu: int = 0,
    memMB: int = 1024,  # noqa: N803
    h: str | None = None,
    num_replicas: int = 1,
    env: dict[str, str] | None = None,
) -> AppDef:
    """Run Python code: a module (-m), a string (-c) or a script (--script), given exactly one of them.

    Runs python from the replica's PATH, without a shell, e.g. tsm run utils.python -m http.server -- 8000.

    Args:
        *args: arguments for the module, code or script
        m: a module to run, as with python -m
        c: Python code to run, as with python -c
        script: a script file to run
        image: where to run (a directory for the local scheduler, a container image elsewhere)
        name: the name of the app and of its role
        cpu: CPUs per replica (ignored with -h)
        gpu: GPUs per replica (ignored with -h)
        memMB: memory per replica in MB (ignored with -h)
        h: a named resource such as gpu.small, instead of cpu/gpu/memMB
        num_replicas: how many copies to run
        env: environment variables to set, as KEY=value,KEY2=value2
    """
    flag, value = exactly_one(m=m, c=c, script=script)
    check_script(script, image)
    command = [value] if flag == "--script" else [flag, value]
    return AppDef(
        name=name,
        roles=[
            Role(
                name=name,
                image=image,
                entrypoint="python",
                args=[*command, *args],
                env=dict(env or {}),
                num_replicas=num_replicas,
                resource=resource(h, cpu, gpu, memMB),
            )
        ],
    )


def binary(
    *args: str,
    entrypoint: str,
    name: str = "binary",
    num_replicas: int = 1,
    cpu: int = 1,
    gpu: int = 0,
    memMB: int = 1024,  # noqa: N803
    h: str | None = None,
    env: dict[str, str] | None = None,
    image: str = NULL_IMAGE,
) -> AppDef:
    """Run any program with its arguments passed verbatim (no shell), e.g. --entrypoint ls -- -la /tmp.

    Args:
        *args: arguments for the program
        entrypoint: the program: a name looked up on PATH, or a path
        name: the name of the app and of its role
        num_replicas: how many copies to run
        cpu: CPUs per replica (ignored with -h)
        gpu: GPUs per replica (ignored with -h)
        memMB: memory per replica in MB (ignored with -h)
        h: a named resource such as gpu.small, instead of cpu/gpu/memMB
        env: environment variables to set, as KEY=value,KEY2=value2
        image: where to run (a directory for the local scheduler, a container image elsewhere)
    """
    return AppDef(
        name=name,
        roles=[
            Role(
                name=name,
                image=image,
                entrypoint=entrypoint,
                args=list(args),
                env=dict(env or {}),
                num_replicas=num_replicas,
                resource=resource(h, cpu, gpu, memMB),
            )
        ],
    )


#: ``utils.copy``'s program: ``python -c COPY SRC DST``. Plain paths and ``file://`` URLs are copied with the
#: standard library; any other URL (``s3://``, ``gs://``, ...) through ``fsspec``, which must be installed.
COPY = r"""
import shutil, sys
src, dst = sys.argv[1:3]
def local(url):
    return url[len("file://"):] if url.startswith("file://") else (None if "://" in url else url)
if local(src) is not None and local(dst) is not None:
    shutil.copyfile(local(src), local(dst))
else:
    import fsspec
    with fsspec.open(src, "rb") as i, fsspec.open(dst, "wb") as o:
        shutil.copyfileobj(i, o)
print("copied %s to %s" % (src, dst))
"""


def copy(src: str, dst: str, image: str = NULL_IMAGE) -> AppDef:
    """Copy one file from src to dst (paths, or fsspec URLs such as s3://bucket/key); no directories.

    Args:
        src: the file to copy: a path or an fsspec URL
        dst: where to copy it: a path or an fsspec URL
        image: where to run (a directory for the local scheduler, a container image elsewhere)
    """
    return AppDef(
        name="torchx-utils-copy",
        roles=[
            Role(
                name="torchx-utils-copy",
                image=image,
                entrypoint="python",
                args=["-c", COPY, src, dst],
                resource=resource(None),
            )
        ],
    )


#: ``utils.booth``'s program: ``python -c BOOTH X1 X2 TRIAL_IDX TRACKER_BASE``. It prints the value and
#: writes ``{"booth_eval": value}`` as JSON to ``<tracker_base>/<trial_idx>``, where TorchX's
#: ``FsspecResultTracker(tracker_base)[trial_idx]`` reads it (through ``fsspec`` for a URL).
BOOTH = r"""
import json, os, sys
x1, x2, trial, base = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3], sys.argv[4]
value = (x1 + 2 * x2 - 7) ** 2 + (2 * x1 + x2 - 5) ** 2
print("booth(%r, %r) = %r" % (x1, x2, value))
text = json.dumps({"booth_eval": value}, indent=2)
if "://" in base and not base.startswith("file://"):
    import fsspec
    fsspec.get_mapper(base, create=True)[trial] = text.encode()
else:
    base = base[len("file://"):] if base.startswith("file://") else base
    os.makedirs(base, exist_ok=True)
    with open(os.path.join(base, trial), "w") as f:
        f.write(text)
"""


def booth(
    x1: float,
    x2: float,
    trial_idx: int = 0,
    tracker_base: str = "/tmp/torchx-util-booth",
    image: str = NULL_IMAGE,
) -> AppDef:
    """Evaluate the Booth function f(x1, x2) = (x1 + 2*x2 - 7)^2 + (2*x1 + x2 - 5)^2 (a toy for HPO).

    The value is printed and saved as {"booth_eval": value} in <tracker_base>/<trial_idx>.

    Args:
        x1: x1
        x2: x2
        trial_idx: the trial's index (ignore unless running a hyperparameter search)
        tracker_base: folder or fsspec URL where the result is saved
        image: where to run (a directory for the local scheduler, a container image elsewhere)
    """
    return AppDef(
        name="torchx-utils-booth",
        roles=[
            Role(
                name="torchx-utils-booth",
                image=image,
                entrypoint="python",
                args=["-c", BOOTH, repr(x1), repr(x2), str(trial_idx), tracker_base],
                resource=resource(None),
            )
        ],
    )
