"""TorchX's ``torchx tracker list jobs [--parent-run-id ID] | metadata RUN_ID | artifacts [--artifact A] RUN_ID``.

The tracker is the first one configured (``[torchx:tracker]`` of ``.torchxconfig``, or ``$TORCHX_TRACKERS``),
built by tsm's tracker registry; none configured is TorchX's "No trackers configured." and exit 1.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from tsm.compat.torchx.cli.cmd_base import SubCommand

logger = logging.getLogger(__name__)


class CmdTracker(SubCommand):
    """``torchx tracker`` (TorchX calls it a prototype; the same subcommands here)."""

    @property
    def tracker(self) -> Any:
        from tsm.compat.torchx.cli._runner import get_configured_trackers
        from tsm.tracker.api import build_trackers

        trackers = list(build_trackers(get_configured_trackers()))
        if not trackers:
            logger.error("No trackers configured. See: https://pytorch.org/torchx/latest/runtime/tracking.html")
            sys.exit(1)
        logger.info("Using `%s` tracker to query data", trackers[0])
        return trackers[0]

    def add_arguments(self, subparser: argparse.ArgumentParser) -> None:
        subs = subparser.add_subparsers(description="Experimental tracker subcommands to query available tracked data.")
        listing = subs.add_parser("list", help="Use `list --help` to get supported args")
        kinds = listing.add_subparsers(description="Tracker list subcommands")
        jobs = kinds.add_parser("jobs")
        jobs.add_argument("--parent-run-id", type=str, help="Optional job parent run ID")
        jobs.set_defaults(func=self.list_jobs_command)
        metadata = kinds.add_parser("metadata")
        metadata.add_argument("RUN_ID", type=str, help="Job run ID")
        metadata.set_defaults(func=self.list_metadata_command)
        artifacts = kinds.add_parser("artifacts")
        artifacts.add_argument("--artifact", type=str, help="Limit to specific artifact")
        artifacts.add_argument("RUN_ID", type=str, help="Job run ID")
        artifacts.set_defaults(func=self.list_artifacts_command)

    def list_jobs_command(self, args: argparse.Namespace) -> None:
        from tsm.compat.torchx.cli._runner import tabulate

        kwargs = {"parent_run_id": args.parent_run_id} if args.parent_run_id else {}
        print(tabulate([[run_id] for run_id in self.tracker.run_ids(**kwargs)], headers=["JOB ID"]))

    def list_metadata_command(self, args: argparse.Namespace) -> None:
        from tsm.compat.torchx.cli._runner import tabulate

        print(tabulate([[k, v] for k, v in self.tracker.metadata(args.RUN_ID).items()], headers=["ID", "VALUE"]))

    def list_artifacts_command(self, args: argparse.Namespace) -> None:
        from tsm.compat.torchx.cli._runner import tabulate

        found = [a for a in self.tracker.artifacts(args.RUN_ID).values() if not args.artifact or a.name == args.artifact]
        print(tabulate([[a.name, a.path, a.metadata] for a in found], headers=["ARTIFACT", "PATH", "METADATA"]))

    def run(self, args: argparse.Namespace) -> None:
        """``torchx tracker`` alone: its subcommands set their own function."""
