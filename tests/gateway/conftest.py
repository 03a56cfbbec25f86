"""Helpers of the gateway tests: a protocol client over httpx and a view of what the log holds."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

from audit.records import is_audit_topic
from ingest_api.framing import BINARY_MEDIA_TYPE, NDJSON_MEDIA_TYPE, encode_binary
from log_store import UnknownTopic, open_store
from session_dedup.envelope import Envelope, decode


def meta(source_id: str, log_type: str = "app", **extra: str) -> dict[str, str]:
    return {"log_type": log_type, "source_id": source_id, "server": "host1", "file": "/f", **extra}


def chunk_data(seqno: int) -> bytes:
    return f"line of seqno {seqno}\n".encode()


BIG_CHUNK = b"x" * 64 * 1024


def write_big(client: Any, source: str, first: int, count: int, log_type: str = "app") -> Any:
    """Write ``count`` chunks of 64 KiB of ``source`` from seqno ``first``: the response."""
    chunks = [(s, 0, BIG_CHUNK) for s in range(first, first + count)]
    return client.post_binary(encode_binary([(meta(source, log_type), chunks)]))


class Client:
    """The write protocol as a test speaks it."""

    def __init__(self, url: str, token: str | None = None, timeout_s: float = 30.0) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=url, headers=headers, timeout=timeout_s)

    def close(self) -> None:
        self.http.close()

    def session(self, source_id: str, log_type: str = "app") -> dict[str, Any]:
        response = self.http.post("/v1/sessions", json=meta(source_id, log_type))
        assert response.status_code == 200, response.text
        result: dict[str, Any] = response.json()
        return result

    def write(self, source_id: str, seqnos: Sequence[int], log_type: str = "app") -> httpx.Response:
        body = encode_binary([(meta(source_id, log_type), [(s, 0, chunk_data(s)) for s in seqnos])])
        return self.post_binary(body)

    def post_binary(self, body: bytes) -> httpx.Response:
        return self.http.post(
            "/v1/write", content=body, headers={"content-type": BINARY_MEDIA_TYPE}
        )

    def post_ndjson(self, body: bytes) -> httpx.Response:
        return self.http.post(
            "/v1/write", content=body, headers={"content-type": NDJSON_MEDIA_TYPE}
        )

    def acks(
        self, source_id: str, seqnos: Sequence[int], log_type: str = "app"
    ) -> list[dict[str, Any]]:
        response = self.write(source_id, seqnos, log_type)
        assert response.status_code == 200, response.text
        acks: list[dict[str, Any]] = response.json()["results"][0]["acks"]
        return acks


@pytest.fixture
def client_for() -> Iterator[Any]:
    clients: list[Client] = []

    def _make(url: str, token: str | None = None) -> Client:
        client = Client(url, token)
        clients.append(client)
        return client

    yield _make
    for client in clients:
        client.close()


def topic_envelopes(data_dir: Path, topic: str) -> dict[int, list[tuple[int, Envelope]]]:
    """Every record of ``topic`` as (offset, envelope), per partition; {} if no such topic."""
    store = open_store(data_dir)
    try:
        try:
            info = store.describe_topic(topic)
        except UnknownTopic:
            return {}
        result: dict[int, list[tuple[int, Envelope]]] = {}
        for p in info.partitions:
            records: list[tuple[int, Envelope]] = []
            offset = p.start_offset
            while offset < p.end_offset:
                read = store.read(topic, p.partition, offset)
                records.extend((r.offset, decode(r.value)) for r in read.records)
                offset = read.next_offset
            result[p.partition] = records
        return result
    finally:
        store.close()


def end_offsets(data_dir: Path) -> dict[tuple[str, int], int]:
    """The end offset of every partition of every topic: what "nothing written" compares."""
    store = open_store(data_dir)
    try:
        return {
            (t.name, p.partition): p.end_offset
            for t in store.list_topics()
            if not is_audit_topic(t.name)  # the gateway's own audit counts, written any time
            for p in store.describe_topic(t.name).partitions
        }
    finally:
        store.close()


def source_seqnos(data_dir: Path, topic: str, source_id: str) -> tuple[set[int], list[int]]:
    """The partitions holding ``source_id`` and its seqnos in log order."""
    partitions: set[int] = set()
    seqnos: list[int] = []
    for partition, records in topic_envelopes(data_dir, topic).items():
        for _, env in records:
            if env.source_id == source_id:
                partitions.add(partition)
                seqnos.append(env.seqno)
    return partitions, seqnos


@pytest.fixture(scope="module")
def shared_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One gateway for a module of tests that each check it wrote nothing (saves start-ups)."""
    from tests.conftest import GatewayProcess

    base = tmp_path_factory.mktemp("shared-gateway")
    gateway = GatewayProcess(base / "data", [], base / "gateway.log").start()
    yield gateway
    gateway.kill()
