"""``logbroker load`` submitted to a real Spark standalone cluster: a master and two workers,
separate JVMs on loopback, started from the installed PySpark (one cluster for the module, whose
tests run on one xdist worker: tests/conftest.py ONE_WORKER_MODULES).

The steps are the ones docs/loader.md ("On a Spark cluster") gives a user.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from log_store import open_store
from tests.yt_loader.conftest import REPO, ChildProcess, append_lines, assert_exactly_once
from tests.yt_loader.conftest import table_lines as _table_lines
from yt_loader.delta_connector import spark_submit_args
from yt_loader.delta_table import partition_app_id
from yt_loader.load_job import LoadConfig, run_load
from yt_loader.log_source import SourceSpec
from yt_loader.standalone_cluster import MASTER_HOST, StandaloneCluster, spark_bin
from yt_loader.task_faults import FIRST_ATTEMPTS, TASK_FAULT_ENV

# Real JVMs started and killed: generous on a loaded 2-core machine.
pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.fault, pytest.mark.timeout(900)]

WORKER_CORES = 2
"""Task slots per worker: a straggler holds one while a retry or a speculative copy runs."""


C1_ONLY = "-XX:TieredStopAtLevel=1"
"""The cluster's JVMs, as the tests' drivers (tests/conftest.py: SPARK_SUBMIT_OPTS), compile
with C1 only: they live for a test or a module, too short for C2's compiling to pay."""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    work = tmp_path_factory.mktemp("spark-cluster")
    with pytest.MonkeyPatch.context() as env:
        # the master's and the workers' own JVMs, started again by ensure_workers too
        daemon_opts = os.environ.get("SPARK_DAEMON_JAVA_OPTS", "")
        env.setenv("SPARK_DAEMON_JAVA_OPTS", f"{daemon_opts} {C1_ONLY}".strip())
        started = StandaloneCluster(work, workers=2, cores=WORKER_CORES, memory="1g").start()
        try:
            yield started
        finally:
            started.stop()


def _submit(
    cluster: StandaloneCluster,
    tmp_path: Path,
    load_args: list[str],
    conf: dict[str, str] | None = None,
) -> ChildProcess:
    """``spark-submit --master spark://... ops/cli.py load ...``, as docs/loader.md shows, run
    from the empty directory ``tmp_path/cwd``; its output goes to ``tmp_path/submit.log``."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    args = [
        "--master",
        cluster.master_url,
        *spark_submit_args(),
        "--conf",
        f"spark.pyspark.python={sys.executable}",
        "--conf",
        f"spark.pyspark.driver.python={sys.executable}",
        "--conf",
        f"spark.driver.host={MASTER_HOST}",
        "--conf",
        f"spark.driver.bindAddress={MASTER_HOST}",
        "--conf",
        "spark.ui.enabled=false",
        "--driver-memory",
        "512m",
        "--executor-memory",
        "512m",
        "--conf",
        f"spark.executor.extraJavaOptions={cluster.executor_java_options()} {C1_ONLY}",
    ]
    for key, value in (conf or {}).items():
        args += ["--conf", f"{key}={value}"]
    args += [str(REPO / "ops" / "cli.py"), "load", *load_args, "--format", "json"]
    return ChildProcess(args, tmp_path / "submit.log", program=spark_bin("spark-submit"), cwd=cwd)


def _report(child: ChildProcess) -> dict[str, object]:
    output = child.output()
    report, _ = json.JSONDecoder().raw_decode(output, output.index('{\n "batches"'))
    assert isinstance(report, dict)
    return report


def _event_log(directory: Path) -> list[dict[str, object]]:
    """The events of Spark's event log under ``directory`` (rolling files, uncompressed)."""
    return [
        json.loads(line)
        for path in sorted(directory.rglob("events_*"))
        for line in path.read_text().splitlines()
        if line.strip()
    ]


def test_speculative_copies_and_retried_tasks_commit_each_line_once(
    cluster: StandaloneCluster, spark: object, tmp_path: Path
) -> None:
    data_dir, table, events = tmp_path / "data", tmp_path / "table", tmp_path / "events"
    events.mkdir()
    expected = append_lines(data_dir, "dc1.app", "spec", partitions=4, chunks=30)
    cluster.ensure_workers()

    child = _submit(
        cluster,
        tmp_path,
        ["--data-dir", str(data_dir), "--warehouse", str(table)],
        conf={
            # The first attempt of every even task fails after writing part of its files, of
            # every odd task stalls after that (yt_loader/task_faults.py).
            f"spark.executorEnv.{TASK_FAULT_ENV}": FIRST_ATTEMPTS,
            "spark.task.maxFailures": "4",
            "spark.speculation": "true",
            "spark.speculation.interval": "200ms",
            "spark.speculation.quantile": "0.5",
            "spark.speculation.multiplier": "2",
            "spark.speculation.efficiency.enabled": "false",
            "spark.eventLog.enabled": "true",
            "spark.eventLog.compress": "false",
            "spark.eventLog.dir": events.as_uri(),
        },
    )
    try:
        code = child.wait(600)
    finally:
        child.kill()

    assert code == 0, child.output()[-4000:]
    assert _report(child)["batches"] == [1]
    assert list((tmp_path / "cwd").iterdir()) == []  # no ./spark-warehouse left where it ran
    log = _event_log(events)
    starts = [e for e in log if e["Event"] == "SparkListenerTaskStart"]
    ends = [e for e in log if e["Event"] == "SparkListenerTaskEnd"]
    assert any(e["Task Info"]["Speculative"] for e in starts), "no speculative copy ran"  # type: ignore[index]
    failed = [e for e in ends if e["Task End Reason"]["Reason"] == "ExceptionFailure"]  # type: ignore[index]
    assert any("TaskFaultInjected" in str(e["Task End Reason"]) for e in failed)
    # The failed and overtaken attempts left files in the table's directories, which no
    # commit names: readers see each line exactly once.
    on_disk = list(table.glob("topic=*/date=*/hour=*/*.parquet"))
    committed = spark.sql(f"DESCRIBE DETAIL delta.`{table}`").collect()[0]["numFiles"]  # type: ignore[attr-defined]
    assert len(on_disk) > committed
    assert_exactly_once(_table_lines(spark, table), expected)


