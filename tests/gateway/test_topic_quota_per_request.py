"""A request whose new topics would pass ``max_topics`` creates none of them: they are refused
429 before the first is created, so a refused request leaves nothing behind to count against
the limit (its retry, and other clients, are not refused for topics nobody kept).  The
request's sections of topics that exist are written all the same."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from ingest_api.framing import BINARY_MEDIA_TYPE, encode_binary
from log_store import open_store
from tests.conftest import GatewayProcess
from tests.gateway.conftest import end_offsets, meta

MAX_TOPICS = 6
CONFIG = f"""
partitions = 1

[limits]
max_topics = {MAX_TOPICS}
"""


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    base = tmp_path_factory.mktemp("topic-quota")
    config = base / "gateway.toml"
    config.write_text(CONFIG)
    started = GatewayProcess(base / "data", ["--config", str(config)], base / "gw.log").start()
    yield started
    started.kill()


def _topics(gateway: GatewayProcess) -> set[str]:
    store = open_store(gateway.data_dir)
    try:
        return {t.name for t in store.list_topics()}
    finally:
        store.close()


def _write(gateway: GatewayProcess, log_types: list[str], seqno: int = 1) -> httpx.Response:
    body = encode_binary([(meta("s", t), [(seqno, 0, b"x\n")]) for t in log_types])
    return httpx.post(
        gateway.url + "/v1/write",
        content=body,
        headers={"content-type": BINARY_MEDIA_TYPE},
        timeout=30,
    )


def _assert_max_topics(response: httpx.Response) -> None:
    assert response.status_code == 429, response.text
    assert (response.json()["limit"], response.json()["max"]) == ("max_topics", MAX_TOPICS)
    assert "none was created" in response.json()["reason"]


def test_a_request_over_max_topics_creates_none_of_its_topics(gateway: GatewayProcess) -> None:
    assert _write(gateway, ["kept"]).status_code == 200
    before = _topics(gateway)
    offsets = end_offsets(gateway.data_dir)
    room = MAX_TOPICS - len(before)
    assert room >= 2, before
    too_many = [f"t{i}" for i in range(room + 1)]
    _assert_max_topics(_write(gateway, too_many))
    # sessions (a batch of new sources) the same
    sessions = {"sessions": [meta("s", t) for t in too_many]}
    _assert_max_topics(httpx.post(gateway.url + "/v1/sessions", json=sessions, timeout=30))
    assert _topics(gateway) == before
    assert end_offsets(gateway.data_dir) == offsets
    # beside a section of a topic that exists, the new ones are refused alone (429 each,
    # none created) and the existing topic's section is written
    mixed = _write(gateway, [*too_many, "kept"], seqno=2)
    assert mixed.status_code == 200, mixed.text
    *refused, kept = mixed.json()["results"]
    for result in refused:
        assert (result["status"], result["limit"], result["max"]) == (429, "max_topics", MAX_TOPICS)
        assert "none was created" in result["reason"]
    assert kept["acks"] == [{"seqno": 2, "status": "written", "offset": 1}]
    assert _topics(gateway) == before
    assert end_offsets(gateway.data_dir) == {**offsets, ("dc1.kept", 0): 2}
    # the room is still there: a request of as many new topics as fit is written whole
    fitting = _write(gateway, too_many[:room])
    assert fitting.status_code == 200, fitting.text
    assert _topics(gateway) == before | {f"dc1.{t}" for t in too_many[:room]}
