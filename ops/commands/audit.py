"""``logbroker audit --data-dir DIR [--topic T ...]``: check the exactly-once invariants.

Exit code 0 when everything holds, 1 when a problem was found, 2 on bad usage.
"""

from __future__ import annotations

import argparse
import sys

from log_store import LogbrokerError, open_store
from ops.audit import audit_store


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-dir", required=True, help="data dir of the embedded store")
    parser.add_argument("--topic", action="append", help="audit only this topic (repeatable)")


def run(args: argparse.Namespace) -> int:
    try:
        with open_store(args.data_dir, create=False) as store:
            report = audit_store(store, args.topic)
    except LogbrokerError as exc:
        print(f"logbroker audit: {exc}", file=sys.stderr)
        return 2
    print(
        f"{'topic':<32} {'part':>4} {'start':>10} {'end':>10} {'records':>10} {'sources':>8} "
        f"{'handovers':>9}"
    )
    for p in report.partitions:
        print(
            f"{p.topic:<32} {p.partition:>4} {p.start_offset:>10} {p.end_offset:>10} "
            f"{p.records:>10} {p.sources:>8} {p.handovers:>9}"
        )
    for text in report.problems:
        print(f"PROBLEM: {text}")
    print("audit: OK" if report.ok else f"audit: {len(report.problems)} problem(s)")
    return 0 if report.ok else 1
