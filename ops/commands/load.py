"""``logbroker load``: load topics into a Delta Lake table (or Parquet tables) with Spark,
exactly once.

Progress goes to stderr while it runs; the summary (or ``--format json``) to stdout, and with
``--report FILE`` the JSON report (with the exit code) to a file replaced at once at the end:
``spark-submit`` merges the driver's stderr into its stdout, so on a cluster only the file
separates the report from the progress.
SIGTERM lets the batch in hand commit and then stops (the next run continues).  Exit
codes: 0 loaded (or nothing new), 2 bad usage (among it ``--topics`` matching no topic of the
log, a Kafka cluster no broker of which answers within 5 s, a table path inside a Delta
table, gateways of two installations in ``--server``, met by the driver or a task, or in
``--audit-server``, met at the start or, with ``--audit-only``, by the publication), 3 loaded
but some offsets were lost to retention before they could be loaded, left out by
``--skip-corrupt``, or of a topic deleted before they were loaded (named on stderr), 1 any
other failure (a message that does not decompress or a record that is no envelope,
without ``--skip-corrupt``; a topic held back because its log type's schema cannot become a
column, the other topics loaded).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import os
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from log_store.errors import BadRequest, LogbrokerError, StoreUnavailable
from ops import stop_signals
from ops.commands.arg_types import seconds
from ops.token_options import add_token_options, token_from
from yt_loader.load_report import report_document, write_report

if TYPE_CHECKING:
    from ops.audit_loader import Counts
    from yt_loader.load_job import LoadReport
    from yt_loader.log_source import SourceSpec

EXIT_FAILED = 1
EXIT_DATA_LOST = 3
LOG_LEVEL_ENV = "LOGBROKER_SPARK_LOG_LEVEL"
DEFAULT_GATEWAY_RETRY_S = 120.0
"""As ``yt_loader.log_source.DEFAULT_GATEWAY_RETRY_S`` (not imported: pyspark may be absent)."""


HANDLES_STOP_SIGNALS = True


def add_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--server",
        metavar="URL[,URL...]",
        help="gateway URLs of one installation to read through, e.g. http://gw1:8080,"
        "http://gw2:8080 (the next is asked when one is unreachable or busy)",
    )
    source.add_argument(
        "--data-dir", help="embedded store directory to read directly (local or shared disk)"
    )
    source.add_argument(
        "--kafka-bootstrap",
        metavar="HOST:PORT",
        help="a Kafka-backed log's Kafka servers, read directly (read_committed) by every task",
    )
    parser.add_argument(
        "--store",
        choices=("sqlite", "kafka"),
        help="optional, as in audit and topics: kafka goes with --kafka-bootstrap",
    )
    parser.add_argument("--kafka-namespace", default="", help="the gateways' kafka_namespace")
    parser.add_argument(
        "--kafka-property",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a librdkafka property (TLS, SASL) for every task's Kafka clients, repeatable",
    )
    parser.add_argument(
        "--gateway-retry",
        type=seconds,
        default=DEFAULT_GATEWAY_RETRY_S,
        metavar="SECONDS",
        help="with --server: how long a read is tried again while every gateway is "
        "unreachable or answers 502, 503, 504 or 429, before the run fails "
        f"(default {DEFAULT_GATEWAY_RETRY_S:g}; 0 fails at once)",
    )
    parser.add_argument(
        "--warehouse",
        required=True,
        help="the table: a Delta table's path (created if absent), or with "
        "--table-format parquet the Parquet warehouse directory",
    )
    parser.add_argument(
        "--table-format",
        choices=("delta", "parquet"),
        default="delta",
        help="delta (default): one Delta Lake table partitioned by topic, date, hour; "
        "parquet: Hive-style Parquet directories with logbroker's own commit log",
    )
    parser.add_argument(
        "--topics", default="*", help="comma-separated topic globs (default: every topic)"
    )
    parser.add_argument(
        "--master",
        help="Spark master (default: local[*], or the one spark-submit was given)",
    )
    add_token_options(parser)
    parser.add_argument(
        "--max-range-mb", type=float, default=64.0, help="log data per Spark task (default 64)"
    )
    parser.add_argument(
        "--max-batch-mb",
        type=float,
        default=512.0,
        help="log data per committed batch (default 512)",
    )
    parser.add_argument(
        "--skip-corrupt",
        action="store_true",
        help="leave out a message that does not decompress, naming it as lost (exit 3), "
        "rather than stop the load at it",
    )
    parser.add_argument("--format", choices=("text", "json"), default="text")
    parser.add_argument(
        "--report",
        metavar="FILE",
        help="also write the JSON report, with the exit code, to FILE (replaced at once when "
        "the run ends, removed when it starts): under spark-submit, which merges stderr into "
        "stdout, the one way to read the report apart from the progress",
    )
    parser.add_argument(
        "--spark-log-level",
        metavar="LEVEL",
        default=os.environ.get(LOG_LEVEL_ENV),
        help=f"Spark's own log level on stderr: WARN unless {LOG_LEVEL_ENV} or a "
        "spark-submit --conf spark.log.level says otherwise (INFO, DEBUG, ERROR, ...)",
    )
    parser.add_argument(
        "--audit-server",
        metavar="URL[,URL...]",
        help="with --data-dir or --kafka-bootstrap: the gateway to publish the table's audit "
        "counts to, or several of one installation, the next asked when one fails (with "
        "--server they go to that gateway)",
    )
    audit = parser.add_mutually_exclusive_group()
    audit.add_argument(
        "--no-audit", action="store_true", help="do not publish the table's audit counts"
    )
    audit.add_argument(
        "--audit-only",
        action="store_true",
        help="load nothing: recount the table and publish its audit counts (docs/audit.md)",
    )


def _kafka_properties(args: argparse.Namespace) -> tuple[tuple[str, str], ...]:
    if (args.store == "kafka") != (args.kafka_bootstrap is not None) and args.store is not None:
        raise BadRequest("--store kafka goes with --kafka-bootstrap HOST:PORT (and only with it)")
    if args.kafka_bootstrap is None and (args.kafka_namespace or args.kafka_property):
        raise BadRequest("--kafka-namespace and --kafka-property go with --kafka-bootstrap")
    properties = []
    for item in args.kafka_property:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise BadRequest(f"--kafka-property {item!r} is not KEY=VALUE")
        properties.append((key, value))
    return tuple(properties)


_AUDIT_WHY = "counts published to one of them would go to another installation's audit"


def _check_audit_flags(args: argparse.Namespace) -> None:
    if args.server is None and args.audit_server is None and (args.token or args.token_file):
        raise BadRequest(
            "--token and --token-file go with --server or --audit-server (a gateway to send "
            "them to); reading a data dir or Kafka needs none"
        )
    if args.audit_server is None:
        return
    if args.server is not None:
        raise BadRequest(
            "--audit-server goes with --data-dir or --kafka-bootstrap: with --server the "
            "counts are published to that gateway"
        )
    if args.no_audit:
        raise BadRequest("--audit-server and --no-audit contradict each other")
    if not args.audit_server.startswith(("http://", "https://")):
        raise BadRequest(
            f"--audit-server must be an http:// or https:// URL: {args.audit_server!r}"
        )


def _progress(line: str) -> None:
    print(f"logbroker load: {line}", file=sys.stderr, flush=True)


def _log_as_progress() -> None:
    """The loader's warnings (a gateway asked again) on stderr as progress lines."""
    logger = logging.getLogger("logbroker.load")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("logbroker load: %(message)s"))
        logger.addHandler(handler)
        logger.propagate = False


