"""``logbroker load``'s report where stderr and stdout are one stream (``spark-submit``), and
what ``--max-batch-mb`` bounds.

No Spark session: the session and the load are stand-ins (Spark's own part is tested in
test_cluster.py and test_load.py); what is tested here is what the command makes of a load.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from ops import cli, stop_signals
from ops.commands import load as load_command
from yt_loader import load_job, spark_session
from yt_loader.load_job import LoadConfig, _batch_size, _batches, _plan
from yt_loader.load_target import LoadState
from yt_loader.log_source import PartitionBounds, SourceSpec, TopicBounds
from yt_loader.offset_ranges import OffsetRange
from yt_loader.range_writer import WrittenRange

from .conftest import append_lines

REPO = Path(__file__).resolve().parents[2]

# A driver as spark-submit starts it: PYSPARK_GATEWAY_PORT set, stderr and stdout one pipe.
# The session and the load are stand-ins; the load says what a real one says on stderr.
_SUBMITTED_DRIVER = textwrap.dedent(
    """
    import sys

    from ops import cli, stop_signals
    from yt_loader import load_job, spark_session
    from yt_loader.warehouse import LoadGap, Recovery


    class _Spark:
        def stop(self):
            '''Nothing to stop: no session was started.'''


    def run_load(spark, config, progress, stop=None):
        progress("batch 1: dc1.app: 10/10 offsets (100%), 30 lines, 0.0 MB")
        gap = LoadGap("dc1.app", 0, 0, 4, "retention dropped them before they were loaded")
        progress(f"DATA LOST: {gap.message()}")
        report = load_job.LoadReport(Recovery(0, []), batches=[1], ranges=1, lines=30)
        report.gaps.append(gap)
        return report


    spark_session.build_session = lambda *args, **kwargs: _Spark()
    load_job.run_load = run_load
    sys.exit(cli.main(sys.argv[1:]))
    """
)


@pytest.fixture(autouse=True)
def _signal_handlers_kept(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """``cli.main`` run here records stop signals as a command does: give pytest its own back
    (and drop the callbacks of the loads run here)."""
    kept = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    kept[signal.SIGHUP] = signal.getsignal(signal.SIGHUP)
    monkeypatch.setattr(stop_signals, "_callbacks", [])
    yield
    for signum, handler in kept.items():
        signal.signal(signum, handler)


def _submitted(tmp_path: Path, *load_args: str) -> subprocess.CompletedProcess[str]:
    data_dir = tmp_path / "data"
    append_lines(data_dir, "dc1.app", "r", partitions=1, chunks=2)
    env = dict(os.environ, PYSPARK_GATEWAY_PORT="1", PYTHONPATH=str(REPO))
    args = ["load", "--data-dir", str(data_dir), "--warehouse", str(tmp_path / "table")]
    return subprocess.run(
        [sys.executable, "-c", _SUBMITTED_DRIVER, *args, *load_args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
    )


def test_report_file_holds_the_json_report_when_stderr_is_merged_into_stdout(
    tmp_path: Path,
) -> None:
    report = tmp_path / "load.json"
    report.write_text("the report of an earlier run")

    done = _submitted(tmp_path, "--format", "json", "--report", str(report))

    assert done.returncode == 3, done.stdout
    # the one stream is no JSON: progress lines come first
    assert done.stdout.startswith("logbroker load: batch 1: dc1.app")
    assert "logbroker load: DATA LOST: dc1.app partition 0: offsets 0..3" in done.stdout
    doc = json.loads(report.read_text())
    assert doc["exit_code"] == 3
    assert doc["error"] is None
    assert doc["batches"] == [1]
    assert doc["lines"] == 30
    assert [g["message"] for g in doc["gaps"]] == [
        "dc1.app partition 0: offsets 0..3 (4 messages) were never loaded: retention "
        "dropped them before they were loaded"
    ]
    assert doc["audit"] == "counts not published (with --data-dir, give --audit-server URL)"
    assert list(tmp_path.glob(".load.json.*")) == []  # no staged copy left


def test_a_driver_spark_submit_started_says_its_streams_are_merged(tmp_path: Path) -> None:
    done = _submitted(tmp_path, "--format", "json")

    assert done.returncode == 3, done.stdout
    assert done.stdout.startswith(
        "logbroker load: spark-submit merges this driver's stderr into its stdout: progress "
        "and the JSON report share one stream (--report FILE writes the report to a file)\n"
    )


def test_report_file_says_why_a_run_failed_and_replaces_an_older_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data_dir, report = tmp_path / "data", tmp_path / "load.json"
    append_lines(data_dir, "dc1.app", "r", partitions=1, chunks=2)
    report.write_text('{"exit_code": 0}')
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")

    args = ["--data-dir", str(data_dir), "--warehouse", str(not_a_dir)]
    code = cli.main(["load", *args, "--report", str(report)])

    assert code == 2
    doc = json.loads(report.read_text())
    assert doc["exit_code"] == 2
    assert doc["error"] == f"--warehouse {not_a_dir} exists and is not a directory"
    assert "batches" not in doc  # nothing was loaded
    assert capsys.readouterr().err.startswith(f"logbroker load: --warehouse {not_a_dir}")


def test_a_report_file_in_no_directory_is_bad_usage(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["--data-dir", str(tmp_path), "--warehouse", str(tmp_path / "t")]
    code = cli.main(["load", *args, "--report", str(tmp_path / "nowhere" / "load.json")])

    assert code == 2
    assert "--report" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("source", "named"),
    [
        (["--kafka-bootstrap", "127.0.0.1:9092"], "--kafka-bootstrap"),
        (["--data-dir", "/data"], "--data-dir"),
    ],
)
def test_unpublished_audit_counts_name_the_source_option_given(
    source: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = argparse.ArgumentParser()
    load_command.add_arguments(parser)
    args = parser.parse_args([*source, "--warehouse", "/t", "--table-format", "parquet"])
    outcome = load_command._Outcome()

    assert load_command._publish_audit(args, None, outcome) == 0

    said = f"counts not published (with {named}, give --audit-server URL)"
    assert capsys.readouterr().err == f"logbroker load: audit: {said}\n"
    assert outcome.audit == said


def test_batches_hold_max_batch_bytes_below_the_range_size(tmp_path: Path) -> None:
    # two partitions of 1000 offsets of 1 KiB each: 1000 KiB per partition
    bounds = [
        TopicBounds("dc1.app", "id-1", [PartitionBounds(p, 0, 1000, 1000 * 1024) for p in range(2)])
    ]
    config = LoadConfig(
        SourceSpec(data_dir=str(tmp_path)),
        tmp_path / "table",
        max_range_bytes=64 * 1024 * 1024,
        max_batch_bytes=300 * 1024,
    )
    plan = _plan(bounds, LoadState(), config)

    batches = _batches(plan, config.max_batch_bytes)

    sizes = [sum(r.count for r in batch) * 1024 for batch in batches]
    assert max(sizes) <= 300 * 1024, sizes
    assert sum(sizes) == 2000 * 1024
    # each partition in ranges of 300 offsets (300 KiB) and one of 100: six batches of one
    # range, then the two ranges of 100
    assert len(batches) == 7


def test_a_message_larger_than_the_batch_bound_is_a_batch_of_its_own(tmp_path: Path) -> None:
    bounds = [TopicBounds("dc1.app", "id-1", [PartitionBounds(0, 0, 3, 3 * 1024 * 1024)])]
    config = LoadConfig(SourceSpec(data_dir=str(tmp_path)), tmp_path / "t", max_batch_bytes=1000)

    batches = _batches(_plan(bounds, LoadState(), config), config.max_batch_bytes)

    assert [[(r.start, r.end) for r in batch] for batch in batches] == [
        [(0, 1)],
        [(1, 2)],
        [(2, 3)],
    ]


class _Builder:
    """Records what a session builder was given; ``getOrCreate`` gives a stand-in session."""

    def __init__(self) -> None:
        self.conf: dict[str, str] = {}

    def appName(self, name: str) -> _Builder:
        return self

    def master(self, master: str) -> _Builder:
        return self

    def config(self, key: str, value: str) -> _Builder:
        self.conf[key] = value
        return self

    def getOrCreate(self) -> object:
        conf = self.conf

        class _Context:
            defaultParallelism = 2
            levels: list[str] = []

            def setLogLevel(self, level: str) -> None:
                self.levels.append(level)

        class _Conf:
            def get(self, key: str, default: object = None) -> object:
                return conf.get(key, default)

        class _Session:
            sparkContext = _Context()

        session = _Session()
        session.conf = _Conf()  # type: ignore[attr-defined]
        return session


class _SubmittedConf:
    """``SparkConf()`` in a driver spark-submit started: its ``--conf`` settings."""

    given: dict[str, str] = {}

    def get(self, key: str, default: object = None) -> object:
        return self.given.get(key, default)

    def contains(self, key: str) -> bool:
        return key in self.given


@pytest.mark.parametrize(
    ("given", "expected"), [({}, "WARN"), ({"spark.log.level": "ERROR"}, "ERROR")]
)
def test_a_submitted_driver_gets_its_log_level_when_its_spark_context_starts(
    monkeypatch: pytest.MonkeyPatch, given: dict[str, str], expected: str
) -> None:
    builder = _Builder()
    monkeypatch.setenv("PYSPARK_GATEWAY_PORT", "1")
    monkeypatch.setattr(spark_session.SparkSession, "builder", builder)
    monkeypatch.setattr(spark_session.SparkContext, "_ensure_initialized", lambda: None)
    monkeypatch.setattr(_SubmittedConf, "given", given)
    monkeypatch.setattr(spark_session, "SparkConf", _SubmittedConf)
    monkeypatch.setattr(spark_session, "register", lambda spark: None)

    spark_session.build_session(with_delta=False)

    # set from the SparkContext's start: the ~100 INFO lines of its start are not shown
    assert builder.conf["spark.log.level"] == expected


def test_a_committed_batch_is_described_by_its_own_size(tmp_path: Path) -> None:
    bounds = [TopicBounds("dc1.app", "id-1", [PartitionBounds(0, 0, 100, 200 * 1000)])]
    config = LoadConfig(SourceSpec(data_dir=str(tmp_path)), tmp_path / "t")
    plan = _plan(bounds, LoadState(), config)
    written = [
        WrittenRange(OffsetRange("dc1.app", 0, 0, 50), "a", [], lines=300, data_bytes=450_000),
        WrittenRange(OffsetRange("dc1.app", 0, 50, 100), "a", [], lines=10, data_bytes=50_000),
    ]

    # what --max-batch-mb bounds (the bytes as stored) beside the lines' bytes
    assert _batch_size(written, plan) == ("2 ranges, 310 lines, 0.50 MB (about 0.20 MB as stored)")


def test_a_report_that_cannot_be_written_is_said_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tmp_path / "load.json"
    (tmp_path / f".load.json.{os.getpid()}.tmp").mkdir()  # where it would be staged
    args = ["--data-dir", str(tmp_path), "--warehouse", str(tmp_path / "t"), "--master", "x"]

    code = cli.main(["load", *args, "--report", str(report)])

    assert code == 2  # the run's own outcome (a bad master) is kept
    assert f"logbroker load: --report {report} not written: " in capsys.readouterr().err
    assert not report.exists()


def test_a_run_that_crashes_leaves_a_report_saying_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data_dir, report = tmp_path / "data", tmp_path / "load.json"
    append_lines(data_dir, "dc1.app", "r", partitions=1, chunks=2)

    class _Spark:
        def stop(self) -> None:
            """Nothing to stop: no session was started."""

    def run_load(*args: object, **kwargs: object) -> None:
        raise RuntimeError("the JVM went away")

    monkeypatch.setattr(spark_session, "build_session", lambda *a, **k: _Spark())
    monkeypatch.setattr(load_job, "run_load", run_load)
    args = ["--data-dir", str(data_dir), "--warehouse", str(tmp_path / "t")]

    with pytest.raises(RuntimeError):
        cli.main(["load", *args, "--report", str(report)])

    doc = json.loads(report.read_text())
    assert (doc["exit_code"], doc["error"]) == (1, "RuntimeError: the JVM went away")


def test_a_batch_of_a_log_that_reports_no_sizes_says_its_size_as_stored_is_unknown(
    tmp_path: Path,
) -> None:
    # Kafka reports no sizes: a partition's size_bytes is 0 (null over HTTP)
    bounds = [TopicBounds("dc1.app", "id-1", [PartitionBounds(0, 0, 100, 0)])]
    config = LoadConfig(SourceSpec(data_dir=str(tmp_path)), tmp_path / "t")
    plan = _plan(bounds, LoadState(), config)
    written = [WrittenRange(OffsetRange("dc1.app", 0, 0, 100), "a", [], lines=3, data_bytes=4_760)]

    assert _batch_size(written, plan) == "1 range, 3 lines, 0.00 MB (size as stored unknown)"
