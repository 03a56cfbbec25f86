"""``PATCH /v1/topics/{topic}``: an operator's retention change, taken back to unlimited."""

from __future__ import annotations

import subprocess
from typing import Any

import httpx

from delivery.internal_state import INTERNAL_TOPIC
from log_store import open_store
from tests.conftest import logbroker_cmd
from tests.gateway.conftest import Client


def _retention(data_dir: Any, topic: str) -> tuple[int | None, int | None]:
    with open_store(data_dir) as store:
        config = store.describe_topic(topic).config
    return config.retention_ms, config.retention_bytes


def test_a_topics_retention_is_set_and_taken_back_to_unlimited(shared_gateway: Any) -> None:
    writer = Client(shared_gateway.url)
    assert writer.acks("kept-src", [1], log_type="kept")[0]["status"] == "written"
    writer.close()
    http = httpx.Client(base_url=shared_gateway.url, timeout=30)
    url = "/v1/topics/dc1.kept"
    limited = http.patch(url, json={"retention_ms": 3_600_000, "retention_bytes": 5000})
    assert limited.status_code == 200, limited.text
    assert limited.json() | {"topic_id": ""} == {
        "name": "dc1.kept",
        "topic_id": "",
        "partitions": 4,
        "retention_ms": 3_600_000,
        "retention_bytes": 5000,
        "segment_bytes": limited.json()["segment_bytes"],
    }
    unlimited = http.patch(url, json={"retention_ms": None})
    assert unlimited.status_code == 200, unlimited.text
    assert (unlimited.json()["retention_ms"], unlimited.json()["retention_bytes"]) == (None, 5000)
    assert _retention(shared_gateway.data_dir, "dc1.kept") == (None, 5000)
    cli = subprocess.run(
        logbroker_cmd(
            "topics", "alter", "dc1.kept", "--server", shared_gateway.url,
            "--retention-bytes", "unlimited",
        ),
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert cli.returncode == 0, cli.stderr
    assert "retention_ms=None  retention_bytes=None" in cli.stdout
    assert _retention(shared_gateway.data_dir, "dc1.kept") == (None, None)
    # what a careless or hostile caller may send: refused, and nothing changes
    for body, status in (
        ({"retention_ms": -5}, 400),
        ({"retention_ms": "72h"}, 400),
        ({"retention_bytes": True}, 400),
        ({"partitions": 2}, 400),  # never shrinks
        ({"partitions": 0}, 400),
        ({"segment_bytes": 1}, 400),
        ({"retention_ms": 1, "partitions": 3}, 400),  # the shrink refuses the whole change
        ({"retention": None}, 400),
        ({}, 400),
    ):
        refused = http.patch(url, json=body)
        assert refused.status_code == status, (body, refused.text)
        assert set(refused.json()) >= {"error", "reason"}, body
    assert _retention(shared_gateway.data_dir, "dc1.kept") == (None, None)
    as_text = http.patch(
        url, content=b'{"retention_ms": 1}', headers={"content-type": "text/plain"}
    )
    assert as_text.status_code == 415
    assert http.patch("/v1/topics/dc1.nothing", json={"retention_ms": 1}).status_code == 404
    internal = http.patch(f"/v1/topics/{INTERNAL_TOPIC}", json={"retention_ms": 1})
    assert internal.status_code == 400 and "internal" in internal.json()["reason"]
    assert _retention(shared_gateway.data_dir, "dc1.kept") == (None, None)
    http.close()