def _spark_install_hint() -> str:
    """How to install the ``spark`` extra: from the checkout, since logbroker is not on PyPI
    (``pip install 'logbroker[spark]'`` would install whatever another party publishes)."""
    checkout = Path(__file__).resolve().parents[2]
    if not (checkout / "pyproject.toml").is_file():
        return (
            "install the 'spark' extra from a logbroker checkout: "
            f"{sys.executable} -m pip install -e 'CHECKOUT[spark]'"
        )
    if Path(sys.prefix).resolve() == (checkout / ".venv").resolve():
        # bootstrap.sh installs into the checkout's .venv, Java too if it is missing
        return (
            f"install the 'spark' extra from the checkout: "
            f"LOGBROKER_EXTRAS=spark {checkout}/scripts/bootstrap.sh"
        )
    return (
        f"install the 'spark' extra from the checkout: "
        f"{sys.executable} -m pip install -e '{checkout}[spark]'"
    )


@dataclass
class _Outcome:
    """What a run ends with, for ``--report``: the load's report if it ran, else why not."""

    error: str | None = None
    report: LoadReport | None = None
    audit: str | None = None

    def fail(self, code: int, message: str) -> int:
        """Say ``message`` on stderr and end the run with ``code``."""
        print(f"logbroker load: {message}", file=sys.stderr, flush=True)
        self.error = message
        return code

    def document(self, code: int) -> dict[str, Any]:
        doc: dict[str, Any] = {"exit_code": code, "error": self.error}
        if self.report is not None:
            doc |= report_document(self.report)
        doc["audit"] = self.audit
        doc["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        return doc


def run(args: argparse.Namespace) -> int:
    report_file = None if args.report is None else Path(args.report)
    if report_file is not None:
        try:
            _check_report_file(report_file)
        except BadRequest as exc:
            print(f"logbroker load: {exc}", file=sys.stderr)
            return 2
        # a report present is the one of the last run that ended, never an older one
        report_file.unlink(missing_ok=True)
    outcome = _Outcome()
    try:
        code = _load(args, outcome)
    except Exception as exc:
        # the traceback goes to stderr as ever; the report says the run failed
        if report_file is not None:
            outcome.error = f"{type(exc).__name__}: {exc}"
            write_report(report_file, outcome.document(EXIT_FAILED))
        raise
    if report_file is not None:
        try:
            write_report(report_file, outcome.document(code))
        except OSError as exc:
            print(f"logbroker load: --report {report_file} not written: {exc}", file=sys.stderr)
            return code or EXIT_FAILED
    return code


def _check_local_parent(warehouse: Path) -> None:
    """Refuse a local table path under a file, before Spark starts (it failed at the table's
    creation, with a Java traceback)."""
    probe = warehouse.parent
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        raise BadRequest(f"--warehouse {warehouse}: {probe} is not a directory")


def _check_kafka_reachable(spec: SourceSpec) -> None:
    """Return once a broker of ``spec``'s cluster answered; ``StoreUnavailable`` in one line
    within a few seconds if none did.  Without it the driver's first listing tried for 15 s
    or more while librdkafka printed every failed connection on stderr (over 100 lines)."""
    from log_store.kafka.bootstrap import check_reachable

    check_reachable(dataclasses.replace(spec.kafka_settings(), librdkafka_log="debug"))


def _no_topic_matches(spec: SourceSpec, topics: str, names: list[str]) -> str:
    """Why a load that matched no topic loads nothing, naming the topics there are."""
    from audit.records import is_audit_topic

    there = [n for n in names if not is_audit_topic(n)]
    listed = f"topics there: {', '.join(there[:10])}{' ...' if len(there) > 10 else ''}"
    return (
        f"no topic of {spec.describe()} matches --topics {topics!r} "
        f"({listed if there else 'it has none'}; a topic is created by its first write: one "
        "not written to yet is not there)"
    )


def _check_report_file(path: Path) -> None:
    if path.is_dir() or not path.name:
        raise BadRequest(f"--report {path} is a directory: give a file's path")
    if not path.parent.is_dir():
        raise BadRequest(f"--report {path}: directory {path.parent} does not exist")


def _load(args: argparse.Namespace, outcome: _Outcome) -> int:
    from delivery.gateway_retry import gateway_urls
    from delivery.installations import check_one_installation

    try:
        from yt_loader.crash_points import armed_point
        from yt_loader.load_job import LoadConfig, run_load
        from yt_loader.load_target import check_table_format, table_exists
        from yt_loader.log_source import SourceSpec
        from yt_loader.offset_ranges import matching_topics, topic_patterns
        from yt_loader.spark_session import (
            build_session,
            check_log_level,
            check_master,
            launched_by_spark_submit,
            streams_merged,
        )
    except ModuleNotFoundError as exc:
        needed = (exc.name or "pyspark").split(".")[0]
        return outcome.fail(2, f"needs {needed}; {_spark_install_hint()}")
    from yt_loader.errors import DataLost

    _log_as_progress()
    if launched_by_spark_submit() and streams_merged() and args.report is None:
        _progress(
            "spark-submit merges this driver's stderr into its stdout: progress and the "
            f"{'JSON report' if args.format == 'json' else 'summary'} share one stream "
            "(--report FILE writes the report to a file)"
        )

    try:
        sizes = (args.max_range_mb, args.max_batch_mb)
        if not all(math.isfinite(mb) and mb > 0 for mb in sizes):
            raise BadRequest("--max-range-mb and --max-batch-mb must be positive numbers")
        if not args.warehouse.strip():
            raise BadRequest("--warehouse must name the table's directory")
        warehouse = Path(args.warehouse)
        if warehouse.exists() and not warehouse.is_dir():
            raise BadRequest(f"--warehouse {warehouse} exists and is not a directory")
        if "://" not in args.warehouse:
            _check_local_parent(warehouse)
        check_table_format(warehouse, args.table_format)
        _check_audit_flags(args)
        topic_patterns(args.topics)
        if args.master is not None:
            check_master(args.master)
        log_level = None if args.spark_log_level is None else check_log_level(args.spark_log_level)
        token = token_from(args) if args.server else None
        spec = SourceSpec(
            data_dir=args.data_dir,
            server=args.server,
            token=token,
            gateway_retry_s=args.gateway_retry,
            kafka_bootstrap=args.kafka_bootstrap,
            kafka_namespace=args.kafka_namespace,
            kafka_properties=_kafka_properties(args),
        )
        if spec.kafka_bootstrap is not None:
            try:
                _check_kafka_reachable(spec)
            except StoreUnavailable as exc:
                return outcome.fail(2, str(exc))  # as topics and audit say it (docs/kafka.md)
        # a gateway of another installation in --server is refused at once, before Spark
        spec = spec.pinned()
        audit_installation = spec.installation
        if args.audit_server is not None:
            audit_installation = check_one_installation(
                gateway_urls(args.audit_server), why=_AUDIT_WHY, token=token_from(args)
            )
        source = spec.open()  # a wrong directory or an unreachable gateway fails before Spark
        try:
            names = source.topic_names()
        finally:
            source.close()
        no_topic = _no_topic_matches(spec, args.topics, names)
        if (
            not args.audit_only
            and not matching_topics(names, args.topics)
            and "://" not in args.warehouse
            and not table_exists(warehouse, args.table_format)
        ):
            # With a table (or a URL, where this cannot tell) the run goes on: the table may
            # hold offsets of a matching topic deleted since, which the load reports as lost;
            # if it does not, the run ends as this one does, after Spark's start.
            return outcome.fail(2, f"{no_topic}; nothing loaded, no table created")
        config = LoadConfig(
            spec=spec,
            warehouse=warehouse,
            topics=args.topics,
            max_range_bytes=max(1, int(args.max_range_mb * 1024 * 1024)),
            max_batch_bytes=max(1, int(args.max_batch_mb * 1024 * 1024)),
            crash_at=armed_point(),
            table_format=args.table_format,
            skip_corrupt=args.skip_corrupt,
        )
    except BadRequest as exc:
        return outcome.fail(2, str(exc))
    except LogbrokerError as exc:
        return outcome.fail(1, str(exc))

    stop = threading.Event()

    def _on_stop() -> None:
        _progress("stop requested: finishing the batch in hand, then stopping")
        stop.set()

    stop_signals.on_stop(_on_stop)
    if args.audit_only and args.table_format == "parquet":
        return _publish_audit(args, None, outcome, audit_installation)
    try:
        spark = build_session(
            args.master, with_delta=args.table_format == "delta", log_level=log_level
        )
    except BadRequest as exc:
        return outcome.fail(2, str(exc))
    try:
        if args.audit_only:
            return _publish_audit(args, spark, outcome, audit_installation)
        report = run_load(spark, config, _progress, stop)
        outcome.report = report
        if not args.no_audit:
            _publish_audit(args, spark, outcome, audit_installation)
        if not (report.topics or report.held_back or report.gaps):
            return outcome.fail(2, f"{no_topic}; nothing loaded")
    except DataLost as exc:
        return outcome.fail(EXIT_DATA_LOST, f"DATA LOST: {exc}")
    except BadRequest as exc:
        return outcome.fail(2, str(exc))
    except LogbrokerError as exc:
        return outcome.fail(1, str(exc))
    finally:
        spark.stop()

    if args.format == "json":
        print(json.dumps(report_document(report), indent=1))
    else:
        for topic in sorted(report.topics):
            print(report.topics[topic].describe())
        for topic, why in sorted(report.held_back.items()):
            print(f"{topic}: NOT LOADED: {why}")
        print(
            f"loaded {report.lines} lines ({report.data_bytes / 1e6:.1f} MB) from "
            f"{report.ranges} offset ranges in {len(report.batches)} batches, "
            f"{report.elapsed_s:.1f} s"
        )
    return exit_code(report)


def exit_code(report: LoadReport) -> int:
    """The exit code of a load that ran: see the module docstring.

    A held-back topic is a failure (1) even where offsets were lost too (3): it loads
    nothing until its schema is fixed, and the lost offsets were named on stderr.
    """
    # The gaps and held-back topics were named on stderr as soon as the plan found them.
    if report.held_back:
        return EXIT_FAILED
    return EXIT_DATA_LOST if report.gaps else 0


def _publish_audit(
    args: argparse.Namespace,
    spark: object,
    outcome: _Outcome,
    installation: tuple[str, str] | None = None,
) -> int:
    """Recount the table and publish it as the audit's loader tier (see ops/audit_loader.py);
    ``installation``: (URL, installation id) the gateways were found to belong to at the
    run's start, if one named it."""
    from yt_loader.table_counts import delta_table_counts, parquet_table_counts

    warehouse = Path(args.warehouse)
    server = args.server or args.audit_server
    if server is None:
        source = "--data-dir" if args.data_dir is not None else "--kafka-bootstrap"
        outcome.audit = f"counts not published (with {source}, give --audit-server URL)"
        _progress(f"audit: {outcome.audit}")
        return 0
    if args.table_format == "parquet":
        counts = parquet_table_counts(warehouse)
    else:
        counts = delta_table_counts(spark, warehouse)
    try:
        written = _publish_to_one(counts, warehouse, server, token_from(args), installation)
    except LogbrokerError as exc:
        outcome.audit = f"publishing the audit counts failed: {exc}"
        print(f"logbroker load: {outcome.audit}", file=sys.stderr)
        if args.audit_only:
            outcome.error = outcome.audit  # the run's only work failed
        # a gateway of another installation, or no gateway: the command line's mistake
        return 2 if isinstance(exc, BadRequest) else 1
    outcome.audit = f"{len(counts)} window(s) counted, {written} total(s) published"
    _progress(f"audit: {outcome.audit}")
    return 0


def _publish_to_one(
    counts: Counts,
    warehouse: Path,
    servers: str,
    token: str | None,
    installation: tuple[str, str] | None = None,
) -> int:
    """Publish to the first of ``servers`` (``URL[,URL...]``) that takes the counts.  Asking
    the next after a failure cannot count twice: every audit record is a cumulative total
    (see ``audit.publisher``).

    With several, each is asked its installation before the counts go to it, and checked
    against ``installation`` ((URL, installation id) found at the run's start) or the first
    that names one: a gateway that did not answer at the start and belongs to another
    installation now is refused (:class:`~delivery.installations.MixedInstallations`), as
    a gateway command refuses it when first reached."""
    from delivery.gateway_retry import gateway_urls
    from delivery.installations import OneInstallation, ask_one_gateway
    from ops.audit_loader import publish_table_counts

    urls = gateway_urls(servers)
    one = OneInstallation(_AUDIT_WHY, installation)
    failure = ""
    for i, url in enumerate(urls):
        try:
            unchecked = None if len(urls) < 2 else ask_one_gateway(one, url, token=token)
            if unchecked is None:
                return publish_table_counts(counts, warehouse, server=url, token=token)
            failure = f"{url}: {unchecked}"
        except BadRequest:
            raise  # another installation, or no gateway: the next is not asked either
        except LogbrokerError as exc:
            if len(urls) < 2:
                raise
            failure = f"{url}: {exc}"
        if i < len(urls) - 1:
            _progress(f"audit: {failure}; trying the next gateway")
    raise LogbrokerError(failure)
