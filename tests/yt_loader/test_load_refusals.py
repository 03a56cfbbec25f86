"""``logbroker load`` says in one line what it cannot do, before Spark starts where it can: a
Kafka cluster no broker of which answers, a table path inside a Delta table, topic globs that
match no topic of the log, gateways of two installations."""

from __future__ import annotations

import argparse
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from log_store import open_store
from ops.commands import load
from tests.conftest import GatewayProcess, free_port
from tests.yt_loader.conftest import ChildProcess, append_lines
from yt_loader import spark_session
from yt_loader.errors import WarehouseCorrupt
from yt_loader.warehouse import CommitRecord, Warehouse

pytestmark = [pytest.mark.spark]


def _load_cli(tmp_path: Path, *flags: str) -> tuple[int, str, float]:
    """Run ``logbroker load FLAGS`` in a child: its exit code, output and seconds taken."""
    started = time.monotonic()
    child = ChildProcess(["-m", "ops", "load", *flags], tmp_path / "load.log")
    try:
        code = child.wait(60)
    except subprocess.TimeoutExpired:
        child.kill()
        raise
    return code, child.output(), time.monotonic() - started


def _files(root: Path) -> list[Path]:
    return sorted(p.relative_to(root) for p in root.rglob("*") if p.name != "load.log")


def test_a_kafka_cluster_no_broker_answers_is_one_line_and_exit_2_within_seconds(
    tmp_path: Path,
) -> None:
    bootstrap = f"127.0.0.1:{free_port()}"  # nothing listens: every connection is refused
    code, output, took = _load_cli(
        tmp_path, "--kafka-bootstrap", bootstrap, "--warehouse", str(tmp_path / "wh")
    )
    assert code == 2, output
    assert "%3|" not in output  # librdkafka's own lines went to the Python logger
    [line] = output.splitlines()
    assert line.startswith(f"logbroker load: cannot reach Kafka at {bootstrap}: "), line
    assert "Connection refused (no broker answered within 5 s)" in line
    assert took < 10, f"{took:.1f} s"  # 5 s of waiting for a broker, and the start-up
    assert not (tmp_path / "wh").exists()


@pytest.mark.parametrize("table_format", ["delta", "parquet"])
def test_a_warehouse_inside_a_delta_table_is_refused_naming_the_tables_root(
    tmp_path: Path, table_format: str
) -> None:
    data_dir = tmp_path / "data"
    append_lines(data_dir, "dc1.app", "a", partitions=1, chunks=1)
    table = tmp_path / "table"
    (table / "_delta_log").mkdir(parents=True)
    partition = table / "topic=dc1.app"
    partition.mkdir()
    before = _files(tmp_path)
    code, output, _ = _load_cli(
        tmp_path, "--data-dir", str(data_dir), "--warehouse", str(partition),
        "--table-format", table_format,
    )  # fmt: skip
    assert code == 2, output
    assert output.splitlines() == [
        f"logbroker load: {partition} is inside the Delta table {table}; give the table's root"
    ]
    assert _files(tmp_path) == before


def test_a_path_with_no_delta_table_is_named_when_its_schema_is_asked_for(
    spark: object, tmp_path: Path
) -> None:
    from yt_loader.delta_table import DeltaTarget

    partition = tmp_path / "table" / "topic=dc1.app"
    partition.mkdir(parents=True)
    # Delta gives a log without a table a metadata with no schema (it was a KeyError)
    with pytest.raises(WarehouseCorrupt, match="is not a Delta table: its log has no schema"):
        DeltaTarget(spark, partition).evolve_schema({})  # type: ignore[arg-type]


def test_topics_matching_no_topic_exit_2_naming_the_topics_there_and_create_no_table(
    tmp_path: Path,
) -> None:
    data_dir = tmp_path / "data"
    for topic in ("dc1.app", "dc1.web"):
        append_lines(data_dir, topic, "a", partitions=1, chunks=1)
    code, output, took = _load_cli(
        tmp_path, "--data-dir", str(data_dir), "--warehouse", str(tmp_path / "wh"),
        "--topics", "nosuch.*",
    )  # fmt: skip
    assert code == 2, output
    assert output.splitlines() == [
        f"logbroker load: no topic of store {data_dir} matches --topics 'nosuch.*' (topics "
        "there: dc1.app, dc1.web; a topic is created by its first write: one not written to "
        "yet is not there); nothing loaded, no table created"
    ]
    assert not (tmp_path / "wh").exists()
    assert took < 20, f"{took:.1f} s"  # said before Spark starts (a load took 95 s)


