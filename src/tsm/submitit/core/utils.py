"""submitit's ``core.utils``: job folder paths, the delayed call, the command wrapper, the job errors.

A job's files in its folder keep submitit's names (``%j`` is the job id, ``%t`` the task, ``%A``/``%a`` an
array's id and index)::

    <folder>/%j_submitted.pkl     the submitted call (a DelayedSubmission), written at submission
    <folder>/%j_%t_result.pkl     ("success", value) or ("error", traceback text), once the task ended
    <folder>/%j_%t_log.out|err    the task's output (submitit's own executors; tsm's keep logs where the
                                  scheduler keeps them, and ``job.stdout()`` reads them there)
"""

from __future__ import annotations

import contextlib
import io
import itertools
import os
import pickle
import shutil
import subprocess
import sys
import tarfile
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any

from tsm.functions.checkpoint import Call


@contextlib.contextmanager
def environment_variables(**kwargs: Any) -> Iterator[None]:
    """Set environment variables for the duration of the block, then restore what was there."""
    saved = {k: os.environ[k] for k in kwargs if k in os.environ}
    os.environ.update({k: str(v) for k, v in kwargs.items()})
    try:
        yield
    finally:
        for k in kwargs:
            os.environ.pop(k, None)
        os.environ.update(saved)


class UncompletedJobError(RuntimeError):
    """The job did not complete: it is not finished, or it ended without a result."""


class FailedJobError(UncompletedJobError):
    """The job's function raised; the message holds its traceback."""


class FailedSubmissionError(RuntimeError):
    """The submission did not go through."""


class JobPaths:
    """The paths of a job's files in its folder (see the module doc)."""

    def __init__(self, folder: Path | str, job_id: str | None = None, task_id: int | None = None) -> None:
        self._folder = Path(folder).expanduser().absolute()
        self.job_id = job_id
        self.task_id = task_id or 0

    @property
    def folder(self) -> Path:
        return self._format_id(self._folder)

    @property
    def submission_file(self) -> Path:
        pattern = "%A_submission.sh" if self.job_id and "_" in self.job_id else "%j_submission.sh"
        return self._format_id(self.folder / pattern)

    @property
    def submitted_pickle(self) -> Path:
        return self._format_id(self.folder / "%j_submitted.pkl")

    @property
    def result_pickle(self) -> Path:
        return self._format_id(self.folder / "%j_%t_result.pkl")

    @property
    def stderr(self) -> Path:
        return self._format_id(self.folder / "%j_%t_log.err")

    @property
    def stdout(self) -> Path:
        return self._format_id(self.folder / "%j_%t_log.out")

    def _format_id(self, path: Path | str) -> Path:
        if self.job_id is None:
            return Path(path)
        text = str(path).replace("%j", str(self.job_id)).replace("%t", str(self.task_id))
        array_id, _, index = str(self.job_id).partition("_")
        if "%a" in text:
            if not index:
                raise ValueError("%a is in the folder path but this is not a job array")
            text = text.replace("%a", index)
        return Path(text.replace("%A", array_id))

    def move_temporary_file(self, tmp_path: Path | str, name: str, keep_as_symlink: bool = False) -> None:
        """Move ``tmp_path`` to the path named ``name`` (``submitted_pickle``, ...), leaving a link if asked."""
        self.folder.mkdir(parents=True, exist_ok=True)
        target: Path = getattr(self, name)
        Path(tmp_path).rename(target)
        if keep_as_symlink:
            Path(tmp_path).symlink_to(target)

    @staticmethod
    def get_first_id_independent_folder(folder: Path | str) -> Path:
        """The deepest folder of ``folder`` above the first part that holds an id tag."""
        parts = Path(folder).expanduser().absolute().parts
        kept = itertools.takewhile(lambda p: not any(tag in p for tag in ("%j", "%t", "%A", "%a")), parts)
        return Path(*kept)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.folder})"


