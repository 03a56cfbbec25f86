"""``logbroker audit``: the exactly-once invariants of a store, or the tiers per window.

``logbroker audit --data-dir DIR | --store kafka --kafka-bootstrap H:P [--topic T ...]``
checks the exactly-once invariants (see ``ops/audit.py``) and, on the embedded store, every
batch's checksum, batches that carry only state included: exit 1 when a problem was found.

``logbroker audit --windows (--data-dir DIR | --store kafka ... | --server URL) [--db FILE]
[--topic GLOB] [--since UNIX_S] [--grace SECONDS] [--metrics-file FILE]`` reconciles the
tiers' counts per 10-minute window (see ``docs/audit.md``), upserts them into the SQLite
database ``--db`` and prints them: exit 1 when a closed window is still incomplete
``--grace`` seconds after its end.  ``--metrics-file`` also writes
``logbroker_audit_window_incomplete`` per topic there, for node_exporter's textfile collector
(the alert ``LogbrokerAuditIncomplete``).

Bad usage, and a token the gateway refuses (401, 403), or a token file that cannot be used: a
message and exit code 2.  So is finding nothing to audit where an embedded store would have
refused (a Kafka namespace without a logbroker topic; ``--windows`` finding no window): a
misspelt namespace or glob must not read as "OK" to a cron job or the alert.
A gateway that fails (500): exit code 1.  ``--server URL[,URL...]``: a gateway that cannot be
reached or answers 502, 503 or 504 is waited out (the next one asked, ``Retry-After``
honoured) for ``--gateway-retry`` seconds (30), see ``ops/gateway_client.py``; exit code 4 if
none answered by then.
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import sqlite3
import sys
import time
from pathlib import Path

import httpx

from audit.ledger import AuditLedger
from audit.reconcile import WindowRow, reconcile, row_from_json
from audit.windows import WINDOW_S
from log_store import LogbrokerError, LogStore, open_store
from log_store.interface import BatchCheck
from ops.audit import AuditReport, audit_store
from ops.audit_windows import (
    DEFAULT_GRACE_S,
    check_db,
    format_table,
    metrics_text,
    other_clients_notes,
    overdue,
    save_rows,
    write_metrics_file,
)
from ops.commands.arg_types import seconds
from ops.gateway_client import (
    EXIT_UNAVAILABLE,
    SERVERS_HELP,
    GatewayClient,
    GatewayStillUnavailable,
    add_gateway_retry,
)
from ops.store_options import add_kafka_arguments, open_store_from_args, store_kind
from ops.token_options import add_token_options, token_from


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--data-dir",
        action="append",
        help="data dir of the embedded store (with --windows repeatable: one per DC)",
    )
    add_kafka_arguments(parser)
    parser.add_argument(
        "--topic",
        action="append",
        help="audit only this topic (repeatable); with --windows one glob",
    )
    parser.add_argument(
        "--windows", action="store_true", help="reconcile the tiers' counts per window"
    )
    parser.add_argument(
        "--server",
        metavar="URL[,URL...]",
        help="with --windows: ask this gateway instead of a store" + SERVERS_HELP,
    )
    add_gateway_retry(parser)
    parser.add_argument(
        "--db", type=Path, default=Path("logbroker-audit.db"), help="with --windows: results"
    )
    parser.add_argument(
        "--since", type=int, default=0, metavar="UNIX_S", help="with --windows: from this time"
    )
    parser.add_argument(
        "--grace",
        type=seconds,
        default=DEFAULT_GRACE_S,
        metavar="SECONDS",
        help="with --windows: how long after its end a window may be incomplete",
    )
    parser.add_argument(
        "--metrics-file",
        type=Path,
        metavar="FILE",
        help="with --windows: also write the verdict as Prometheus text (textfile collector)",
    )
    add_token_options(parser)


class _GatewayFailed(LogbrokerError):
    """The gateway answered 5xx: not the command's fault; running it again later may do."""


