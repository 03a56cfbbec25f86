"""``logbroker audit --data-dir DIR | --store kafka --kafka-bootstrap H:P [--topic T ...]``.

Checks the exactly-once invariants.

Exit code 0 when everything holds, 1 when a problem was found, 2 on bad usage.
"""

from __future__ import annotations

import argparse
import contextlib
import sys

from log_store import LogbrokerError
from ops.audit import audit_store
from ops.store_options import add_kafka_arguments, open_store_from_args


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-dir", help="data dir of the embedded store")
    add_kafka_arguments(parser)
    parser.add_argument("--topic", action="append", help="audit only this topic (repeatable)")


def run(args: argparse.Namespace) -> int:
    try:
        with contextlib.closing(open_store_from_args(args)) as store:
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