class DelayedSubmission(Call):
    """``function(*args, **kwargs)`` to run later, with its result once run (a :class:`tsm.functions.Call`)."""

    def __init__(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        super().__init__(function, *args, **kwargs)
        self._result: Any = None
        self._done = False
        self._timeout_min: float = 0
        self._timeout_countdown: int = 0

    def result(self) -> Any:
        """Run the call once and keep its result."""
        if not self._done:
            self._result = self.function(*self.args, **self.kwargs)
            self._done = True
        return self._result

    def __call__(self) -> Any:
        return self.result()

    def done(self) -> bool:
        return self._done

    def dump(self, filepath: str | Path) -> None:
        cloudpickle_dump(self, filepath)

    def set_timeout(self, timeout_min: float, max_num_timeout: int) -> None:
        self._timeout_min = timeout_min
        self._timeout_countdown = max_num_timeout

    @classmethod
    def load(cls, filepath: str | Path) -> DelayedSubmission:
        obj = pickle_load(filepath)
        # by class name, as submitit checks: a copy of this class in a project loads too
        if type(obj).__name__ != cls.__name__:
            raise TypeError(f"loaded a {type(obj)}, not a {cls.__name__}")
        return obj  # type: ignore[no-any-return]

    def _checkpoint_function(self) -> DelayedSubmission | None:
        """What the callable's checkpoint hook (:func:`checkpoint_hook`) says the next attempt runs."""
        hook = checkpoint_hook(self.function)
        if hook is None:
            return None
        out: DelayedSubmission | None = hook(*self.args, **self.kwargs)
        return out


def checkpoint_hook(function: Any) -> Callable[..., Any] | None:
    """The callable's checkpoint method by submitit's documented rule: ``__submitit_checkpoint__``, else
    ``checkpoint`` (any callable that has one is checkpointable, with or without ``helpers.Checkpointable``)."""
    hook = getattr(function, "__submitit_checkpoint__", None) or getattr(function, "checkpoint", None)
    return hook if callable(hook) else None


@contextlib.contextmanager
def temporary_save_path(filepath: Path | str) -> Iterator[Path]:
    """A path to write ``filepath``'s new content to (``<name>.save_tmp``), moved into place at the end."""
    filepath = Path(filepath)
    tmp = filepath.with_suffix(filepath.suffix + ".save_tmp")
    if tmp.exists():
        raise FileExistsError(f"a temporary file is already there: {tmp}")
    yield tmp
    if not tmp.exists():
        raise FileNotFoundError(f"nothing was saved at the temporary path {tmp}")
    os.replace(tmp, filepath)


def archive_dev_folders(folders: Sequence[str | Path], outfile: str | Path | None = None) -> Path:
    """A ``.tar.gz`` of ``folders`` (each under its own name)."""
    if not isinstance(folders, (list, tuple)):
        raise TypeError("give the folders as a list or a tuple")
    out = Path(outfile if outfile is not None else "_dev_folders_.tar.gz")
    if not str(out).endswith(".tar.gz"):
        raise ValueError(f"the archive must end in .tar.gz: {out}")
    with tarfile.open(out, mode="w:gz") as tar:
        for folder in folders:
            tar.add(str(folder), arcname=Path(folder).name)
    return out


def copy_par_file(par_file: str | Path, folder: str | Path) -> Path:
    """Copy a ``.par``/``.xar`` file into ``folder``; the copy's path."""
    src, dst = Path(par_file).expanduser().absolute(), Path(folder).expanduser().absolute()
    dst.mkdir(parents=True, exist_ok=True)
    shutil.copy2(src, dst / src.name)
    return dst / src.name


def pickle_load(filename: str | Path) -> Any:
    with open(filename, "rb") as f:
        return pickle.load(f)  # noqa: S301 - the job's own files


def cloudpickle_dump(obj: Any, filename: str | Path) -> None:
    from tsm.functions.payload import cloudpickle

    with open(filename, "wb") as f:
        cloudpickle().dump(obj, f, pickle.HIGHEST_PROTOCOL)


def _pump(src: io.BufferedReader, sink: list[bytes], echo: IO[str] | None) -> None:
    for chunk in iter(lambda: src.read1(65536), b""):
        sink.append(chunk)
        if echo is not None:
            echo.write(chunk.decode("utf-8", "replace"))
            echo.flush()


class CommandFunction:
    """A command as a function: calling it runs the command (plus ``*args`` and ``--key=value`` for each
    keyword) and returns its standard output, stripped; a non-zero exit raises :class:`FailedJobError`
    with its standard error. Both pipes are read as the command writes, so a chatty command never blocks.
    """

    def __init__(self, command: list[str], verbose: bool = True, cwd: str | Path | None = None,
                 env: dict[str, str] | None = None) -> None:
        if not isinstance(command, list):
            raise TypeError("give the command as a list of words (no shell reads it)")
        self.command = command
        self.verbose = verbose
        self.cwd = None if cwd is None else str(cwd)
        self.env = env

    def __call__(self, *args: Any, **kwargs: Any) -> str:
        full = [*self.command, *(str(a) for a in args), *(f"--{k}={v}" for k, v in kwargs.items())]
        if self.verbose:
            print(f"running: {' '.join(full)}")
        with subprocess.Popen(full, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=self.cwd,
                              env=self.env) as proc:
            out: list[bytes] = []
            err: list[bytes] = []
            assert isinstance(proc.stdout, io.BufferedReader) and isinstance(proc.stderr, io.BufferedReader)
            pumps = [threading.Thread(target=_pump, args=(proc.stdout, out, sys.stdout if self.verbose else None)),
                     threading.Thread(target=_pump, args=(proc.stderr, err, sys.stderr if self.verbose else None))]
            for t in pumps:
                t.start()
            for t in pumps:
                t.join()
            code = proc.wait()
        stdout = b"".join(out).decode("utf-8", "replace").strip()
        stderr = b"".join(err).decode("utf-8", "replace").strip()
        if code:
            if stderr and not self.verbose:
                print(stderr, file=sys.stderr)
            raise FailedJobError(stderr) from subprocess.CalledProcessError(code, full, output=stdout, stderr=stderr)
        return stdout
