"""``python -m tsm.schedulers.docker cleanup [--all]``: remove what ended tsm apps left in Docker."""

from __future__ import annotations

import sys

from tsm.errors import TsmError


def main(argv: list[str]) -> int:
    """Run the cleanup; ``--all`` also cancels apps still running. Exit 1 with one line on an error."""
    if not argv or argv[0] != "cleanup" or any(a not in ("--all",) for a in argv[1:]):
        print("usage: python -m tsm.schedulers.docker cleanup [--all]", file=sys.stderr)
        return 2
    from tsm.schedulers.docker.scheduler import DockerScheduler

    sched = DockerScheduler("cleanup")
    try:
        done = sched.cleanup(include_running="--all" in argv)
    except TsmError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    for problem in sched.cleanup_errors:
        print(f"warning: {problem} (restarting dockerd clears such a network)", file=sys.stderr)
    print(f"removed {len(done)} app(s): {' '.join(done)}" if done else "nothing to remove")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
