"""Gateways on the session's Apache Kafka: each test in a namespace of its own.

``start_kafka_gateway()`` starts a real ``logbroker serve --store kafka`` process; every
gateway of one test shares the test's namespace, so they form one gateways' group.
``kafka_store`` opens the same namespace from the test itself (read_committed reads) to check
what the log holds.
"""

from __future__ import annotations

import collections
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from log_store import LogStore, UnknownTopic
from log_store.kafka import KafkaSettings, open_kafka_store
from session_dedup.chunk_codecs import decompress
from session_dedup.envelope import Envelope, decode
from tests.conftest import REPO, GatewayProcess, free_port

SESSION_TIMEOUT_MS = 3000


def gateway_config(
    path: Path,
    *,
    bootstrap: str,
    namespace: str,
    ownership: str,
    kafka: dict[str, Any] | None = None,
    top: str = "",
    tables: str = "",
    session_timeout_ms: int = SESSION_TIMEOUT_MS,
) -> Path:
    """``top``: more top-level settings; ``tables``: more TOML tables (``[tokens.x]``)."""
    extra = "".join(f"{k} = {v!r}\n" for k, v in (kafka or {}).items())
    timeout = "" if "operation_timeout_s" in (kafka or {}) else "operation_timeout_s = 10.0\n"
    path.write_text(
        f'store = "kafka"\n'
        f'kafka_bootstrap = "{bootstrap}"\n'
        f'kafka_namespace = "{namespace}"\n'
        f'kafka_ownership = "{ownership}"\n' + top + f"[kafka]\n"
        f"session_timeout_ms = {session_timeout_ms}\n"
        f"{timeout}" + extra + tables
    )
    return path


@pytest.fixture
def start_kafka_gateway(
    tmp_path: Path, kafka_cluster: Any, kafka_namespace: str
) -> Iterator[Callable[..., GatewayProcess]]:
    """Factory: ``start_kafka_gateway(*extra, ownership=, bootstrap=, kafka={...}, top=,
    tables=, session_timeout_ms=)``."""
    started: list[GatewayProcess] = []

    def _start(
        *extra: str,
        ownership: str = "group",
        bootstrap: str | None = None,
        kafka: dict[str, Any] | None = None,
        namespace: str | None = None,
        top: str = "",
        tables: str = "",
        session_timeout_ms: int = SESSION_TIMEOUT_MS,
    ) -> GatewayProcess:
        n = len(started)
        config = gateway_config(
            tmp_path / f"gateway-{n}.toml",
            bootstrap=bootstrap or kafka_cluster.bootstrap,
            namespace=namespace or kafka_namespace,
            ownership=ownership,
            kafka=kafka,
            top=top,
            tables=tables,
            session_timeout_ms=session_timeout_ms,
        )
        gateway = GatewayProcess(
            tmp_path / f"gw{n}-data",
            ["--config", str(config), *extra],
            tmp_path / f"gateway-{n}.log",
        )
        started.append(gateway)
        return gateway.start(timeout_s=60.0)

    yield _start
    for gateway in started:
        gateway.kill()


@pytest.fixture
def kafka_store(kafka_cluster: Any, kafka_namespace: str) -> Iterator[LogStore]:
    """The test's namespace, opened by the test (a test that only reads fences nobody)."""
    store = open_kafka_store(
        KafkaSettings(kafka_cluster.bootstrap, namespace=kafka_namespace, operation_timeout_s=20)
    )
    yield store
    store.close()


def envelopes(store: LogStore, topic: str) -> dict[int, list[tuple[int, Envelope]]]:
    """Every committed record of ``topic`` as (offset, envelope), per partition."""
    try:
        info = store.describe_topic(topic)
    except UnknownTopic:
        return {}
    found: dict[int, list[tuple[int, Envelope]]] = {}
    for part in info.partitions:
        records: list[tuple[int, Envelope]] = []
        offset = part.start_offset
        while offset < part.end_offset:
            result = store.read(topic, part.partition, offset, 8 * 1024 * 1024)
            records.extend((r.offset, decode(r.value)) for r in result.records)
            if result.next_offset <= offset:
                break
            offset = result.next_offset
        found[part.partition] = records
    return found


def source_seqnos(store: LogStore, topic: str) -> dict[str, tuple[set[int], list[int]]]:
    """Per source: the partitions holding it and its seqnos in log order."""
    per_source: dict[str, tuple[set[int], list[int]]] = {}
    for partition, records in envelopes(store, topic).items():
        for _offset, env in records:
            parts, seqnos = per_source.setdefault(env.source_id, (set(), []))
            parts.add(partition)
            seqnos.append(env.seqno)
    return per_source


def delivered_lines(store: LogStore, topic: str) -> collections.Counter[str]:
    """How often each line (its first word) is in the log."""
    counts: collections.Counter[str] = collections.Counter()
    for records in envelopes(store, topic).values():
        for _offset, env in records:
            for line in decompress(env.codec, env.data).splitlines():
                if line and not line.startswith(b"#"):
                    counts[line.split(b" ", 1)[0].decode()] += 1
    return counts


def wait_until(check: Callable[[], Any], timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def metric(url: str, name: str, token: str | None = None) -> float | None:
    """A sample of the gateway's Prometheus metric ``name`` (without labels), or None;
    ``token``: one with ``metrics = true`` (or admin), for a gateway with tokens."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    response = httpx.get(url + "/metrics", headers=headers, timeout=10)
    response.raise_for_status()
    text = response.text
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def serve_patched(
    script: str, tmp_path: Path, kafka_cluster: Any, kafka_namespace: str
) -> subprocess.CompletedProcess[str]:
    """``logbroker serve`` on the session's Kafka run by ``script`` (``python -c``), which
    patches what the test needs and then calls the CLI's ``main``; the finished process."""
    config = gateway_config(
        tmp_path / "gw.toml",
        bootstrap=kafka_cluster.bootstrap,
        namespace=kafka_namespace,
        ownership="group",
    )
    return subprocess.run(
        [
            *(sys.executable, "-c", script, "serve", "--data-dir", str(tmp_path / "d")),
            *("--port", str(free_port()), "--config", str(config)),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
