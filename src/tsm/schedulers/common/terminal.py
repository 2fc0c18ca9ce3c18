"""A command under a terminal of its own, relayed to this process's stdin and stdout (``tsm exec -it``).

:func:`run_in_pty` starts ``argv`` on a new pseudo-terminal (its own session, the terminal its controlling
one, so a shell has job control and Ctrl-C reaches it through the terminal) and copies bytes both ways
until the command exits. When this process's stdin is a terminal it is put in raw mode for the while (and
restored however the relay ends), and the window size follows it. Standard library only.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
from collections.abc import Iterator, Mapping, Sequence


def exit_code(status: int) -> int:
    """A ``waitpid`` status as a shell reports it: the exit code, or 128 + N for a command killed by signal N."""
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def returncode(code: int) -> int:
    """``subprocess``'s return code as a shell reports it (a negative one, killed by signal N: 128 + N)."""
    return 128 - code if code < 0 else code


@contextlib.contextmanager
def raw_stdin(fd: int) -> Iterator[None]:
    """``fd`` in raw mode while the block runs, when it is a terminal; restored after, whatever happens."""
    if not os.isatty(fd):
        yield
        return
    import termios
    import tty

    saved = termios.tcgetattr(fd)
    try:
        tty.setraw(fd)
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSAFLUSH, saved)


def _copy_winsize(src: int, dst: int) -> None:
    import fcntl
    import termios

    with contextlib.suppress(OSError):
        fcntl.ioctl(dst, termios.TIOCSWINSZ, fcntl.ioctl(src, termios.TIOCGWINSZ, b"\0" * 8))


def run_in_pty(argv: Sequence[str], env: Mapping[str, str], cwd: str | None,
               stdin: int = 0, stdout: int = 1) -> int:
    """Run ``argv`` (verbatim; searched on the PATH of ``env``) under a new terminal in ``cwd``; its exit code.

    A command that cannot start exits 127 (not found) or 126 (not executable), with one line on its terminal.
    """
    import pty

    pid, master = pty.fork()
    if pid == 0:  # the child: its own session, the new terminal as stdin/stdout/stderr and controlling tty
        try:
            if cwd:
                os.chdir(cwd)
            os.execvpe(argv[0], list(argv), dict(env))
        except OSError as e:
            os.write(2, f"tsm exec: {argv[0]}: {e.strerror}\r\n".encode(errors="replace"))
            os._exit(127 if isinstance(e, FileNotFoundError) else 126)
    if os.isatty(stdin):
        _copy_winsize(stdin, master)
    old = signal.signal(signal.SIGWINCH, lambda *_: _copy_winsize(stdin, master)) if os.isatty(stdin) else None
    try:
        with raw_stdin(stdin):
            _relay(master, stdin, stdout)
    finally:
        if old is not None:
            signal.signal(signal.SIGWINCH, old)
        os.close(master)
    _, status = os.waitpid(pid, 0)
    return exit_code(status)


def _relay(master: int, stdin: int, stdout: int) -> None:
    """Copy ``stdin`` to the terminal and the terminal to ``stdout`` until the command closes it."""
    watch = [master, stdin]
    while True:
        try:
            ready, _, _ = select.select(watch, [], [])
        except InterruptedError:
            continue
        if master in ready:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: every process holding the terminal has ended
                return
            if not data:
                return
            os.write(stdout, data)
        if stdin in ready:
            data = os.read(stdin, 65536)
            if data:
                os.write(master, data)
            else:  # our input ended: the command sees end of file (^D), and the relay goes on for its output
                watch = [master]
                with contextlib.suppress(OSError):
                    os.write(master, b"\x04")
