"""The legacy Archive API behind a load balancer with no stickiness: an old client's
``/store`` reaches one gateway on Kafka, its ``/commit_request`` and ``/commit`` another."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from log_store import LogStore
from tests.conftest import GatewayProcess
from tests.gateway.conftest import Client
from tests.kafka.conftest import envelopes, wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.fault]


def _owners(url: str) -> set[str]:
    answer = httpx.get(f"{url}/v1/topics/dc1.app/owners", timeout=30)
    if answer.status_code != 200:
        return set()
    return {p["owner"] for p in answer.json()["partitions"]}


def _store(url: str, data: bytes) -> str:
    stored = httpx.post(
        f"{url}/store",
        params={"log_type": "app", "server": "old1", "file": "/a"},
        content=data,
        timeout=60,
    )
    assert stored.status_code == 200, stored.text
    return str(stored.json()["store_id"])


def _post(url: str, path: str, **params: str) -> httpx.Response:
    return httpx.post(f"{url}{path}", params=params, timeout=60)


def _until_not_503(call: Callable[[], httpx.Response], timeout_s: float = 90) -> httpx.Response:
    """A call answered 503 while partitions move is retried (as a client does)."""
    deadline = time.monotonic() + timeout_s
    while True:
        response = call()
        if response.status_code != 503 or time.monotonic() > deadline:
            return response
        time.sleep(0.5)


def _legacy_records(store: LogStore) -> list[tuple[str, str | None, bytes]]:
    return [
        (e.kind, e.txn_id, e.data)
        for records in envelopes(store, "dc1.app").values()
        for _offset, e in records
        if e.kind.startswith("legacy")
    ]


def test_commit_request_at_another_gateway_writes_the_piece_once_even_with_its_holder_killed(
    start_kafka_gateway: Callable[..., GatewayProcess], kafka_store: LogStore
) -> None:
    """The second gateway fetches the staged piece from the first, writes it once, and the
    first keeps it as written: a repeat at either gateway is answered the same, another
    ``txn_id`` is refused.  With the holder SIGKILLed, ``/commit_request`` elsewhere answers
    503 (the piece is on the dead gateway's disk), also once its partitions have moved, and
    goes through when it is back.  The log holds each piece once, each with its marker."""
    a, b = start_kafka_gateway(), start_kafka_gateway()
    client = Client(a.url)
    assert client.write("src", [1]).status_code == 200  # the topic, split between the two
    client.close()
    wait_until(lambda: _owners(b.url) == {a.url, b.url}, 90, "both gateways own partitions")

    first_id = _store(a.url, b"first piece\n")
    first = _until_not_503(lambda: _post(b.url, "/commit_request", store_id=first_id))
    assert first.status_code == 200, first.text
    assert _post(a.url, "/commit_request", store_id=first_id).json() == first.json()
    assert _post(b.url, "/commit_request", store_id=first_id).json() == first.json()
    other = _post(b.url, "/commit_request", store_id=first_id, txn_id="other")
    assert other.status_code == 409 and other.json()["error"] == "store_id_written", other.text
    committed = _post(a.url, "/commit", txn_id=first.json()["txn_id"], log_type="app")
    assert committed.status_code == 200, committed.text
    unknown = _post(b.url, "/commit_request", store_id="0" * 32)
    assert unknown.status_code == 404 and unknown.json()["error"] == "unknown_store_id"

    second_id = _store(a.url, b"second piece\n")
    a.kill()
    down = _post(b.url, "/commit_request", store_id=second_id)
    assert down.status_code == 503, down.text
    assert "Retry-After" in down.headers
    wait_until(lambda: _owners(b.url) == {b.url}, 90, "the killed gateway's partitions moved")
    assert _post(b.url, "/commit_request", store_id=second_id).status_code == 503
    a.start()
    second = _until_not_503(lambda: _post(b.url, "/commit_request", store_id=second_id))
    assert second.status_code == 200, second.text
    committed = _until_not_503(
        lambda: _post(b.url, "/commit", txn_id=second.json()["txn_id"], log_type="app")
    )
    assert committed.status_code == 200, committed.text

    legacy: list[Any] = _legacy_records(kafka_store)
    data = sorted(d for kind, _txn, d in legacy if kind == "legacy_data")
    assert data == [b"first piece\n", b"second piece\n"], legacy
    markers = sorted(txn for kind, txn, _d in legacy if kind == "legacy_commit")
    assert markers == sorted([first_id, second_id]), legacy
