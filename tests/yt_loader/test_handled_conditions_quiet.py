"""A condition the loader handles and reports in a line (a topic deleted while a batch read
it: ``DATA LOST``) is returned by the task, not raised: Spark records no failed task for it,
so it logs no ``ERROR Executor: Exception in task`` with two stack traces before the report.

Anything else a task raises still fails it in Spark (``test_load``'s tests of a message that
does not decompress without ``--skip-corrupt`` and the speculation test keep that).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from log_store import open_store
from ops.commands.load import EXIT_DATA_LOST, exit_code
from tests.yt_loader.conftest import append_lines, assert_exactly_once, published_lines
from yt_loader import load_job
from yt_loader.load_job import LoadConfig, run_load
from yt_loader.log_source import SourceSpec

pytestmark = [pytest.mark.spark]


def _failed_tasks(spark: Any, jobs: set[int]) -> int:
    """Failed task attempts in the stages of ``jobs``, as Spark's status tracker has them."""
    tracker = spark.sparkContext.statusTracker()
    failed = 0
    for job in jobs:
        info = tracker.getJobInfo(job)
        assert info is not None, f"Spark forgot job {job}"
        for stage in info.stageIds:
            stage_info = tracker.getStageInfo(stage)
            failed += stage_info.numFailedTasks if stage_info is not None else 0
    return failed


def test_a_topic_deleted_while_a_batch_reads_it_fails_no_spark_task(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data_dir = tmp_path / "data"
    spec = SourceSpec(data_dir=str(data_dir))
    warehouse = tmp_path / "warehouse"  # Parquet: the quicker commit, the same tasks
    config = LoadConfig(
        spec, warehouse, topics="dc1.*", max_range_bytes=4000, table_format="parquet"
    )
    kept = append_lines(data_dir, "dc1.app", "a", partitions=1, chunks=4)
    append_lines(data_dir, "dc1.gone", "a", partitions=1, chunks=4)

    run_tasks = load_job._run_tasks
    task_failure = load_job._task_failure
    deleted: list[bool] = []
    raised_in_spark: list[Exception] = []

    def deleted_first(*args: Any, **kwargs: Any) -> Any:
        if not deleted:  # once the batch is planned, right before its tasks start
            deleted.append(True)
            with open_store(data_dir) as store:
                store.delete_topic("dc1.gone")
        return run_tasks(*args, **kwargs)

    def recorded(batch: int, exc: Exception) -> Any:
        raised_in_spark.append(exc)
        return task_failure(batch, exc)

    monkeypatch.setattr(load_job, "_run_tasks", deleted_first)
    monkeypatch.setattr(load_job, "_task_failure", recorded)
    tracker = spark.sparkContext.statusTracker()
    before = set(tracker.getJobIdsForGroup())
    progress: list[str] = []
    report = run_load(spark, config, progress.append)
    jobs = set(tracker.getJobIdsForGroup()) - before

    assert exit_code(report) == EXIT_DATA_LOST
    assert [line for line in progress if line.startswith("DATA LOST")] == [
        "DATA LOST: dc1.gone partition 0: the topic was deleted while batch 1 read it; "
        "loaded up to offset 0, whatever it held from offset 0 on was never loaded"
    ], progress
    assert_exactly_once(published_lines(warehouse), kept)
    assert not raised_in_spark, f"a task raised in Spark: {str(raised_in_spark[0])[:500]}"
    assert jobs and _failed_tasks(spark, jobs) == 0
