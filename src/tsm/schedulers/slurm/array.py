"""A sweep of single-role trials as one Slurm job array, ``--array=0-(N-1)%P``: Slurm holds the cap.

Each trial keeps a job directory of its own, made as for any app (its ``job.sbatch`` is the trial's own
script with the app id ``<array id>_<task>``, :func:`array_task_script`); the array's script
(:func:`build_array_script`) is in ``<trial 0's job dir>-array/``, whose entries ``0``, ``1``, ... link to the
trials' directories, and task *i* runs trial *i*'s script there. So each trial is an ordinary app:
``describe``, logs, ``cancel`` (``scancel <job>_<i>``) and ``remove`` work on it as on any job. Arrays are
submitted from this machine (:class:`~.host.LocalHost`).
"""

from __future__ import annotations

import contextlib
import os
import shlex
from collections.abc import Sequence
from pathlib import Path

from tsm.errors import InvalidRunOptionError, SubmissionError
from tsm.schedulers.common.files import make_private_dirs, rmdir, unlink, write_private
from tsm.schedulers.slurm import secrets as slurm_secrets
from tsm.schedulers.slurm.host import LocalHost, prepare_job_dir
from tsm.schedulers.slurm.script import SlurmBatchRequest, directive, directive_safe

#: The line of :func:`build_script` that names the app; an array task's app id is ``<array job id>_<task id>``.
_APP_ID_LINE = 'export TSM_APP_ID="$SLURM_JOB_ID"'
_ARRAY_APP_ID_LINE = 'export TSM_APP_ID="${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"'
#: Directives each trial has its own of: the array script sets them once (the task's own run in its job dir).
_PER_TRIAL = frozenset({"--job-name", "--chdir", "--output"})


def array_task_script(script: str) -> str:
    """A trial's batch script (:func:`build_script`) as run by one task of a job array.

    Only the app id changes: ``<array job id>_<task id>``, which is the trial's app id, so the replicas'
    ``${app_id}``, ``TSM_APP_ID`` and the tracker's ``TSM_JOB_ID`` name the trial, not the array.
    (``$SLURM_JOB_ID`` is the task's own job id, which is what ``scancel``/``scontrol requeue`` in the script
    want.) The ``#SBATCH`` lines stay: run by ``bash`` they are comments.
    """
    if script.count(_APP_ID_LINE) != 1:
        raise ValueError("not a tsm Slurm batch script: its app id line is missing")
    return script.replace(_APP_ID_LINE, _ARRAY_APP_ID_LINE)


def _option_of(directive: str) -> str:
    """``--chdir`` of ``#SBATCH --chdir=/x`` (or of a quoted raw ``#SBATCH '--signal=USR1@60'``)."""
    return directive.removeprefix("#SBATCH ").lstrip("'\"").partition("=")[0]


def job_directives(script: str) -> list[str]:
    """The ``#SBATCH`` lines of a single-role :func:`build_script` script, in order."""
    out = []
    for line in script.splitlines()[1:]:
        if not line.startswith("#SBATCH "):
            break
        out.append(line)
    return out


def build_array_script(task_scripts: list[str], task_links: str, name: str, parallel: int) -> str:
    """The batch script of a job array running ``task_scripts`` (one trial each), at most ``parallel`` at once.

    ``--array=0-(N-1)%P``: Slurm starts task *i* when fewer than ``P`` run, so the cap holds without anything
    of tsm's alive. Every trial's sbatch directives but its name, directory and output must be the same (an
    array is one request); they are the array's. ``task_links`` is a directory holding ``0``, ``1``, ... each
    a link to that trial's job directory, which holds its script (:func:`array_task_script`); task *i* runs
    ``task_links/i/job.sbatch`` there, and Slurm writes its batch output to ``task_links/i/batch.out``, i.e.
    the trial's own ``batch.out``. Every path is quoted as in :func:`build_script`.
    """
    if not task_scripts:
        raise ValueError("a job array needs at least one task")
    shared = [d for d in job_directives(task_scripts[0]) if _option_of(d) not in _PER_TRIAL]
    for i, script in enumerate(task_scripts[1:], 1):
        if [d for d in job_directives(script) if _option_of(d) not in _PER_TRIAL] != shared:
            raise InvalidRunOptionError(
                f"trial {i} asks Slurm for other resources or options than trial 0: a job array is one request"
            )
    n = len(task_scripts)
    q = shlex.quote
    lines = [
        "#!/bin/bash",
        directive("--job-name", name),
        directive("--array", f"0-{n - 1}%{parallel}"),
        directive("--chdir", task_links),
        directive("--output", f"{task_links}/%a/batch.out"),
        *shared,
        "",
        f"# tsm sweep {name}: {n} trial(s), at most {parallel} at once; task i is the trial in {task_links}/i.",
        f"_tsm_tasks={q(task_links)}",
        'cd -- "$_tsm_tasks/$SLURM_ARRAY_TASK_ID" || exit 1',
        'exec bash ./job.sbatch',
    ]
    return "\n".join(lines) + "\n"


def submit_array(host: LocalHost, reqs: Sequence[SlurmBatchRequest], name: str, parallel: int,
                 secrets: Sequence[slurm_secrets.Delivery | None] | None = None) -> list[str]:
    """Submit the trials ``reqs`` as one job array, at most ``parallel`` at once; their app ids ``<job id>_<i>``.

    ``secrets``: each trial's values (:mod:`.secrets`), written into its own job directory.
    """
    deliveries = list(secrets or [None] * len(reqs))
    hidden = {v for d in deliveries if d is not None for v in d.hidden}
    first = Path(reqs[0].job_dir)
    links = first.parent / f"{first.name}-array"
    if "%" in str(links) or not directive_safe(str(links)):
        raise InvalidRunOptionError(f"job_dir {first} must not hold '%', backslashes or line breaks")
    made: list[SlurmBatchRequest] = []
    try:
        script = build_array_script([array_task_script(r.script) for r in reqs], str(links),
                                    f"{name}.{reqs[0].roles[0]}", parallel)  # fmt: skip
        make_private_dirs(links)
        for i, req in enumerate(reqs):
            prepare_job_dir(Path(req.job_dir), req.roles, req.app_json, array_task_script(req.script))
            made.append(req)
            delivery = deliveries[i]
            if delivery is not None:
                slurm_secrets.write_dir(Path(req.job_dir), delivery.values)
            os.symlink(req.job_dir, links / str(i))
        write_private(links / "job.sbatch", script)
        array_id = host.sbatch(reqs[0].sbatch_args, links / "job.sbatch", links, hidden)
    except BaseException as e:
        for req in made:  # nothing was submitted: leave no half-made job behind
            host.remove(req.job_dir, req.roles)
        for i in range(len(made)):
            unlink(links / str(i))
        unlink(links / "job.sbatch")
        rmdir(links)
        if isinstance(e, OSError):
            raise SubmissionError(f"cannot prepare the job array in {links}: {e.strerror or e}") from e
        raise
    ids = [f"{array_id}_{i}" for i in range(len(reqs))]
    with contextlib.suppress(OSError):
        write_private(links / "job_id", array_id + "\n")
    for app_id, req in zip(ids, reqs, strict=True):
        host.remember(app_id, app_id, req.job_dir)
        host.queries.submitted(app_id)
    return ids
