"""submitit's ``core.submission``: what a job of an executor written for submitit runs on its folder.

``python -m tsm.submitit.core._submit FOLDER`` (the command such executors submit) loads the submitted call
from the folder, installs the :class:`~tsm.submitit.core.job_environment.SignalHandler`, runs it and writes
``("success", result)`` or ``("error", traceback)`` as the task's result file. tsm's own executors do not
use it: their jobs run :mod:`tsm.functions.worker`.
"""

from __future__ import annotations

import argparse
import os
import time
import traceback
from pathlib import Path

from tsm.submitit.core import job_environment, utils
from tsm.submitit.core.logger import get_logger

#: seconds to wait for the submitted pickle to appear (a shared file system may show it late)
WAIT_S = 60


def process_job(folder: Path | str) -> None:
    """Run the job of this environment from ``folder`` and write its result file (see the module doc)."""
    os.environ["SUBMITIT_FOLDER"] = str(folder)
    env = job_environment.JobEnvironment()
    paths = env.paths
    log = get_logger()
    log.info(f"job of {env}, call from {paths.submitted_pickle}")
    for _ in range(WAIT_S):
        if paths.submitted_pickle.exists():
            break
        time.sleep(1)
    if not paths.submitted_pickle.exists():
        raise RuntimeError(f"no submitted call at {paths.submitted_pickle} after {WAIT_S} s: is the folder shared "
                           "with this node?")
    try:
        delayed = utils.DelayedSubmission.load(paths.submitted_pickle)
        job_environment.JobEnvironment()._handle_signals(paths, delayed)
        result = delayed.result()
        with utils.temporary_save_path(paths.result_pickle) as tmp:
            utils.cloudpickle_dump(("success", result), tmp)
        log.info("the call returned: result written")
    except Exception as error:
        try:
            with utils.temporary_save_path(paths.result_pickle) as tmp:
                utils.cloudpickle_dump(("error", traceback.format_exc()), tmp)
        except Exception as dump_error:  # noqa: BLE001 - the job's own error is what is raised
            log.error(f"the call raised {error!r}, and writing that failed too: {dump_error!r}")
        log.error("the call raised")
        raise


def submitit_main() -> None:
    parser = argparse.ArgumentParser(description="Run a job")
    parser.add_argument("folder", type=str, help="Folder where the jobs are stored (in subfolder)")
    process_job(parser.parse_args().folder)
