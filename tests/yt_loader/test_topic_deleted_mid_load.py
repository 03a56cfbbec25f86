"""A topic deleted (and maybe created again) after a load planned its batch, before the batch's
tasks read it.

The run names what is lost (``DATA LOST``, from the offsets it had loaded), records the topic
as deleted, commits the batch's other topics and exits 3 (``EXIT_DATA_LOST``); nothing is loaded
twice: a topic created again under the name is not read at the offsets planned in the old one,
and the next run loads it from its start.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from log_store import open_store
from ops.commands.load import EXIT_DATA_LOST, exit_code
from tests.yt_loader.conftest import append_lines, assert_exactly_once, table_lines
from yt_loader import load_job
from yt_loader.load_job import LoadConfig, run_load
from yt_loader.log_source import SourceSpec

pytestmark = [pytest.mark.spark]


def _load(spark: object, spec: SourceSpec, table: Path, progress: list[str]) -> Any:
    config = LoadConfig(spec, table, topics="dc1.*", max_range_bytes=4000)
    return run_load(spark, config, progress.append)  # type: ignore[arg-type]


def _delete_before_the_tasks(
    monkeypatch: pytest.MonkeyPatch, data_dir: Path, then: Any = None
) -> list[str]:
    """Delete dc1.gone once the batch is planned, right before its tasks start."""
    run_tasks = load_job._run_tasks
    deleted: list[str] = []

    def deleted_first(*args: Any, **kwargs: Any) -> Any:
        if not deleted:
            with open_store(data_dir) as store:
                deleted.append(store.describe_topic("dc1.gone").topic_id)
                store.delete_topic("dc1.gone")
            if then is not None:
                then()
        return run_tasks(*args, **kwargs)

    monkeypatch.setattr(load_job, "_run_tasks", deleted_first)
    return deleted


@pytest.mark.parametrize("created_again", [False, True])
def test_a_topic_deleted_between_the_plan_and_the_read_is_named_lost_and_nothing_loads_twice(
    spark: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, created_again: bool
) -> None:
    data_dir = tmp_path / "data"
    _check_deleted_mid_load(
        spark, SourceSpec(data_dir=str(data_dir)), data_dir, tmp_path, monkeypatch, created_again
    )


def test_through_a_gateway_a_topic_created_again_mid_load_is_not_read_at_the_old_offsets(
    spark: object, gateway: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same through ``--server``: the gateway answers 404 for the deleted topic, or the
    new topic's records at the old offsets; the task's look at the topic afterwards tells."""
    spec = SourceSpec(server=gateway.url)
    _check_deleted_mid_load(spark, spec, gateway.data_dir, tmp_path, monkeypatch, True)


def _check_deleted_mid_load(
    spark: object,
    spec: SourceSpec,
    data_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    created_again: bool,
) -> None:
    table = tmp_path / "table"
    kept = append_lines(data_dir, "dc1.app", "a", partitions=1, chunks=4)
    loaded = append_lines(data_dir, "dc1.gone", "a", partitions=2, chunks=5)
    assert exit_code(_load(spark, spec, table, [])) == 0
    kept += append_lines(data_dir, "dc1.app", "b", partitions=1, chunks=4)
    append_lines(data_dir, "dc1.gone", "b", partitions=2, chunks=5)  # planned, never loaded
    new: list[str] = []

    def create_again() -> None:
        # more than the planned offsets 5..10 of each partition: read by name, they would
        # give the new topic's lines as if they were the old one's
        new.extend(append_lines(data_dir, "dc1.gone", "new", partitions=2, chunks=12))

    deleted = _delete_before_the_tasks(
        monkeypatch, data_dir, create_again if created_again else None
    )
    progress: list[str] = []
    report = _load(spark, spec, table, progress)

    assert deleted, "the batch never ran"
    how = "deleted and created again" if created_again else "deleted"
    assert [line for line in progress if line.startswith("DATA LOST")] == [
        f"DATA LOST: dc1.gone partition {p}: the topic was {how} while batch 2 read it; "
        "loaded up to offset 5, whatever it held from offset 5 on was never loaded"
        for p in (0, 1)
    ], progress
    assert exit_code(report) == EXIT_DATA_LOST
    assert_exactly_once(table_lines(spark, table), kept + loaded)

    monkeypatch.undo()
    again: list[str] = []
    later = _load(spark, spec, table, again)
    assert not [line for line in again if "DATA LOST" in line], again
    assert exit_code(later) == 0
    # a topic made again under the name is a new topic: loaded from its start, once
    assert_exactly_once(table_lines(spark, table), kept + loaded + new)
