"""``python -m tsm.schedulers.docker cleanup``: remove what ended tsm apps left in Docker.

tsm keeps an app's stopped containers and network after it ends by itself (so ``docker inspect`` and
``docker logs`` work) until ``tsm rm``; what nothing removed (a killed launcher, ``tsm run --detach``)
goes with this, by hand or from cron::

    python -m tsm.schedulers.docker cleanup                     # every ended app of yours, and orphan networks
    python -m tsm.schedulers.docker cleanup --dry-run           # only list them
    python -m tsm.schedulers.docker cleanup --include-running   # running apps too (cancelled)

Only the caller's apps are touched (the owner label). One line per app (``removed <app_id>``, or ``would
remove`` with ``--dry-run``); exit status 0, 1 when Docker cannot be reached or refuses, 2 on a usage error.

``python -m tsm.schedulers.docker stop --after S --grace G ID...`` is the helper the scheduler starts,
detached and isolated (:mod:`tsm.util.daemon`), for a stop it decided (a stall, a final failure, after the
warning lead): it waits until each container has ended or ``S`` seconds have passed (Docker's ``wait``: no
polling), then stops it (SIGTERM, SIGKILL ``G`` seconds later), so a ``tsm status`` never waits for it and
the stop happens after the CLI exits.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv``, run :meth:`DockerScheduler.cleanup`, print one line per app; the exit status."""
    parser = argparse.ArgumentParser(prog="python -m tsm.schedulers.docker",
                                     description="Maintenance of the docker scheduler's containers and networks.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("cleanup", help="remove the containers and networks of your ended tsm apps")
    p.add_argument("--include-running", "--all", action="store_true", dest="include_running",
                   help="cancel and remove running apps too")
    p.add_argument("--dry-run", action="store_true", help="only print what would be removed")
    p.add_argument("--session", default=None, help="only the apps of this tsm session")
    st = sub.add_parser("stop", help="stop containers once they ended or a lead passed (the scheduler's helper)")
    st.add_argument("--after", type=float, default=0.0, help="seconds to wait for each container to end first")
    st.add_argument("--grace", type=float, default=10.0, help="seconds between SIGTERM and SIGKILL")
    st.add_argument("ids", nargs="+", help="container ids")
    args = parser.parse_args(argv)
    if args.command == "stop":
        return stop(args.ids, args.after, args.grace)

    from tsm.errors import TsmError
    from tsm.schedulers.docker.scheduler import DockerScheduler

    sched = DockerScheduler("cleanup")
    try:
        done = sched.cleanup(include_running=args.include_running, session=args.session, dry_run=args.dry_run)
    except TsmError as e:
        sys.stderr.write(f"cleanup: {e}\n")
        return 1
    finally:
        sched.close()
    for problem in sched.cleanup_errors:
        sys.stderr.write(f"warning: {problem} (restarting dockerd clears such a network)\n")
    verb = "would remove" if args.dry_run else "removed"
    for app_id in done:
        sys.stdout.write(f"{verb} {app_id}\n")
    if not done:
        sys.stdout.write("nothing to remove\n")
    return 0


def stop(ids: Sequence[str], after: float, grace: float) -> int:
    """Stop each container of ``ids`` once it has ended or ``after`` seconds passed (one thread each);
    exit status 0, 1 when a stop failed (its reason on stderr)."""
    import threading

    from tsm.errors import TsmError
    from tsm.schedulers.docker.client import DockerClient

    client = DockerClient()
    failed: list[str] = []

    def one(cid: str) -> None:
        try:
            if after <= 0 or not client.wait_ended(cid, after):
                client.stop(cid, grace)
        except TsmError as e:
            failed.append(f"stop {cid[:12]}: {e}")

    threads = [threading.Thread(target=one, args=(cid,)) for cid in ids]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    client.close()
    for problem in failed:
        sys.stderr.write(problem + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
