"""General-purpose builtin components: ``utils.echo``, ``utils.touch``, ``utils.sh``, ``utils.python``, ``utils.binary``.

Each is a plain typed function returning an AppDef, so it can be called from Python as well as from the
command line (``tsm run utils.python -m http.server -- 8000``). Apart from ``utils.sh``, which exists to
run a shell command line, no component here involves a shell: arguments reach the program verbatim.
"""

from __future__ import annotations

from tsm.components.base import exactly_one, resource
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
        roles=[Role(name="echo", image=image, entrypoint="echo", args=[msg], num_replicas=num_replicas)],
    )


def touch(file: str, image: str = NULL_IMAGE) -> AppDef:
    """Create a file (or update its time): a visible side effect, handy for tests.

    Args:
        file: path of the file, relative to the replica's working directory
        image: where to run (a directory for the local scheduler, a container image elsewhere)
    """
    return AppDef(name="touch", roles=[Role(name="touch", image=image, entrypoint="touch", args=[file])])


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
    env: dict[str, str] | None = None,
    image: str = NULL_IMAGE,
) -> AppDef:
    """Run any program with its arguments passed verbatim (no shell), e.g. --entrypoint ls -- -la /tmp.

    Args:
        *args: arguments for the program
        entrypoint: the program: a name looked up on PATH, or a path
        name: the name of the app and of its role
        num_replicas: how many copies to run
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
            )
        ],
    )
