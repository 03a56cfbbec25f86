"""A topic deleted (and created again) on Kafka after a load planned its batch, before the
batch's tasks read it: read from Kafka directly (``kafka_bootstrap``), and through a
Kafka-backed gateway's pull API (``server``).

As on the embedded store (``test_topic_deleted_mid_load``): the run names what is lost (``DATA
LOST``, from the offsets it had loaded), commits the batch's other topics and exits 3; a topic
made again under the name is not read at the offsets planned in the old one, and the next run
loads it from its start, once.  Offsets on Kafka are not dense (each commit's marker takes
one), so the offsets named are those the log says.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from log_store import LogStore
from log_store.kafka import KafkaSettings, open_kafka_store
from ops.commands.load import EXIT_DATA_LOST, exit_code
from tests.conftest import GatewayProcess
from tests.yt_loader.conftest import append_lines, assert_exactly_once, table_lines
from yt_loader import load_job
from yt_loader.load_job import LoadConfig, run_load
from yt_loader.log_source import SourceSpec

pytestmark = [pytest.mark.spark, pytest.mark.kafka]


@pytest.fixture
def kafka_log(kafka_cluster: Any, kafka_namespace: str) -> Iterator[LogStore]:
    store = open_kafka_store(KafkaSettings(kafka_cluster.bootstrap, namespace=kafka_namespace))
    yield store
    store.close()


@pytest.mark.parametrize("created_again", [False, True])
def test_on_kafka_a_topic_deleted_mid_load_is_named_lost_and_a_new_one_loaded_from_its_start(
    spark: object,
    tmp_path: Path,
    kafka_cluster: Any,
    kafka_namespace: str,
    kafka_log: LogStore,
    monkeypatch: pytest.MonkeyPatch,
    created_again: bool,
) -> None:
    spec = SourceSpec(kafka_bootstrap=kafka_cluster.bootstrap, kafka_namespace=kafka_namespace)
    _check_deleted_mid_load(spark, spec, kafka_log, tmp_path, monkeypatch, created_again)


def test_through_a_kafka_backed_gateway_a_topic_created_again_mid_load_is_not_read_twice(
    spark: object,
    tmp_path: Path,
    kafka_gateway: GatewayProcess,
    kafka_log: LogStore,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The gateway answers 404 for the deleted topic, or the new topic's records at the old
    offsets; the task's look at the topic afterwards tells."""
    spec = SourceSpec(server=kafka_gateway.url)
    _check_deleted_mid_load(spark, spec, kafka_log, tmp_path, monkeypatch, True)


def _check_deleted_mid_load(
    spark: object,
    spec: SourceSpec,
    kafka_log: LogStore,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    created_again: bool,
) -> None:
    table = tmp_path / "table"

    def load(progress: list[str]) -> Any:
        config = LoadConfig(spec, table, topics="dc1.*", max_range_bytes=4000)
        return run_load(spark, config, progress.append)  # type: ignore[arg-type]

    kept = append_lines(kafka_log, "dc1.app", "a", partitions=1, chunks=4)
    loaded = append_lines(kafka_log, "dc1.gone", "a", partitions=2, chunks=5)
    assert exit_code(load([])) == 0
    loaded_to = [kafka_log.end_offset("dc1.gone", p) for p in (0, 1)]
    kept += append_lines(kafka_log, "dc1.app", "b", partitions=1, chunks=4)
    append_lines(kafka_log, "dc1.gone", "b", partitions=2, chunks=5)  # planned, never loaded
    new: list[str] = []
    deleted: list[str] = []
    run_tasks = load_job._run_tasks

    def deleted_first(*args: Any, **kwargs: Any) -> Any:
        if not deleted:
            deleted.append(kafka_log.describe_topic("dc1.gone").topic_id)
            kafka_log.delete_topic("dc1.gone")
            if created_again:
                # more than the planned offsets of each partition: read by name, they would
                # give the new topic's lines as if they were the old one's
                new.extend(append_lines(kafka_log, "dc1.gone", "new", partitions=2, chunks=14))
        return run_tasks(*args, **kwargs)

    monkeypatch.setattr(load_job, "_run_tasks", deleted_first)
    progress: list[str] = []
    report = load(progress)

    assert deleted, "the batch never ran"
    how = "deleted and created again" if created_again else "deleted"
    assert [line for line in progress if line.startswith("DATA LOST")] == [
        f"DATA LOST: dc1.gone partition {p}: the topic was {how} while batch 2 read it; "
        f"loaded up to offset {loaded_to[p]}, whatever it held from offset {loaded_to[p]} on "
        "was never loaded"
        for p in (0, 1)
    ], progress
    assert exit_code(report) == EXIT_DATA_LOST
    assert_exactly_once(table_lines(spark, table), kept + loaded)

    monkeypatch.undo()
    again: list[str] = []
    later = load(again)
    assert not [line for line in again if "DATA LOST" in line], again
    assert exit_code(later) == 0
    # a topic made again under the name is a new topic: loaded from its start, once
    assert_exactly_once(table_lines(spark, table), kept + loaded + new)
