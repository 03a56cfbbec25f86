"""Readers of a topic deleted and made again on the embedded store: each read names the
topic's identity, so a reader at an offset of the old topic starts the new one from its start
instead of reading it from that offset (see tests/delivery/incarnations.py)."""

from __future__ import annotations

import json
import logging
import struct
from http.server import BaseHTTPRequestHandler
from typing import Any

import httpx
import pytest

from delivery.pull_client import PullClient
from tests.delivery import incarnations
from tests.scripted_http import LoopbackServer, running, send_json


@pytest.mark.parametrize("group", [None, "g1"])
def test_a_reader_goes_on_in_the_new_topic_from_its_start(
    start_gateway: Any,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    group: str | None,
) -> None:
    gateway = start_gateway(None, "--partitions", "1")
    incarnations.a_reader_goes_on_in_the_new_topic_from_its_start(
        gateway.url, monkeypatch, caplog, group
    )


def test_a_group_starts_a_topic_made_again_from_its_start(start_gateway: Any) -> None:
    gateway = start_gateway(None, "--partitions", "1")
    incarnations.a_group_starts_a_topic_made_again_from_its_start(gateway.url)


def test_a_pull_client_is_told_of_the_new_topic(start_gateway: Any) -> None:
    gateway = start_gateway(None, "--partitions", "1")
    incarnations.a_pull_client_is_told_of_the_new_topic(gateway.url)


@pytest.mark.parametrize("topic_id", [5, "", "a b", "x" * 65, None])
def test_a_topic_id_that_is_no_id_is_refused(start_gateway: Any, topic_id: object) -> None:
    """A position's ``topic_id`` is an id as answers name it: anything else is 400 and reads
    nothing (not taken as "no id", which would read at the offset whatever the topic is)."""
    gateway = start_gateway(None, "--partitions", "1")
    made = httpx.post(f"{gateway.url}/v1/topics", json={"name": "dc1.inc"}, timeout=30)
    assert made.status_code == 201, made.text
    position = {"topic": "dc1.inc", "partition": 0, "offset": 0, "topic_id": topic_id}
    fetched = httpx.post(f"{gateway.url}/v1/fetch", json={"partitions": [position]}, timeout=30)
    assert fetched.status_code == 400, fetched.text
    assert fetched.json()["error"] == "bad_request"
    assert "topic_id" in fetched.json()["reason"]
    if isinstance(topic_id, str):
        read = httpx.get(
            f"{gateway.url}/v1/topics/dc1.inc/partitions/0/messages",
            params={"offset": 0, "topic_id": topic_id},
            timeout=30,
        )
        assert read.status_code == 400, read.text
        assert read.json()["error"] == "bad_request"


class _OldGateway(BaseHTTPRequestHandler):
    """A gateway from before reads named topic identities: a position's ``topic_id`` is an
    unknown field (400, as its ``refuse_unknown`` said it), and its answers name no id."""

    server: LoopbackServer
    bodies: list[dict[str, Any]] = []

    def do_GET(self) -> None:
        send_json(self, 200, b'{"status": "ok"}')  # too old to name its installation

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        _OldGateway.bodies.append(body)
        if any("topic_id" in p for p in body["partitions"]):
            send_json(
                self,
                400,
                b'{"error": "bad_request", "reason": "unknown fields of a partition: '
                b'topic_id; known: offset, partition, topic"}',
            )
            return
        answer = [b"LBR1"]
        for p in body["partitions"]:
            meta = json.dumps(
                {
                    "topic": p["topic"],
                    "partition": p["partition"],
                    "start_offset": 0,
                    "end_offset": p["offset"],
                    "next_offset": p["offset"],
                    "not_envelopes": [],
                }
            ).encode()
            answer += [struct.pack(">H", len(meta)), meta, struct.pack(">I", 0)]
        data = b"".join(answer)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-logbroker-records")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        """Nothing on stderr for each request."""


def test_a_gateway_from_before_topic_identities_is_read_as_before(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A client that names topic ids reads a gateway that refuses them as it did before (the
    ids left out, said once), and takes its answers, which name none, as of an unknown id."""
    _OldGateway.bodies = []
    with running(LoopbackServer(_OldGateway)) as server:
        client = PullClient(server.url)
        try:
            with caplog.at_level(logging.WARNING, logger="delivery"):
                for _ in range(3):
                    (part,) = client.fetch([("dc1.inc", 0, 7)], topic_ids={"dc1.inc": "a" * 32})
                    assert part.topic_id is None and part.recreated is None
                    assert part.next_offset == 7
        finally:
            client.close()
    named = ["topic_id" in b["partitions"][0] for b in _OldGateway.bodies]
    assert named == [True, False, False, False], named  # refused once, then left out
    said = [r.getMessage() for r in caplog.records if "no topic identity" in r.getMessage()]
    assert len(said) == 1, said
