"""A real local Spark session (with Delta Lake) and a real embedded store for the loader's tests."""

from __future__ import annotations

import collections
import contextlib
import gzip
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest
import zstandard

from log_store import open_store
from log_store.interface import LogStore, TopicConfig
from session_dedup.envelope import Envelope, encode
from tests.conftest import GatewayProcess
from tests.kafka.conftest import gateway_config

REPO = Path(__file__).resolve().parents[2]
PUBLISHED_GLOB = "topic=*/date=*/hour=*/*.parquet"


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    """One local[2] session per test session (per xdist worker): starting a JVM costs seconds."""
    from yt_loader.spark_session import build_session

    session = build_session("local[2]", app_name="logbroker tests")
    session.conf.set("spark.sql.shuffle.partitions", "2")
    yield session
    session.stop()
    _stop_jvm()


def _stop_jvm() -> None:
    """End the JVM PySpark started for this process (``stop()`` keeps it for a next session).

    It exits when its stdin closes; its Python workers follow when it is gone.
    """
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    if gateway is None:
        return
    gateway.shutdown()
    jvm_process = gateway.proc
    jvm_process.stdin.close()
    try:
        jvm_process.wait(60)
    except subprocess.TimeoutExpired:
        jvm_process.kill()
        jvm_process.wait(10)
    SparkContext._gateway = None
    SparkContext._jvm = None


def table_lines(spark: object, table: Path, version: int | None = None) -> list[str]:
    """Every line of the Delta table at ``table``, read with Spark SQL as a user would."""
    if not (table / "_delta_log").is_dir():
        return []
    as_of = f" VERSION AS OF {version}" if version is not None else ""
    rows = spark.sql(f"SELECT line FROM delta.`{table}`{as_of}").collect()  # type: ignore[attr-defined]
    return [str(r["line"]) for r in rows]


def table_version(spark: object, table: Path) -> int:
    """The Delta table's current version."""
    rows = spark.sql(f"DESCRIBE HISTORY delta.`{table}` LIMIT 1").collect()  # type: ignore[attr-defined]
    return int(rows[0]["version"])


def compress(codec: str, data: bytes) -> bytes:
    if codec == "gzip":
        return gzip.compress(data)
    if codec == "zstd":
        return zstandard.ZstdCompressor().compress(data)
    return data


def append_lines(
    where: Path | LogStore,
    topic: str,
    tag: str,
    *,
    partitions: int = 3,
    chunks: int = 20,
    lines_per_chunk: int = 3,
    codec: str = "raw",
    config: TopicConfig | None = None,
    write_time_ms: int | None = None,
) -> list[str]:
    """Append ``chunks`` chunks to every partition of ``topic`` (one append, so one Kafka
    transaction, per partition) in the embedded store at ``where`` or the store ``where``;
    returns the lines written.

    Lines are unique (they carry ``tag``), so a reader can check each appears exactly once.
    """
    now = write_time_ms if write_time_ms is not None else int(time.time() * 1000)
    written: list[str] = []
    store = open_store(where) if isinstance(where, Path) else where
    try:
        store.create_topic(topic, config or TopicConfig(partitions=partitions), exist_ok=True)
        for p in range(partitions):
            values = []
            end = store.end_offset(topic, p)
            for i in range(chunks):
                lines = [f"{tag} {topic} p{p} c{i} l{j}" for j in range(lines_per_chunk)]
                written.extend(lines)
                data = "".join(line + "\n" for line in lines).encode()
                values.append(
                    encode(
                        Envelope(
                            source_id=f"host{p}:/var/log/{topic}.log",
                            server=f"host{p}",
                            file=f"/var/log/{topic}.log",
                            log_type=topic.split(".", 1)[-1],
                            codec=codec,
                            seqno=end + i + 1,
                            create_time=now - 5,
                            # Spread rows over three hours so a range writes several files.
                            write_time=now - (i % 3) * 3_600_000,
                            data=compress(codec, data),
                        )
                    )
                )
            store.append(topic, p, values)
    finally:
        if store is not where:
            store.close()
    return written


def published_lines(warehouse: Path) -> list[str]:
    """Every line DuckDB reads from the warehouse's tables with the documented glob query."""
    if not any(warehouse.glob(PUBLISHED_GLOB)):
        return []  # DuckDB refuses a glob that matches nothing
    query = (
        f"SELECT line FROM read_parquet('{warehouse}/{PUBLISHED_GLOB}', hive_partitioning = true)"
    )
    return [str(row[0]) for row in duckdb.sql(query).fetchall()]


def assert_exactly_once(found: list[str], expected: list[str]) -> None:
    counts = collections.Counter(found)
    duplicated = {line: n for line, n in counts.items() if n > 1}
    missing = set(expected) - set(counts)
    extra = set(counts) - set(expected)
    assert not duplicated, f"{len(duplicated)} lines more than once, e.g. {list(duplicated)[:3]}"
    assert not missing, f"{len(missing)} lines missing, e.g. {sorted(missing)[:3]}"
    assert not extra, f"{len(extra)} unexpected lines, e.g. {sorted(extra)[:3]}"


class ChildProcess:
    """A child (Python, or ``program``) in its own process group, so that SIGKILL reaches its
    JVM and Python workers too."""

    def __init__(
        self,
        args: list[str],
        log_path: Path,
        env: dict[str, str] | None = None,
        program: str = sys.executable,
        cwd: Path = REPO,
    ):
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 - kept open for the child's lifetime
        self.proc = subprocess.Popen(
            [program, *args],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for_output(self, text: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if text in self.output():
                return
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"child exited {self.proc.returncode}: {self.output()[-3000:]}"
                )
            time.sleep(0.1)
        raise AssertionError(f"no {text!r} within {timeout_s} s: {self.output()[-3000:]}")

    def kill(self) -> None:
        """SIGKILL the whole group: the driver, its JVM and the Python workers."""
        with contextlib.suppress(ProcessLookupError):  # the group is already gone
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)
        self._log.close()

    def wait(self, timeout_s: float) -> int:
        code = self.proc.wait(timeout_s)
        self._log.close()
        return code


@pytest.fixture
def kafka_gateway(
    tmp_path: Path, kafka_cluster: Any, kafka_namespace: str
) -> Iterator[GatewayProcess]:
    """A gateway on the session's Kafka broker, in the test's namespace, owning partitions as
    a member of the gateways' group."""
    config = gateway_config(
        tmp_path / "gateway.toml",
        bootstrap=kafka_cluster.bootstrap,
        namespace=kafka_namespace,
        ownership="group",
    )
    gateway = GatewayProcess(tmp_path / "gw-data", ["--config", str(config)], tmp_path / "gw.log")
    gateway.start(timeout_s=60.0)
    yield gateway
    gateway.kill()
