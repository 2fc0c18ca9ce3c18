"""``python -m tsm.submitit.core._submit FOLDER``: :func:`~tsm.submitit.core.submission.submitit_main`."""

from tsm.submitit.core.submission import submitit_main

if __name__ == "__main__":
    submitit_main()