def _usage(message: str) -> int:
    print(f"logbroker audit: {message}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    if args.windows:
        return _run_windows(args)
    if args.server:
        return _usage("--server is for --windows; the invariant audit reads a store")
    if args.metrics_file is not None:
        return _usage("--metrics-file is for --windows")
    if args.data_dir and len(args.data_dir) > 1:
        return _usage("the invariant audit reads one --data-dir")
    args.data_dir = args.data_dir[0] if args.data_dir else None
    try:
        # read-only: the audit only reads, also a store on a read-only file system
        with contextlib.closing(open_store_from_args(args, read_only=True)) as store:
            report = audit_store(store, args.topic)
            if not report.partitions and store_kind(args) == "kafka":
                # an embedded store says so at opening; a misspelt namespace is only empty
                raise LogbrokerError(
                    f"the Kafka namespace {args.kafka_namespace!r} at {args.kafka_bootstrap} "
                    "holds no logbroker topic (give the gateways' --kafka-namespace)"
                )
            _check_batches(store, report)
    except LogbrokerError as exc:
        print(f"logbroker audit: {exc}", file=sys.stderr)
        return 2
    print(
        f"{'topic':<32} {'part':>4} {'start':>10} {'end':>10} {'records':>10} {'sources':>8} "
        f"{'handovers':>9}"
    )
    for p in report.partitions:
        mirrored = "  (damaged)" if p.damaged else "  (mirrored copy)" if p.mirrored else ""
        print(
            f"{p.topic:<32} {p.partition:>4} {p.start_offset:>10} {p.end_offset:>10} "
            f"{p.records:>10} {p.sources:>8} {p.handovers:>9}{mirrored}"
        )
    for text in report.problems:
        print(f"PROBLEM: {text}")
    print("audit: OK" if report.ok else f"audit: {len(report.problems)} problem(s)")
    return 0 if report.ok else 1


def _check_batches(store: LogStore, report: AuditReport, max_problems: int = 100) -> None:
    """Add the problems of every audited partition's batches, checked one by one against
    their checksums: reads see only the batches that hold records."""
    if not isinstance(store, BatchCheck):
        return
    for p in report.partitions:
        if len(report.problems) >= max_problems:
            return
        if p.damaged:
            continue  # named already
        try:
            found = store.check_batches(p.topic, p.partition)
        except LogbrokerError as exc:
            found = [f"unreadable: {exc}"]
        report.problems += [f"{p.topic}/{p.partition}: {text}" for text in found]
    del report.problems[max_problems:]


def _run_windows(args: argparse.Namespace) -> int:
    if args.topic and len(args.topic) > 1:
        return _usage("--windows takes one --topic glob")
    if args.since < 0:
        return _usage("--since must not be negative")
    if args.server and (args.data_dir or store_kind(args) == "kafka"):
        return _usage("give --server or a store (--data-dir, --store kafka), not both")
    if not args.server and not args.data_dir and store_kind(args) != "kafka":
        return _usage("--windows needs --server URL, --data-dir DIR or --store kafka")
    try:
        check_db(args.db)
    except LogbrokerError as exc:
        return _usage(str(exc))
    if args.metrics_file is not None and not args.metrics_file.parent.is_dir():
        return _usage(
            f"--metrics-file {args.metrics_file}: no directory {args.metrics_file.parent}"
        )
    glob = args.topic[0] if args.topic else "*"
    try:
        if args.server:
            rows = _rows_from_server(args, glob)
            nothing = (
                f"{args.server} has no audit window of a topic matching {glob!r}"
                + (f" since {args.since}" if args.since else "")
                + " (tiers publish their counts every 10 s)"
            )
        else:
            ledger = _ledger_of_stores(args)
            rows = reconcile(ledger, topic_glob=glob, since=args.since)
            nothing = _nothing_found(ledger, args, glob)
    except GatewayStillUnavailable as exc:
        print(f"logbroker audit: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    except _GatewayFailed as exc:
        print(f"logbroker audit: {exc}", file=sys.stderr)
        return 1
    except LogbrokerError as exc:
        return _usage(str(exc))
    except httpx.HTTPError as exc:
        print(f"logbroker audit: {args.server}: {exc}", file=sys.stderr)
        return 1
    if not rows:
        # A cron job or the alert's metrics file watching a misspelt namespace, data dir or
        # glob would otherwise stay green for ever: nothing found is not "all complete".
        return _usage(nothing)
    now = time.time()
    try:
        save_rows(args.db, rows, now)
    except (sqlite3.Error, OSError) as exc:
        print(f"logbroker audit: cannot save the results in {args.db}: {exc}", file=sys.stderr)
        return 1
    print(format_table(rows))
    for note in other_clients_notes(rows):
        print(note)
    late = overdue(rows, args.grace, now)
    if args.metrics_file is not None:
        write_metrics_file(args.metrics_file, metrics_text(rows, late, now))
    for row in late:
        missing = ", ".join(
            f"{t.tier} lost {t.lost_lines} dup {t.duplicated_lines}"
            for t in row.tiers
            if t.lines != row.source_lines
        )
        print(f"INCOMPLETE: {row.topic} window {row.window_start}: {missing}")
    complete = sum(r.complete for r in rows)
    print(f"audit: {complete} of {len(rows)} window(s) complete; results in {args.db}")
    return 1 if late else 0


def _ledger_of_stores(args: argparse.Namespace) -> AuditLedger:
    """Every store's audit topics in one ledger: a record read in two DCs (the source's, and
    its mirrored copy) is the same key, so it counts once."""
    ledger = AuditLedger()
    if store_kind(args) == "kafka":
        with contextlib.closing(open_store_from_args(args)) as store:
            ledger.refresh(store)
    for data_dir in args.data_dir or []:
        # read-only: a running gateway's store is read, never recovered or changed
        with contextlib.closing(open_store(data_dir, read_only=True)) as sqlite_store:
            ledger.refresh(sqlite_store)
    return ledger


def _nothing_found(ledger: AuditLedger, args: argparse.Namespace, glob: str) -> str:
    """What the stores hold instead of a window to reconcile, in one line."""
    where = " and ".join(
        ([f"Kafka namespace {args.kafka_namespace!r}"] if store_kind(args) == "kafka" else [])
        + list(args.data_dir or [])
    )
    counted = sorted({topic for topic, _ in ledger.series})
    if not counted:
        return (
            f"no audit records in {where}: no tier has published counts there yet (tiers "
            "publish every 10 s what they counted)"
        )
    matching = [t for t in counted if fnmatch.fnmatchcase(t, glob)]
    if not matching:
        shown = ", ".join(counted[:10]) + (" ..." if len(counted) > 10 else "")
        return f"no audited topic in {where} matches {glob!r} (audited: {shown})"
    latest = max(w for t, w in ledger.series if t in matching)
    if args.since and latest + WINDOW_S <= args.since:
        return f"no window of {glob!r} in {where} since {args.since} (the last starts at {latest})"
    return (
        f"the windows of {glob!r} in {where} were counted only by tiers of other DCs: give the "
        "store of the topics' own DC too"
    )


def _rows_from_server(args: argparse.Namespace, glob: str) -> list[WindowRow]:
    with GatewayClient(
        args.server, command="audit", token=token_from(args), retry_s=args.gateway_retry
    ) as http:
        response = http.request(
            "GET", "/v1/audit/windows", params={"topic": glob, "since": args.since}
        )
    if response.status_code >= 400:
        try:
            reason = f"{response.json()['error']}: {response.json()['reason']}"
        except (ValueError, KeyError, TypeError):
            reason = response.text[:300]
        text = f"{args.server} answered {response.status_code} {reason}"
        # 4xx: the command line or its token is wrong (exit 2); 5xx: try again later (exit 1)
        raise (_GatewayFailed if response.status_code >= 500 else LogbrokerError)(text)
    return [row_from_json(doc) for doc in response.json()["windows"]]
