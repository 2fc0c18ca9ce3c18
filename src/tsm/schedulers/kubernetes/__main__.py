"""``python -m tsm.schedulers.kubernetes cleanup``: delete what ended tsm apps left on a cluster.

tsm deletes an app's objects as soon as it sees the app end, so this is for what nothing saw end (a
launcher killed mid-run, ``tsm run --detach`` never looked at again, apps launched from another machine).
Run it by hand, or from cron (or a Kubernetes CronJob with the ``kubernetes`` extra installed) to delete
finished apps after a chosen time::

    python -m tsm.schedulers.kubernetes cleanup --older-than 3600          # ended over an hour ago
    python -m tsm.schedulers.kubernetes cleanup --dry-run -n ml            # only list them, namespace ml
    python -m tsm.schedulers.kubernetes cleanup --include-running          # everything tsm made (cancels)

One line per app (``deleted <app_id>``, or ``would delete`` with ``--dry-run``); exit status 0, 1 when the
cluster cannot be reached or refuses, 2 on a usage error. An app launched from this machine keeps its logs
and final status in ``$TSM_HOME`` (``tsm logs``/``describe`` keep working; ``tsm rm`` forgets it).
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give a number of seconds >= 0")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv``, run :meth:`KubernetesScheduler.cleanup`, print one line per app; the exit status."""
    parser = argparse.ArgumentParser(prog="python -m tsm.schedulers.kubernetes",
                                     description="Maintenance of the kubernetes scheduler's cluster objects.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("cleanup", help="delete the objects of ended tsm apps left on the cluster")
    p.add_argument("--older-than", type=_seconds, default=0.0, metavar="SECONDS",
                   help="only apps that ended more than SECONDS ago (default 0: every ended app)")
    p.add_argument("--include-running", action="store_true", help="cancel and delete running apps too")
    p.add_argument("--dry-run", action="store_true", help="only print what would be deleted")
    p.add_argument("-n", "--namespace", default="default", help="namespace (default: default)")
    p.add_argument("--kubeconfig", default=None, help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config)")
    p.add_argument("--context", default=None, help="kubeconfig context (default: its current-context)")
    p.add_argument("--session", default="cleanup", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    from tsm.errors import TsmError
    from tsm.schedulers.kubernetes.scheduler import KubernetesScheduler

    sched = KubernetesScheduler(args.session, namespace=args.namespace, kubeconfig=args.kubeconfig,
                                context=args.context)
    try:
        done = sched.cleanup(include_running=args.include_running, older_than=args.older_than,
                             dry_run=args.dry_run)
    except TsmError as e:
        sys.stderr.write(f"cleanup: {e}\n")
        return 1
    finally:
        sched.close()
    verb = "would delete" if args.dry_run else "deleted"
    for app_id in done:
        sys.stdout.write(f"{verb} {app_id}\n")
    if not done:
        sys.stdout.write("nothing to delete\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
