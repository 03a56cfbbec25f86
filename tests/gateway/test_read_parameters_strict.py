"""Read options are taken as written or refused: integers are plain decimal digits (``1_0``,
`` 1`` and ``+1`` are not 10 and 1), JSON integers are JSON integers, and a filter is never
dropped because ``raw`` was asked for."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from tests.conftest import GatewayProcess

MESSAGES = 12


@pytest.fixture(scope="module")
def filled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    """A gateway whose dc1.app holds offsets 0..11 in one partition: (url, partition)."""
    base: Path = tmp_path_factory.mktemp("strict-params")
    gateway = GatewayProcess(base / "data", [], base / "gateway.log").start()
    lines = [
        json.dumps({"log_type": "app", "source_id": "s", "seqno": n, "data": f"line {n}\n"})
        for n in range(1, MESSAGES + 1)
    ]
    response = httpx.post(
        gateway.url + "/v1/write",
        content="\n".join(lines).encode(),
        headers={"content-type": "application/x-ndjson"},
    )
    assert response.status_code == 200, response.text
    topic = httpx.get(gateway.url + "/v1/topics/dc1.app").json()
    [partition] = [p["partition"] for p in topic["partitions"] if p["end_offset"] == MESSAGES]
    yield gateway.url, partition
    gateway.kill()


def _messages_url(filled: tuple[str, int]) -> str:
    url, partition = filled
    return f"{url}/v1/topics/dc1.app/partitions/{partition}/messages"


def _refused(response: httpx.Response, error: str, says: str) -> None:
    assert response.status_code == 400, response.text
    body = response.json()
    assert body["error"] == error, body
    assert says in body["reason"], body


@pytest.mark.parametrize("offset", ["1_0", " 1", "+1", "1 ", "0x10", "1.5", "\u0661", "\uff11"])
def test_an_offset_that_is_not_plain_decimal_digits_is_refused(
    filled: tuple[str, int], offset: str
) -> None:
    response = httpx.get(f"{_messages_url(filled)}?offset={quote(offset)}")
    _refused(response, "bad_request", "offset must be an integer (decimal digits)")


def test_decimal_offsets_read_from_that_offset_and_a_negative_one_is_400(
    filled: tuple[str, int],
) -> None:
    answer = httpx.get(f"{_messages_url(filled)}?offset=10").json()
    assert [m["offset"] for m in answer["messages"]] == [10, 11]
    _refused(
        httpx.get(f"{_messages_url(filled)}?offset=-1"),
        "bad_request",
        "offset must be in 0..9223372036854775807, got -1",
    )
    assert httpx.get(f"{_messages_url(filled)}?offset={MESSAGES + 1}").status_code == 416


@pytest.mark.parametrize(
    ("option", "error"),
    [
        ("max_bytes=1_000", "bad_request"),
        ("wait_ms=%2B5", "bad_request"),
        ("txn_window_ms=%201000", "bad_request"),
        ("hash_mod=1_0&hash_rem=0", "bad_filter"),
        ("hash_mod=2&hash_rem=%2B1", "bad_filter"),
    ],
)
def test_every_integer_read_option_takes_only_decimal_digits(
    filled: tuple[str, int], option: str, error: str
) -> None:
    response = httpx.get(f"{_messages_url(filled)}?offset=0&{option}")
    _refused(response, error, "integer")


def test_the_audit_windows_since_takes_only_decimal_digits(filled: tuple[str, int]) -> None:
    url, _ = filled
    _refused(httpx.get(f"{url}/v1/audit/windows?since=1_0"), "bad_request", "since must be")
    assert httpx.get(f"{url}/v1/audit/windows?since=10").status_code == 200


def _fetch(filled: tuple[str, int], **body: Any) -> httpx.Response:
    url, partition = filled
    position = {"topic": "dc1.app", "partition": partition, "offset": 0}
    position.update(body.pop("position", {}))
    return httpx.post(url + "/v1/fetch", json={"partitions": [position], **body})


def test_fetch_integers_are_json_integers(filled: tuple[str, int]) -> None:
    for offset in ("5", True, 5.0, -1):
        _refused(_fetch(filled, position={"offset": offset}), "bad_request", "offset must be")
    _refused(_fetch(filled, wait_ms="0"), "bad_request", "wait_ms must be an integer")
    bad: tuple[object, ...] = ("1_0", " 4", "+4", True, 4.0)
    for hash_mod in bad:
        body = {"hash_mod": hash_mod, "hash_rem": 0}
        _refused(_fetch(filled, filter=body), "bad_filter", "hash_mod must be an integer")
    # digits in a string, as MessageFilter.to_params (the project's clients) sends them
    good: tuple[object, ...] = (4, "4", ["4"])
    for hash_mod in good:
        assert _fetch(filled, filter={"hash_mod": hash_mod, "hash_rem": 0}).status_code == 200


def test_a_subscription_filter_takes_only_integers_for_its_hash(filled: tuple[str, int]) -> None:
    url, _ = filled
    sub = {
        "name": "strict",
        "endpoint": "http://192.0.2.1/hook",
        "topics": ["dc1.app"],
        "filter": {"hash_mod": "1_0", "hash_rem": 0},
    }
    _refused(httpx.post(url + "/v1/subscriptions", json=sub), "bad_filter", "hash_mod")
    assert httpx.get(url + "/v1/subscriptions").json() == {"subscriptions": []}


@pytest.mark.parametrize(
    "query", ["server=nohost", "file=%2Fx", "source_id=x", "log_type=x", "hash_mod=2&hash_rem=1"]
)
def test_a_filter_with_raw_is_refused_not_dropped(filled: tuple[str, int], query: str) -> None:
    response = httpx.get(f"{_messages_url(filled)}?offset=0&raw=1&{query}")
    _refused(response, "bad_request", "a filter cannot be combined with raw")


def test_raw_alone_and_filters_alone_still_read(filled: tuple[str, int]) -> None:
    raw = httpx.get(f"{_messages_url(filled)}?offset=0&raw=1").json()
    assert len(raw["messages"]) == MESSAGES
    filtered = httpx.get(f"{_messages_url(filled)}?offset=0&raw=0&server=nohost").json()
    assert filtered["messages"] == []
    assert _fetch(filled, raw=True, filter={}).status_code == 200
    refused = _fetch(filled, raw=True, filter={"server": ["nohost"]})
    _refused(refused, "bad_request", "a filter cannot be combined with raw")
