"""Secrets on Slurm (:mod:`tsm.specs.secrets`): one owner-only file per secret in the app's job directory.

The batch script and the request hold names only. At submit the values are read in the submitting process
(:meth:`Delivery.read`) and the app's host (:mod:`.host`: this machine, or the login node over SSH, in the
same tar stream as the job's first files) writes each into ``<job dir>/secrets/<NAME>`` before ``sbatch``:
the folder 0700, each file 0400, holding the value's bytes and nothing else. The submitter's variables that
hold them are left out of sbatch's environment, which the job would otherwise keep (``--export=ALL``).

Each role's ``srun`` line names the role's secrets to the replicas' wrapper (``programs/replica.sh``, through
:data:`NAMES_VAR`, which it unsets), and the wrapper reads each file into the replica's environment as the
replica starts, at every attempt (a requeue's too): the values never pass through the batch shell, the
job's environment or the script. The folder goes when the app is over: the batch script removes it as it
writes its last exit code, :meth:`~.scheduler.SlurmScheduler.cancel` once the job has ended, and ``remove``
with the rest of the job directory.
"""

from __future__ import annotations

import contextlib
import io
import os
import shlex
import tarfile
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tsm.errors import InvalidAppError, SubmissionError
from tsm.schedulers.slurm.jobdir import SECRETS_DIR as DIR
from tsm.specs.api import AppDef, Role

__all__ = ["DIR", "NAMES_VAR", "Delivery", "add_to_tar", "comment", "entries", "launch_prefix", "remove_dir",
           "role_names", "without", "write_dir"]

#: The variable the batch script sets on a role's ``srun`` to name its secrets to the wrapper (names only).
NAMES_VAR = "TSM_SECRET_NAMES"


def entries(app: AppDef) -> list[str] | None:
    """Every secret the app's roles declare (``str`` of each reference: a name and where its value is read),
    or None when there is none."""
    if not any(role.secrets for role in app.roles):
        return None
    from tsm.specs.secrets import app_secrets

    return [str(ref) for ref in app_secrets(app.roles).values()] or None


def role_names(role: Role) -> list[str]:
    """The names of the secrets ``role``'s replicas get; a name of the wrapper's own (``_tsm_...``) is an
    :class:`~tsm.errors.InvalidAppError`."""
    if not role.secrets:
        return []
    from tsm.specs.secrets import declared

    names = [ref.name for ref in declared(role.secrets, f"role '{role.name}'")]
    for name in names:
        if name.startswith("_tsm_"):
            raise InvalidAppError(f"role '{role.name}': secret {name}: names starting with _tsm_ are the Slurm "
                                  "replicas' wrapper's own")
    return names


def launch_prefix(names: Sequence[str]) -> str:
    """What a role's ``srun`` line starts with to name its secrets to the wrapper ("" when it has none)."""
    return f"{NAMES_VAR}={shlex.quote(' '.join(names))} " if names else ""


def comment(names: Sequence[str]) -> str:
    """The script's line saying which secrets a role's replicas get (names only)."""
    shown = " ".join(f"{n}=<secret>" for n in names)
    return f"# secrets: {shown} (read at submit into $TSM_JOB_DIR/{DIR}/, never shown; each replica reads them)"


@dataclass(frozen=True, repr=False)
class Delivery:
    """The values of an app's secrets, read at submit, on their way to the job directory's files.

    ``hidden``: the submitter's variables that hold them, kept out of sbatch's environment. Never stored; its
    ``repr`` names the secrets only.
    """

    values: Mapping[str, str]
    hidden: frozenset[str]

    def __repr__(self) -> str:
        return f"Delivery(<values of {', '.join(sorted(self.values))}>)"

    @classmethod
    def read(cls, declared: Sequence[str] | None) -> Delivery | None:
        """The values of ``declared`` (a request's entries) read now, or None when it declares none;
        a value that cannot be read is a :class:`~tsm.errors.SecretError`."""
        if not declared:
            return None
        from tsm.specs.secrets import parse_secret, resolve, source_variables

        refs = [parse_secret(e) for e in declared]
        return cls(resolve(refs), frozenset(source_variables(refs)))


def _bytes(value: str) -> bytes:
    return value.encode("utf-8", "surrogateescape")


def write_dir(job_dir: Path, values: Mapping[str, str]) -> None:
    """Write ``values`` as ``job_dir/secrets/<NAME>`` (the folder made 0700, which must not exist; each file
    0400); nothing is left when this fails."""
    folder = job_dir / DIR
    try:
        folder.mkdir(mode=0o700)
    except FileExistsError:
        raise SubmissionError(f"job_dir {job_dir} already holds '{DIR}': choose another directory") from None
    except OSError as e:
        raise SubmissionError(f"cannot make {folder}: {e.strerror or e}") from e
    try:
        os.chmod(folder, 0o700)  # the umask may have taken the owner's bits
        for name, value in values.items():
            fd = os.open(folder / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o400)
            with os.fdopen(fd, "wb") as f:
                os.fchmod(f.fileno(), 0o400)
                f.write(_bytes(value))
    except OSError as e:
        remove_dir(job_dir)
        raise SubmissionError(f"cannot write the secrets' files in {folder}: {e.strerror or e}") from e
    except BaseException:
        remove_dir(job_dir)
        raise


def remove_dir(job_dir: Path) -> None:
    """Remove ``job_dir/secrets`` and its files (best effort)."""
    folder = job_dir / DIR
    with contextlib.suppress(OSError):
        for entry in os.scandir(folder):
            with contextlib.suppress(OSError):
                os.unlink(entry.path)
    with contextlib.suppress(OSError):
        folder.rmdir()


def add_to_tar(tar: tarfile.TarFile, values: Mapping[str, str], mtime: float) -> None:
    """Add the ``secrets`` folder (0700) and a 0400 file per value to the job's tar stream (sent over SSH,
    unpacked on the login node by ``programs/submit.sh``; never written here)."""
    info = tarfile.TarInfo(DIR)
    info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o700, mtime
    tar.addfile(info)
    for name, value in values.items():
        data = _bytes(value)
        info = tarfile.TarInfo(f"{DIR}/{name}")
        info.size, info.mode, info.mtime = len(data), 0o400, mtime
        tar.addfile(info, io.BytesIO(data))


def without(hidden: Collection[str]) -> list[str]:
    """The ``env`` words that run a command without the variables ``hidden`` (none: no words)."""
    return ["env", *(f"--unset={v}" for v in sorted(hidden))] if hidden else []