def _lines_below(expected: list[str], loaded: dict[int, int]) -> list[str]:
    """The lines ``append_lines`` wrote at offsets below each partition's loaded offset."""
    pattern = re.compile(r" p(\d+) c(\d+) ")
    kept = []
    for line in expected:
        match = pattern.search(line)
        assert match is not None
        if int(match.group(2)) < loaded.get(int(match.group(1)), 0):
            kept.append(line)
    return kept


def _loaded_offsets(spark: object, table: Path, topic: str, topic_id: str) -> dict[int, int]:
    jvm = spark._jvm  # type: ignore[attr-defined]
    delta_log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(
        spark._jsparkSession,  # type: ignore[attr-defined]
        str(table),
    )
    txns = dict(
        jvm.scala.jdk.javaapi.CollectionConverters.asJava(
            delta_log.startTransaction().snapshot().transactions()
        )
    )
    return {
        p: int(txns[partition_app_id(topic, topic_id, p)])
        for p in range(4)
        if partition_app_id(topic, topic_id, p) in txns
    }


def test_worker_killed_mid_load_then_a_rerun_loads_each_line_exactly_once(
    cluster: StandaloneCluster, spark: object, tmp_path: Path
) -> None:
    data_dir, table = tmp_path / "data", tmp_path / "table"
    expected = append_lines(data_dir, "dc1.app", "kill", partitions=4, chunks=60)
    cluster.ensure_workers()
    victim = cluster.worker_hosts[-1]

    child = _submit(
        cluster,
        tmp_path,
        [
            "--data-dir",
            str(data_dir),
            "--warehouse",
            str(table),
            "--max-range-mb",
            "0.002",
            "--max-batch-mb",
            "0.006",
        ],
    )
    try:
        child.wait_for_output("logbroker load: batch 2:", timeout_s=400)
        cluster.kill_worker(victim)  # the worker JVM, its executor and its Python workers
        code = child.wait(400)
    finally:
        child.kill()
    cluster.ensure_workers()

    # Finished on the surviving worker, or failed whole: either way the table holds whole
    # batches, each line once, exactly the offsets its snapshot says are loaded.
    with open_store(data_dir, read_only=True) as store:
        topic_id = store.describe_topic("dc1.app").topic_id
    loaded = _loaded_offsets(spark, table, "dc1.app", topic_id)
    assert_exactly_once(_table_lines(spark, table), _lines_below(expected, loaded))
    assert loaded, "no batch was committed before the kill"
    if code == 0:
        assert loaded == {p: 60 for p in range(4)}, child.output()[-4000:]

    config = LoadConfig(SourceSpec(data_dir=str(data_dir)), table, max_range_bytes=4000)
    run_load(spark, config, lambda _line: None)  # type: ignore[arg-type]

    assert_exactly_once(_table_lines(spark, table), expected)


def test_load_with_a_spark_master_url_and_no_spark_submit_runs_logbroker_on_the_executors(
    spark: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``logbroker load --master spark://...`` straight from the installed command: the
    executors run the driver's interpreter, not whatever ``python3`` the workers' PATH finds
    (here the system's, without logbroker's packages, as on a node where the install is not
    on PATH)."""
    data_dir, table = tmp_path / "data", tmp_path / "table"
    expected = append_lines(data_dir, "dc1.app", "m", partitions=2, chunks=3)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    with StandaloneCluster(tmp_path / "spark", workers=1, cores=1, memory="1g") as bare:
        child = ChildProcess(
            [
                *("-m", "ops", "load", "--data-dir", str(data_dir), "--warehouse", str(table)),
                *("--master", bare.master_url, "--no-audit"),
            ],
            tmp_path / "load.log",
        )
        try:
            assert child.wait(300) == 0, child.output()[-3000:]
        finally:
            if child.proc.poll() is None:
                child.kill()
    assert f"loaded {len(expected)} lines" in child.output()
    assert_exactly_once(_table_lines(spark, table), expected)
