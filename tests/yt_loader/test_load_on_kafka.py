"""The loader and the Spark data source on a Kafka-backed log (Apache Kafka, real Spark).

Read two ways: directly from Kafka (``kafka_bootstrap``: read_committed consumers in every
task) and through a Kafka-backed gateway's pull API (``server``).  Either way each line is
in the Delta table once, a rerun with nothing new commits nothing, and a rerun after more
writes adds exactly those.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from ingest_api.framing import BINARY_MEDIA_TYPE, encode_binary
from tests.conftest import GatewayProcess, logbroker_cmd
from tests.yt_loader.conftest import ChildProcess, assert_exactly_once, table_lines, table_version
from yt_loader.load_job import LoadConfig, run_load
from yt_loader.log_source import SourceSpec

pytestmark = [pytest.mark.spark, pytest.mark.kafka, pytest.mark.slow]

SOURCES = 6


def _write(url: str, tag: str, first_seqno: int, chunks: int = 5) -> list[str]:
    """``chunks`` chunks of 3 lines from each of :data:`SOURCES` sources, each sent twice (the
    second time answered ``duplicate``); returns the lines written."""
    written: list[str] = []
    sections = []
    for s in range(SOURCES):
        meta = {"log_type": "app", "source_id": f"host{s}:/var/log/app.log", "server": f"host{s}"}
        items = []
        for seqno in range(first_seqno, first_seqno + chunks):
            lines = [f"{tag} src{s} seq{seqno} l{j}" for j in range(3)]
            written.extend(lines)
            items.append((seqno, 0, "".join(line + "\n" for line in lines).encode()))
        sections.append((meta, items))
    body = encode_binary(sections)
    with httpx.Client(base_url=url, timeout=60) as client:
        for attempt in ("write", "resend"):
            response = client.post(
                "/v1/write", content=body, headers={"content-type": BINARY_MEDIA_TYPE}
            )
            assert response.status_code == 200, response.text
            statuses = {a["status"] for r in response.json()["results"] for a in r["acks"]}
            assert statuses == ({"written"} if attempt == "write" else {"duplicate"}), statuses
    return written


def _loader(spark: object, spec: SourceSpec, table: Path) -> Callable[[], Any]:
    config = LoadConfig(spec, table, max_range_bytes=4000)
    return lambda: run_load(spark, config, lambda _line: None)  # type: ignore[arg-type]


def test_load_reading_kafka_directly_is_exactly_once_across_reruns(
    spark: object,
    tmp_path: Path,
    kafka_cluster: Any,
    kafka_namespace: str,
    kafka_gateway: GatewayProcess,
) -> None:
    table = tmp_path / "table"
    spec = SourceSpec(kafka_bootstrap=kafka_cluster.bootstrap, kafka_namespace=kafka_namespace)
    load = _loader(spark, spec, table)
    first = _write(kafka_gateway.url, "a", 1)

    report = load()

    assert report.lines == len(first)
    assert_exactly_once(table_lines(spark, table), first)
    version = table_version(spark, table)

    assert load().lines == 0  # nothing new: nothing committed
    assert table_version(spark, table) == version

    second = _write(kafka_gateway.url, "b", 6)
    assert load().lines == len(second)
    assert_exactly_once(table_lines(spark, table), first + second)

    # the Spark data source reads the same log the same way
    frame = (
        spark.read.format("logbroker")  # type: ignore[attr-defined]
        .option("kafka_bootstrap", kafka_cluster.bootstrap)
        .option("kafka_namespace", kafka_namespace)
        .option("topics", "dc1.*")
        .load()
    )
    assert_exactly_once([str(r["line"]) for r in frame.select("line").collect()], first + second)

    # reading never fenced the gateway's writers: it still writes
    assert _write(kafka_gateway.url, "c", 11, chunks=1)


def test_load_through_a_kafka_backed_gateway_is_exactly_once_across_reruns(
    spark: object, tmp_path: Path, kafka_gateway: GatewayProcess
) -> None:
    table = tmp_path / "table"
    load = _loader(spark, SourceSpec(server=kafka_gateway.url), table)
    first = _write(kafka_gateway.url, "a", 1)

    assert load().lines == len(first)
    second = _write(kafka_gateway.url, "b", 6)
    assert load().lines == len(second)  # the rerun reads only what came after the first
    assert_exactly_once(table_lines(spark, table), first + second)


def test_load_command_takes_kafka_options_and_refuses_a_bad_combination(
    tmp_path: Path, kafka_cluster: Any
) -> None:
    def load(*args: str) -> ChildProcess:
        command = logbroker_cmd("load", "--warehouse", str(tmp_path / "table"), *args)
        return ChildProcess(command[1:], tmp_path / f"load-{len(args)}.log")

    reserved = load(
        "--kafka-bootstrap",
        kafka_cluster.bootstrap,
        "--kafka-property",
        "isolation.level=read_uncommitted",
    )
    assert reserved.wait(120) == 2
    assert "isolation.level" in reserved.output()
    mixed = load("--data-dir", str(tmp_path), "--kafka-namespace", "ns.")
    assert mixed.wait(120) == 2
    assert "go with --kafka-bootstrap" in mixed.output()
    assert not (tmp_path / "table").exists()
