"""The loader job into a Delta table: incremental, exactly once, read with Spark SQL."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from log_store import open_store
from log_store.interface import TopicConfig
from ops.commands.load import EXIT_DATA_LOST, exit_code
from session_dedup.envelope import Envelope, encode
from tests.conftest import free_port
from tests.yt_loader.conftest import (
    REPO,
    ChildProcess,
    append_lines,
    assert_exactly_once,
    table_lines,
    table_version,
)
from yt_loader.delta_table import BATCH_APP_ID, DeltaTarget, partition_app_id
from yt_loader.errors import BadSourceOptions, WarehouseBusy, WarehouseCorrupt
from yt_loader.load_job import LoadConfig, LoadFailed, run_load
from yt_loader.load_target import DELTA_LOG_DIR
from yt_loader.log_source import SourceSpec
from yt_loader.spark_session import build_session, check_log_level
from yt_loader.table_counts import delta_table_counts
from yt_loader.warehouse import CommitRecord, TopicOffsets, Warehouse

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def _load(
    spark: object,
    data_dir: Path,
    table: Path,
    topics: str = "*",
    progress: list[str] | None = None,
) -> object:
    config = LoadConfig(
        SourceSpec(data_dir=str(data_dir)), table, topics=topics, max_range_bytes=4000
    )
    lines = progress if progress is not None else []
    return run_load(spark, config, lines.append)  # type: ignore[arg-type]


def _app_transactions(spark: object, table: Path) -> dict[str, int]:
    """The table's application transactions (appId -> version), read from Delta's snapshot."""
    jvm = spark._jvm  # type: ignore[attr-defined]
    delta_log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(
        spark._jsparkSession,  # type: ignore[attr-defined]
        str(table),
    )
    snapshot = delta_log.startTransaction().snapshot()
    txns = jvm.scala.jdk.javaapi.CollectionConverters.asJava(snapshot.transactions())
    return {str(k): int(v) for k, v in dict(txns).items()}


def test_load_writes_each_line_once_into_a_delta_table_partitioned_by_topic_date_hour(
    spark: object, tmp_path: Path
) -> None:
    data_dir, table = tmp_path / "data", tmp_path / "table"
    expected = append_lines(data_dir, "dc1.nginx-access", "a", codec="raw")
    expected += append_lines(data_dir, "dc1.api", "a", codec="gzip", partitions=2)
    expected += append_lines(data_dir, "dc2.api", "a", codec="zstd", partitions=1)

    report = _load(spark, data_dir, table)

    assert report.lines == len(expected)  # type: ignore[attr-defined]
    assert_exactly_once(table_lines(spark, table), expected)
    detail = spark.sql(f"DESCRIBE DETAIL delta.`{table}`").collect()[0]  # type: ignore[attr-defined]
    assert detail["format"] == "delta"
    assert list(detail["partitionColumns"]) == ["topic", "date", "hour"]
    by_topic = spark.sql(  # type: ignore[attr-defined]
        f"SELECT topic, count(*) AS n FROM delta.`{table}` GROUP BY topic"
    ).collect()
    assert {r["topic"]: r["n"] for r in by_topic} == {
        "dc1.nginx-access": 180,
        "dc1.api": 120,
        "dc2.api": 60,
    }
    mismatched = spark.sql(  # type: ignore[attr-defined]
        f"SELECT count(*) AS n FROM delta.`{table}` "
        "WHERE floor(unix_micros(write_time) / 3600000000) % 24 != hour "
        "OR date_from_unix_date(CAST(floor(unix_micros(write_time) / 86400000000) AS INT)) "
        "!= date"
    ).collect()[0]["n"]
    assert mismatched == 0
    hours = spark.sql(f"SELECT DISTINCT hour FROM delta.`{table}`").collect()  # type: ignore[attr-defined]
    assert len(hours) == 3  # the test data spreads write times over three hours


def test_rerun_with_no_new_data_commits_nothing(spark: object, tmp_path: Path) -> None:
    data_dir, table = tmp_path / "data", tmp_path / "table"
    expected = append_lines(data_dir, "dc1.app", "a")
    _load(spark, data_dir, table)
    version = table_version(spark, table)

    report = _load(spark, data_dir, table)

    assert report.batches == [] and report.lines == 0  # type: ignore[attr-defined]
    assert table_version(spark, table) == version
    assert_exactly_once(table_lines(spark, table), expected)


def test_new_data_and_new_topics_are_appended_and_offsets_live_in_the_table(
    spark: object, tmp_path: Path
) -> None:
    data_dir, table = tmp_path / "data", tmp_path / "table"
    expected = append_lines(data_dir, "dc1.app", "first")
    _load(spark, data_dir, table, topics="dc1.*")
    expected += append_lines(data_dir, "dc1.app", "second", chunks=7)
    expected += append_lines(data_dir, "dc1.new-topic", "second", partitions=2)
    append_lines(data_dir, "dc2.other", "not-matched", partitions=1)

    progress: list[str] = []
    report = _load(spark, data_dir, table, topics="dc1.*", progress=progress)

    assert any("dc1.app: 21/21 offsets (100%), 63 lines" in line for line in progress), progress
    assert any("dc1.new-topic: 40/40 offsets (100%)" in line for line in progress), progress
    assert set(report.topics) == {"dc1.app", "dc1.new-topic"}  # type: ignore[attr-defined]
    assert_exactly_once(table_lines(spark, table), expected)
    with open_store(data_dir) as store:
        app_id = store.describe_topic("dc1.app").topic_id
        new_id = store.describe_topic("dc1.new-topic").topic_id
    txns = _app_transactions(spark, table)
    assert txns[BATCH_APP_ID] == 2
    assert {p: txns[partition_app_id("dc1.app", app_id, p)] for p in range(3)} == {
        0: 27,
        1: 27,
        2: 27,
    }
    assert {p: txns[partition_app_id("dc1.new-topic", new_id, p)] for p in range(2)} == {
        0: 20,
        1: 20,
    }


def test_users_read_the_table_with_spark_sql_and_time_travel_to_a_batch(
    spark: object, tmp_path: Path
) -> None:
    data_dir, table = tmp_path / "data", tmp_path / "table"
    first = append_lines(data_dir, "dc1.app", "first", partitions=2, chunks=4)
    _load(spark, data_dir, table)
    second = append_lines(data_dir, "dc1.app", "second", partitions=2, chunks=4)
    _load(spark, data_dir, table)

    spark.sql(f"CREATE TABLE logs USING delta LOCATION '{table}'")  # type: ignore[attr-defined]
    try:
        now = spark.sql("SELECT count(*) AS n FROM logs WHERE topic = 'dc1.app'").collect()  # type: ignore[attr-defined]
        history = spark.sql("DESCRIBE HISTORY logs").collect()  # type: ignore[attr-defined]
    finally:
        spark.sql("DROP TABLE logs")  # type: ignore[attr-defined]

    assert now[0]["n"] == len(first) + len(second)
    writes = sorted((r for r in history if r["operation"] == "WRITE"), key=lambda r: r["version"])
    assert [json.loads(r["userMetadata"])["batch"] for r in writes] == [1, 2]
    batch_1 = json.loads(writes[0]["userMetadata"])
    assert batch_1["offsets"] == {"dc1.app": {"0": [0, 4], "1": [0, 4]}}
    assert_exactly_once(table_lines(spark, table, version=writes[0]["version"]), first)
    assert_exactly_once(table_lines(spark, table, version=writes[1]["version"]), first + second)


def test_a_topic_deleted_and_created_again_is_reported_once_and_keeps_its_old_rows(
    spark: object, tmp_path: Path
) -> None:
    data_dir, table = tmp_path / "data", tmp_path / "table"
    at = int(time.time() * 1000)  # both topics' chunks in one audit window
    old = append_lines(data_dir, "dc1.app", "old", partitions=1, write_time_ms=at)
    _load(spark, data_dir, table)
    with open_store(data_dir) as store:
        store.delete_topic("dc1.app")
    new = append_lines(data_dir, "dc1.app", "new", partitions=1, write_time_ms=at)

    report = _load(spark, data_dir, table)
    again = _load(spark, data_dir, table)

    assert [g.reason for g in report.gaps] == [  # type: ignore[attr-defined]
        "the topic was deleted and created again; whatever the old topic held from offset 20 "
        "on was not loaded"
    ]
    assert again.gaps == [] and again.batches == []  # type: ignore[attr-defined]
    assert_exactly_once(table_lines(spark, table), old + new)
    # The audit's loader tier counts the new topic's messages apart from the old one's at
    # the same offsets, as the gateway counted them: 20 + 20 messages, not 20.
    counts = delta_table_counts(spark, table)
    assert list(counts.values()) == [(40, 120)], counts


def test_a_topic_deleted_is_reported_once_naming_its_loaded_offsets_and_keeps_its_rows(
    spark: object, tmp_path: Path
) -> None:
    """A topic named by the load (here by list; a glob is the same) that is deleted from the
    log: the next load says so, naming every partition's loaded offset, records it in the
    table (exit 3 from the command) and does not say it again; a topic of that name created
    later is a new topic, loaded from its start."""
    data_dir, table = tmp_path / "data", tmp_path / "table"
    kept = append_lines(data_dir, "dc1.app", "a", partitions=1, chunks=4)
    gone = append_lines(data_dir, "dc1.gone", "a", partitions=2, chunks=5)
    _load(spark, data_dir, table, topics="dc1.app,dc1.gone")
    with open_store(data_dir) as store:
        store.delete_topic("dc1.gone")
    kept += append_lines(data_dir, "dc1.app", "b", partitions=1, chunks=4)

    progress: list[str] = []
    report = _load(spark, data_dir, table, topics="dc1.app,dc1.gone", progress=progress)
    again = _load(spark, data_dir, table, topics="dc1.app,dc1.gone")

    lost = [line for line in progress if line.startswith("DATA LOST: dc1.gone")]
    assert lost == [
        f"DATA LOST: dc1.gone partition {p}: the topic was deleted; loaded up to offset 5, "
        "whatever it held from offset 5 on was never loaded"
        for p in (0, 1)
    ], progress
    assert [(g.topic, g.partition) for g in report.gaps] == [("dc1.gone", 0), ("dc1.gone", 1)]  # type: ignore[attr-defined]
    assert again.gaps == [] and again.batches == []  # type: ignore[attr-defined]
    history = spark.sql(f"DESCRIBE HISTORY delta.`{table}` LIMIT 1").collect()  # type: ignore[attr-defined]
    assert len(json.loads(history[0]["userMetadata"])["gaps"]) == 2
    assert_exactly_once(table_lines(spark, table), kept + gone)
    assert sum(m for m, _ in delta_table_counts(spark, table).values()) == 4 + 4 + 10

    created = append_lines(data_dir, "dc1.gone", "new", partitions=1, chunks=2)
    later = _load(spark, data_dir, table, topics="dc1.*")
    assert later.gaps == [] and later.lines == len(created)  # type: ignore[attr-defined]
    assert_exactly_once(table_lines(spark, table), kept + gone + created)


def test_a_batch_planned_before_another_loader_committed_is_refused(
    spark: object, tmp_path: Path
) -> None:
    data_dir, table = tmp_path / "data", tmp_path / "table"
    expected = append_lines(data_dir, "dc1.app", "a", partitions=1)
    stale = DeltaTarget(spark, table)  # type: ignore[arg-type]
    with stale.opened(lambda _line: None) as state:
        assert state.batch == 0
        _load(spark, data_dir, table)  # another loader commits batch 1 meanwhile
        with pytest.raises(WarehouseBusy, match="another loader"):
            stale.commit(1, [], {}, [], None)

    assert_exactly_once(table_lines(spark, table), expected)
    assert _app_transactions(spark, table)[BATCH_APP_ID] == 1


def test_two_loaders_starting_on_a_new_table_at_once_both_open_it(
    spark: object, tmp_path: Path
) -> None:
    """Two scheduled loads that start together on a new table both create it; the loser of
    that race finds the table the winner created, rather than failing with Delta's error."""
    errors: list[BaseException] = []
    for attempt in range(3):
        table = tmp_path / f"table{attempt}"
        barrier = threading.Barrier(2)

        def open_table(table: Path = table, barrier: threading.Barrier = barrier) -> None:
            barrier.wait()
            try:
                with DeltaTarget(spark, table).opened(lambda _line: None) as state:  # type: ignore[arg-type]
                    assert state.batch == 0
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=open_table) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert not errors, [f"{type(error).__name__}: {error}" for error in errors]
        assert table_version(spark, table) == 0