def test_a_log_with_no_topic_yet_is_said_to_have_none(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    open_store(data_dir).close()  # a gateway's store before its first write
    code, output, _ = _load_cli(
        tmp_path, "--data-dir", str(data_dir), "--warehouse", str(tmp_path / "wh")
    )
    assert code == 2, output
    assert f"no topic of store {data_dir} matches --topics '*' (it has none; " in output
    assert not (tmp_path / "wh").exists()


def test_topics_matching_no_topic_of_an_existing_table_exit_2_and_commit_nothing(
    spark: object,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    data_dir, warehouse = tmp_path / "data", tmp_path / "warehouse"
    append_lines(data_dir, "dc1.app", "a", partitions=1, chunks=1)
    # A table that exists could hold offsets of a matching topic deleted since, so the load
    # runs; a Parquet one, since making a Delta table takes Spark 10 s or more here.
    (warehouse / "_loader" / "commits").mkdir(parents=True)
    Warehouse(warehouse).commit(CommitRecord(1, 0, offsets={}, ranges=[], gaps=[]))
    # the run goes through Spark: this test session's, not one of its own
    monkeypatch.setattr(spark_session, "build_session", lambda *args, **kwargs: spark)
    monkeypatch.setattr(spark, "stop", lambda: None)
    parser = argparse.ArgumentParser()
    load.add_arguments(parser)
    args = parser.parse_args(
        ["--data-dir", str(data_dir), "--warehouse", str(warehouse), "--topics", "dc1.ap",
         "--table-format", "parquet", "--no-audit"]
    )  # fmt: skip
    assert load.run(args) == 2
    err = capsys.readouterr().err
    assert (
        f"logbroker load: no topic of store {data_dir} matches --topics 'dc1.ap' (topics there: "
        "dc1.app; " in err
    ), err
    assert err.rstrip().endswith("; nothing loaded"), err
    assert [r.batch for r in Warehouse(warehouse).commits()] == [1]


def test_a_gateway_of_another_installation_in_server_is_refused_before_spark_starts(
    tmp_path: Path, start_gateway: Callable[..., GatewayProcess]
) -> None:
    """``--server A,B`` with B of another installation: exit 2 naming both, at once (before,
    the load went on through A and B was found only if A failed in a task, exit 1)."""
    first = start_gateway(tmp_path / "dc1")
    other = start_gateway(tmp_path / "dc2")  # another data dir: another installation
    append_lines(first.data_dir, "dc1.app", "a", partitions=1, chunks=1)
    code, output, took = _load_cli(
        tmp_path, "--server", f"{first.url},{other.url}", "--warehouse", str(tmp_path / "wh")
    )
    _refused_at_once(code, output, took, first, other, "one installation", tmp_path / "wh")


def test_audit_servers_of_two_installations_are_refused_before_spark_starts(
    tmp_path: Path, start_gateway: Callable[..., GatewayProcess]
) -> None:
    """``--audit-server A,B`` with B of another installation: exit 2 naming both, at once
    (before, the load ran, and the counts went to B's audit whenever A failed)."""
    first = start_gateway(tmp_path / "dc1")
    other = start_gateway(tmp_path / "dc2")  # another data dir: another installation
    data_dir = tmp_path / "data"
    append_lines(data_dir, "dc1.app", "a", partitions=1, chunks=1)
    code, output, took = _load_cli(
        tmp_path, "--data-dir", str(data_dir), "--warehouse", str(tmp_path / "wh"),
        "--audit-server", f"{first.url},{other.url}",
    )  # fmt: skip
    _refused_at_once(
        code, output, took, first, other, "another installation's audit", tmp_path / "wh"
    )


def _refused_at_once(
    code: int,
    output: str,
    took: float,
    first: GatewayProcess,
    other: GatewayProcess,
    why: str,
    warehouse: Path,
) -> None:
    """The load refused ``other`` (of another installation than ``first``) in one line with
    exit 2, saying ``why``, within seconds, with nothing written to ``warehouse``."""
    assert code == 2, output
    [line] = output.splitlines()
    assert line.startswith(f"logbroker load: {other.url} belongs to installation "), line
    assert f"{first.url} to " in line and why in line, line
    assert not warehouse.exists()
    assert took < 20, f"{took:.1f} s"