def test_a_loader_finding_another_loaders_creation_half_done_waits_for_its_commit(
    spark: object, tmp_path: Path
) -> None:
    """The race above, in its narrowest window, made deterministic: the other loader has made
    the table's log directory but not yet written its first commit.  Delta refuses a creation
    there (the location is not empty); the loader waits for the commit and uses that table,
    rather than failing, or opening a table that has no version yet."""
    other = tmp_path / "other"
    with DeltaTarget(spark, other).opened(lambda _line: None):  # type: ignore[arg-type]
        pass
    first_commit = f"{0:020d}.json"
    table = tmp_path / "table"
    (table / DELTA_LOG_DIR).mkdir(parents=True)
    read_versions: list[int] = []
    errors: list[BaseException] = []

    def open_table() -> None:
        try:
            target = DeltaTarget(spark, table)  # type: ignore[arg-type]
            with target.opened(lambda _line: None) as state:
                assert state.batch == 0
                assert target._txn is not None
                read_versions.append(int(target._txn.txn.readVersion()))
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=open_table)
    thread.start()
    time.sleep(2.0)
    assert thread.is_alive(), "the loader did not wait for the other loader's first commit"
    os.rename(other / DELTA_LOG_DIR / first_commit, table / DELTA_LOG_DIR / first_commit)
    thread.join(120)
    assert not errors, [f"{type(error).__name__}: {error}" for error in errors]
    assert read_versions == [0]
    assert table_version(spark, table) == 0


def test_a_log_directory_left_without_a_commit_is_named_after_a_wait(
    spark: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A creation that died between making the log directory and committing leaves a
    directory Delta will never create a table in; the error says which and what to do."""
    import yt_loader.delta_table as delta_table

    monkeypatch.setattr(delta_table, "CREATION_WAIT_S", 1.0)
    table = tmp_path / "table"
    (table / DELTA_LOG_DIR).mkdir(parents=True)
    target = DeltaTarget(spark, table)  # type: ignore[arg-type]
    with (
        pytest.raises(WarehouseCorrupt, match=r"no commit for 1 s.*remove that directory"),
        target.opened(lambda _line: None),
    ):
        pass
    assert list((table / DELTA_LOG_DIR).iterdir()) == []


def test_relative_paths_name_the_same_directories_on_the_driver_and_the_executors(
    spark: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An executor's working directory is not the driver's (on a cluster it is the worker's
    work directory): relative paths are made absolute where they are given, or the tasks
    would write the files somewhere the table's commit does not point."""
    data_dir = tmp_path / "data"
    expected = append_lines(data_dir, "dc1.app", "r", partitions=2, chunks=4)
    stray = REPO / tmp_path.name  # where the executors' working directory would put them
    monkeypatch.chdir(tmp_path)  # the driver's; this session's executors keep theirs
    try:
        config = LoadConfig(SourceSpec(data_dir="data"), Path(tmp_path.name))
        run_load(spark, config, lambda _line: None)  # type: ignore[arg-type]
        assert not stray.exists()
    finally:
        shutil.rmtree(stray, ignore_errors=True)
    assert_exactly_once(table_lines(spark, tmp_path / tmp_path.name), expected)


def test_load_through_a_gateway_matches_the_store(
    spark: object, tmp_path: Path, start_gateway: object
) -> None:
    gateway = start_gateway(tmp_path / "data")  # type: ignore[operator]
    expected = append_lines(tmp_path / "data", "dc1.app", "a", codec="gzip")
    config = LoadConfig(SourceSpec(server=gateway.url), tmp_path / "table", max_range_bytes=4000)

    report = run_load(spark, config, lambda _line: None)  # type: ignore[arg-type]

    assert report.lines == len(expected)
    assert_exactly_once(table_lines(spark, tmp_path / "table"), expected)


def test_offsets_dropped_by_retention_before_loading_are_reported_with_exit_code_3(
    spark: object, tmp_path: Path
) -> None:
    data_dir, table = tmp_path / "data", tmp_path / "table"
    small_segments = TopicConfig(partitions=1, segment_bytes=4096)
    for round_no in range(6):  # segments roll between appends
        append_lines(
            data_dir, "dc1.app", f"r{round_no}", partitions=1, config=small_segments, chunks=20
        )
    with open_store(data_dir) as store:
        new_start = store.delete_segments_before("dc1.app", 0, 80)
    assert 0 < new_start <= 80

    child = ChildProcess(
        [
            "-m",
            "ops",
            "load",
            "--data-dir",
            str(data_dir),
            "--warehouse",
            str(table),
            "--master",
            "local[1]",
            "--format",
            "json",
        ],
        tmp_path / "load.log",
        env={"LOGBROKER_SPARK_LOG_LEVEL": "INFO"},
    )
    code = child.wait(240)
    output = child.output()

    assert code == 3, output[-3000:]
    assert " INFO SparkContext: " in output  # Spark's own log, at the level asked for
    assert f"DATA LOST: dc1.app partition 0: offsets 0..{new_start - 1}" in output
    assert "retention dropped them before they were loaded" in output
    report, _ = json.JSONDecoder().raw_decode(output, output.index('{\n "batches"'))
    assert report["gaps"][0]["end"] == new_start
    assert len(table_lines(spark, table)) == (120 - new_start) * 3
    history = spark.sql(f"DESCRIBE HISTORY delta.`{table}`").collect()  # type: ignore[attr-defined]
    recorded = [json.loads(r["userMetadata"]) for r in history if r["operation"] == "WRITE"]
    assert any(f"offsets 0..{new_start - 1}" in gap for m in recorded for gap in m["gaps"])


def test_a_message_that_does_not_decompress_stops_the_load_unless_skip_corrupt(
    spark: object, tmp_path: Path
) -> None:
    """Without ``--skip-corrupt`` the load stops at the message, naming it, and commits
    nothing of its batch; with it, the message, and the record after it that is no envelope
    at all (another producer's), are left out and recorded as lost (exit 3, the table's
    commit names them), and the next run reports them no more."""
    data_dir, table = tmp_path / "data", tmp_path / "table"
    before = append_lines(data_dir, "dc1.app", "before", partitions=1, chunks=5)
    with open_store(data_dir) as store:
        corrupt = store.end_offset("dc1.app", 0)
        bad = Envelope("s", "h", "/f", "app", "gzip", 99, 0, 0, b"notgzip")
        store.append("dc1.app", 0, [encode(bad), b'{"written by": "another producer"}'])
    after = append_lines(data_dir, "dc1.app", "after", partitions=1, chunks=5)

    cwd = tmp_path / "cwd"
    cwd.mkdir()

    def load(*extra: str) -> tuple[int, str]:
        args = ["-m", "ops", "load", "--data-dir", str(data_dir), "--warehouse", str(table)]
        args += ["--master", "local[1]", *extra]
        child = ChildProcess(args, tmp_path / "load.log", cwd=cwd)
        return child.wait(240), child.output()

    code, output = load()
    assert code == 1, output[-3000:]
    assert " INFO " not in output  # Spark logs at WARN unless told otherwise
    # the session fixture's resolution listed Delta's jars: this one takes them, no Ivy
    assert ":: resolving dependencies ::" not in output
    assert (
        f"logbroker load: batch 1 failed: CorruptChunk: dc1.app/0 offset {corrupt}: gzip chunk "
        "does not decompress"
    ) in output
    assert "--skip-corrupt" in output
    assert table_lines(spark, table) == []

    code, output = load("--skip-corrupt", "--format", "json")
    assert code == 3, output[-3000:]
    assert f"DATA LOST: dc1.app partition 0: offset {corrupt} was never loaded" in output
    report, _ = json.JSONDecoder().raw_decode(output, output.index('{\n "batches"'))
    assert (
        f"DATA LOST: dc1.app partition 0: offset {corrupt + 1} was never loaded: the message is "
        "not a logbroker envelope"
    ) in output
    assert [(g["start"], g["end"]) for g in report["gaps"]] == [
        (corrupt, corrupt + 1),
        (corrupt + 1, corrupt + 2),
    ]
    assert_exactly_once(table_lines(spark, table), before + after)
    history = spark.sql(f"DESCRIBE HISTORY delta.`{table}`").collect()  # type: ignore[attr-defined]
    recorded = [json.loads(r["userMetadata"]) for r in history if r["operation"] == "WRITE"]
    assert any(f"offset {corrupt} was never loaded" in g for m in recorded for g in m["gaps"])

    assert list(cwd.iterdir()) == []  # no ./spark-warehouse left where it was run
    again = _load(spark, data_dir, table)
    assert again.gaps == [] and again.batches == []  # type: ignore[attr-defined]


def test_a_record_that_is_not_an_envelope_stops_a_load_through_a_gateway_unless_skip_corrupt(
    spark: object, tmp_path: Path, start_gateway: object
) -> None:
    """Through a gateway (``--server``) as from the store: the gateway's pull API leaves such a
    record out of its answer and names it, and the load stops there naming its offset and
    --skip-corrupt, committing nothing of the batch; with skip_corrupt it is a lost offset
    (exit 3), and the lines around it are loaded once."""
    data_dir, table = tmp_path / "data", tmp_path / "table"
    gateway = start_gateway(data_dir)  # type: ignore[operator]
    before = append_lines(data_dir, "dc1.app", "before", partitions=1, chunks=5)
    with open_store(data_dir) as store:
        foreign = store.append("dc1.app", 0, [b'{"written by": "another producer"}']).first_offset
    after = append_lines(data_dir, "dc1.app", "after", partitions=1, chunks=5)
    config = LoadConfig(SourceSpec(server=gateway.url), table, max_range_bytes=4000)

    with pytest.raises(LoadFailed) as failed:
        run_load(spark, config, lambda _line: None)  # type: ignore[arg-type]
    assert (
        f"CorruptChunk: dc1.app/0 offset {foreign} is not a logbroker envelope "
        "(unknown envelope version byte)"
    ) in str(failed.value)
    assert "--skip-corrupt loads past it" in str(failed.value)
    assert table_lines(spark, table) == []

    progress: list[str] = []
    report = run_load(spark, replace(config, skip_corrupt=True), progress.append)  # type: ignore[arg-type]
    assert [(g.start, g.end) for g in report.gaps] == [(foreign, foreign + 1)]
    assert exit_code(report) == EXIT_DATA_LOST
    assert any(
        line.startswith(
            f"DATA LOST: dc1.app partition 0: offset {foreign} was never loaded: the message is "
            "not a logbroker envelope (unknown envelope version byte)"
        )
        for line in progress
    ), progress
    assert_exactly_once(table_lines(spark, table), before + after)
    again = run_load(spark, replace(config, skip_corrupt=True), lambda _line: None)  # type: ignore[arg-type]
    assert again.gaps == [] and again.batches == []


def test_the_session_logs_at_warn_unless_told_otherwise(spark: object) -> None:
    """Spark's INFO lines would bury the loader's progress on stderr (a spark-submit driver
    logs at INFO): the session is WARN by default, and ``--spark-log-level`` (or
    LOGBROKER_SPARK_LOG_LEVEL) changes it."""
    jvm = spark._jvm  # type: ignore[attr-defined]

    def root_level() -> str:
        return str(jvm.org.apache.logging.log4j.LogManager.getRootLogger().getLevel())

    assert root_level() == "WARN"
    try:
        assert build_session("local[2]", log_level="error") is spark
        assert root_level() == "ERROR"
    finally:
        spark.sparkContext.setLogLevel("WARN")  # type: ignore[attr-defined]
    with pytest.raises(BadSourceOptions, match="is not one of"):
        check_log_level("loud")


def test_a_bookkeeping_round_trip_keeps_a_deleted_topics_mark() -> None:
    record = CommitRecord(
        batch=2,
        committed_ms=0,
        offsets={
            "dc1.gone": TopicOffsets("abc", {0: 5}, deleted=True),
            "dc1.app": TopicOffsets("d"),
        },
        ranges=[],
        gaps=[],
    )
    assert CommitRecord.from_json(record.to_json(), Path("x")) == record


def test_bad_usage_exits_2_before_starting_spark(tmp_path: Path) -> None:
    child = ChildProcess(
        ["-m", "ops", "load", "--data-dir", str(tmp_path / "nope"), "--warehouse", "w"],
        tmp_path / "bad.log",
    )
    assert child.wait(30) == 2
    assert "is not a logbroker data directory" in child.output()
    assert not (tmp_path / "nope").exists()


def _parquet_warehouse(path: Path) -> Path:
    """A Parquet warehouse with one (empty) committed batch."""
    (path / "_loader" / "commits").mkdir(parents=True)
    Warehouse(path).commit(CommitRecord(batch=1, committed_ms=0, offsets={}, ranges=[], gaps=[]))
    return path


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--topics", " , "], "topics must name at least one topic"),
        (["--max-range-mb", "nan"], "must be positive numbers"),
        (["--max-batch-mb", "inf"], "must be positive numbers"),
        (["--master", "bogus"], "--master 'bogus' is not a Spark master"),
        (["--master", "local[0]"], "is not a Spark master"),
        (["--warehouse", ""], "--warehouse must name the table's directory"),
        (["--table-format", "parquet"], "is a Delta table"),
        (["--warehouse", "PARQUET"], "is a Parquet warehouse"),
        (["--audit-server", "gw:8080"], "--audit-server must be an http:// or https:// URL"),
        (["--audit-server", "http://gw:8080", "--no-audit"], "contradict each other"),
        (["--token", "secret"], "--token and --token-file go with --server or --audit-server"),
        (["--spark-log-level", "loud"], "Spark log level 'loud' is not one of ALL, TRACE"),
    ],
)
def test_bad_flags_exit_2_before_starting_spark_and_change_nothing(
    tmp_path: Path, flags: list[str], message: str
) -> None:
    data_dir = tmp_path / "data"
    append_lines(data_dir, "dc1.app", "a", partitions=1, chunks=1)
    delta_table = tmp_path / "delta"
    (delta_table / "_delta_log").mkdir(parents=True)
    parquet = _parquet_warehouse(tmp_path / "parquet")
    flags = [str(parquet) if f == "PARQUET" else f for f in flags]
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    child = ChildProcess(
        ["-m", "ops", "load", "--data-dir", str(data_dir), "--warehouse", str(delta_table), *flags],
        tmp_path / "bad.log",
    )
    try:
        code = child.wait(30)
    except subprocess.TimeoutExpired:
        child.kill()  # it started Spark: the bug this test is about
        raise
    assert code == 2, child.output()
    assert message in child.output()
    assert "Traceback" not in child.output()
    assert "Ivy" not in child.output()  # Spark's package resolution never began
    assert (
        sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.name != "bad.log")
        == before
    )


def test_unreachable_gateway_exits_1_with_the_reason(tmp_path: Path) -> None:
    url, wh = f"http://127.0.0.1:{free_port()}", str(tmp_path / "wh")
    child = ChildProcess(
        # told not to wait long for a restart (see test_load_through_gateway_outages)
        ["-m", "ops", "load", "--server", url, "--gateway-retry", "1", "--warehouse", wh],
        tmp_path / "down.log",
    )
    assert child.wait(30) == 1
    assert f"gateway {url} unreachable" in child.output()
    assert "after 1 s of trying again" in child.output()
